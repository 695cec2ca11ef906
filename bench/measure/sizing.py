"""`bench plan --detect`: how many items each comparison needs to detect a stated difference with 80 % power
(two-sided 5 %), from the paired spreads of stored cells of the same model, what that costs in evaluation time on
this machine, and what the task holds. The formulas are acbench.core.significance's, inverted for n (docs/decisions.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from acbench.core.significance import Z_ALPHA, Z_DETECT, Z_POWER, item_keys, item_scores

# what is assumed when no stored comparison gives a spread: a range, each said as assumed
ASSUMED = {"accuracy": (0.1, 0.2, 0.3), "nll": (0.02, 0.05, 0.1)}


def items_for_accuracy(discordant: float, delta: float) -> int | None:
    """Connor (1987): n = (z_a sqrt(psi) + z_b sqrt(psi - delta^2))^2 / delta^2, rounded up; None where the share
    of discordant pairs cannot hold the difference (|delta| <= psi is a difference's upper bound)."""
    if not 0 < delta <= discordant <= 1:
        return None
    return math.ceil((Z_ALPHA * math.sqrt(discordant) + Z_POWER * math.sqrt(discordant - delta ** 2)) ** 2
                     / delta ** 2)


def items_for_mean(sd: float, delta: float) -> int:
    """n = ((z_a + z_b) sd / delta)^2, rounded up (at least 2)."""
    return max(2, math.ceil((Z_DETECT * sd / delta) ** 2))


@dataclass(frozen=True)
class Spread:
    comparison: str  # "fasc-kfac vs pca (rank 0.5)" or "assumed"
    kind: str  # accuracy | nll
    value: float  # discordant share, or sd of the per-window differences
    n: int  # items it was measured on (0: assumed)
    seconds_per_item: float | None  # one variant's evaluation time per item, from the stored cell


def stored_spreads(folders, model: str, task: str, ref: str, skipped: list | None = None) -> list[Spread]:
    """Every stored (method, budget) cell of `model` on `task` paired with `ref`'s at the same budget, as the
    leaderboard pairs them: the same items in the same order or, where either was evaluated until decided, the
    items both scored (a prefix of one seeded order). `skipped`: a list each comparison left out is appended to,
    with why (no reference at its budget, other items, fewer than two), for the plan to say."""
    from acbench.core.record import DENSE, calibration_mode
    from acbench.core.significance import until_decided
    from acbench.leaderboard.load import read_result_set
    from acbench.leaderboard.tables import row_name

    skipped = [] if skipped is None else skipped
    cells = [c for c in read_result_set(*[f for f in folders if Path(f).is_dir()]).cells
             if c.cell.model == model and c.cell.task == task and not c.cell.is_analysis]

    def where(c):  # a row pairs with the reference of its own budget and calibration mode, as in its table
        return c.cell.budget, c.cell.rank, calibration_mode(c.calibration)

    refs = {where(c): c for c in cells if c.cell.method == ref}
    out = []
    for c in sorted(cells, key=lambda c: (c.cell.budget, -(c.cell.rank or 0), row_name(c))):
        if c.cell.method in (ref, DENSE):  # dense is no comparison of a budget
            continue
        r = refs.get(where(c))
        label = f"{row_name(c)} ({c.cell.budget} {c.cell.rank:g})"
        if r is None:
            skipped.append(f"{label}: no {ref} cell at its budget and calibration mode")
            continue
        a, b = item_scores(r), item_scores(c)
        prefix = bool(until_decided(c) or until_decided(r))
        n = min(len(a[1]), len(b[1])) if a and b and prefix else len(a[1]) if a else 0
        if not a or not b or a[0] != b[0] or (not prefix and len(a[1]) != len(b[1])) or \
                item_keys(r)[:n] != item_keys(c)[:n]:
            skipped.append(f"{label}: it and {ref} scored other items")
            continue
        if n < 2:
            skipped.append(f"{label}: fewer than 2 items paired with {ref}")
            continue
        d = np.asarray(b[1][:n]) - np.asarray(a[1][:n])
        value = float(np.mean(d != 0)) if a[0] == "accuracy" else float(d.std(ddof=1))
        evaluate = (c.timings or {}).get("evaluate_s")
        per = float(evaluate) / len(b[1]) if isinstance(evaluate, (int, float)) and evaluate > 0 else None
        out.append(Spread(f"{row_name(c)} vs {row_name(r)} ({c.cell.budget} {c.cell.rank:g})"
                          + (" until decided" if prefix else ""), a[0], value, n, per))
    return out


def needed(spread: Spread, delta: float) -> int | None:
    return items_for_accuracy(spread.value, delta) if spread.kind == "accuracy" else items_for_mean(spread.value,
                                                                                                     delta)


def render_detect(rows: list[tuple[str, float, list[Spread], tuple[int | None, str], bool]]) -> str:
    """rows: (task, difference, spreads, (items the task holds, their description), whether the spreads are
    assumed). A count past what the task holds is marked: that difference cannot be decided on this task."""
    from tabulate import tabulate

    body = []
    for task, delta, spreads, (count, holds), assumed in rows:
        for s in spreads:
            n = needed(s, delta)
            items = ("not reachable: |Δ| cannot exceed the discordant share" if n is None else
                     f"{n:,}" + (" (more than the task holds)" if count is not None and n > count else ""))
            spread = f"{100 * s.value:.0f} % pairs discordant" if s.kind == "accuracy" else f"sd {s.value:.3f} nats"
            cost = "" if n is None or s.seconds_per_item is None else f"{n * s.seconds_per_item:,.0f} s"
            body.append([task, f"{delta:g}", "assumed" if assumed else s.comparison,
                         spread + ("" if assumed else f" (n={s.n})"),
                         items, holds, cost])
    return tabulate(body, headers=["task", "detect Δ", "comparison", "paired spread", "items for 80 % power",
                                   "the task holds", "evaluation per variant"], tablefmt="github",
                    disable_numparse=True)
