"""`bench smoke`'s verdict over the cells it planned: a pure function of what they store, so it can be tested and
mutation-scored without the smoke model's training."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class SmokeVerdict:
    lines: tuple[str, ...]  # what `bench smoke` prints, in order
    failed: bool


def broken_threshold(dense_ppl: float, vocab: int) -> float:
    """The perplexity a variant must stay below: halfway, in log terms, from the dense model's to a uniform guess
    over the vocabulary's. A right method at the smoke budgets loses far less; a wrong formula more."""
    return math.exp((math.log(dense_ppl) + math.log(vocab)) / 2)


def _finite_metrics(cell: dict) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
               for v in cell["metrics"].values())


def _order(key: tuple) -> tuple:
    # a variant with an allocation beside one without: None and a name do not compare
    method, allocation, budget, ratio = key
    return method, str(allocation or ""), str(budget), ratio if isinstance(ratio, (int, float)) else -1.0


def smoke_verdict(cells: list[dict], expected: int, vocab: int, control: Callable[[str], bool]) -> SmokeVerdict:
    """`cells`: the planned cells found on disk (each with "cell" and "metrics"); `expected`: how many were
    planned; `vocab`: the model's vocabulary size; `control(method)`: whether a method is a control, expected to
    lose the model. Fails when a cell is missing, a metric is not finite, dense has no perplexity, or a method that
    is not a control ends above the broken threshold."""
    bad = [c["cell"] for c in cells if not _finite_metrics(c)]
    ppl = {(c["cell"]["method"], c["cell"].get("allocation"), c["cell"].get("budget"), c["cell"].get("rank")):
           c["metrics"].get("ppl") for c in cells if c["cell"]["task"] == "ppl-token"}
    dense = next((v for (m, *_), v in ppl.items() if m == "dense"), None)
    lines, broken = [], []
    if dense and not bad:
        limit = broken_threshold(dense, vocab)
        lines.append(f"perplexity (ppl-token): dense {dense:.0f}; a variant above {limit:.0f} is broken")
        for (m, _, budget, ratio), v in sorted(((k, v) for k, v in ppl.items() if k[0] != "dense"),
                                               key=lambda kv: _order(kv[0])):
            verdict = "BROKEN" if v is None or v > limit else "ok"
            if control(m):
                verdict = "control"  # expected to lose the model: the floor the others beat
            label = budget if ":" in str(budget) else f"{budget} {ratio:g}"  # 2:4 names its density itself
            shown = "no perplexity" if v is None else f"{v:.0f} ({v / dense:.2f}x dense)"
            lines.append(f"  {verdict:7s} {m} @ {label}: {shown}")
            if verdict == "BROKEN":
                broken.append(m)
    failed = bool(bad) or len(cells) != expected or bool(broken) or not dense
    if failed:
        lines.append(f"smoke FAILED: {len(cells)} cells (expected {expected}), non-finite metrics in {bad}, "
                     f"perplexity of a broken model: {sorted(set(broken))}")
    return SmokeVerdict(tuple(lines), failed)
