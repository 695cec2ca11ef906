"""Paired comparisons between result cells on the same items, and whether a task is above chance.

Accuracy: McNemar's exact test (a binomial test on the discordant pairs) with the matching exact (Clopper-Pearson,
conditional on the discordant count) interval of the paired difference. Perplexity: per-window mean-NLL differences, a seeded bootstrap interval of their mean and a paired
t-test. A task counts towards recovery only where the dense model is significantly above chance.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from core.record import CellRecord

ALPHA = 0.05


def item_scores(cell: CellRecord) -> tuple[str, list] | None:
    """('accuracy', [0/1 per item]) or ('nll', [per window]) from a cell's per-item records, in stored order.
    Any task gets paired tests by storing "correct" or "nll" per item (older cells are upgraded on reading)."""
    recs = cell.records
    if not isinstance(recs, list) or not recs or not all(isinstance(r, dict) for r in recs):
        return None
    if all("correct" in r for r in recs):
        return "accuracy", [float(bool(r["correct"])) for r in recs]
    if all(isinstance(r.get("nll"), (int, float)) for r in recs):
        return "nll", [float(r["nll"]) for r in recs]
    return None


def item_keys(cell: CellRecord) -> list:
    """What identifies each item, to check that two cells scored the same items in the same order."""
    out = []
    for r in cell.records or []:
        out.append(tuple(str(r.get(k)) for k in ("id", "subject", "relation", "gold", "window") if k in r))
    return out


def mcnemar(ref: list[float], other: list[float]) -> dict:
    n = len(ref)
    b = sum(1 for x, y in zip(ref, other) if x and not y)  # reference right, other wrong
    c = sum(1 for x, y in zip(ref, other) if y and not x)
    diff = (c - b) / n
    if not b + c:
        return {"diff": 0.0, "ci95": [0.0, 0.0], "p": 1.0, "n": n, "discordant": [0, 0], "test": "McNemar exact"}
    test = stats.binomtest(c, b + c, 0.5)
    # Conditional on the discordant count, diff = (b + c) / n * (2 pi - 1) with pi = P(other right | discordant);
    # the Clopper-Pearson interval of pi gives an interval that agrees with the exact test.
    ci = test.proportion_ci(0.95, method="exact")
    scale = (b + c) / n
    return {"diff": diff, "ci95": [scale * (2 * ci.low - 1), scale * (2 * ci.high - 1)], "p": float(test.pvalue),
            "n": n, "discordant": [b, c], "test": "McNemar exact"}


def paired_mean(ref: list[float], other: list[float], n_boot: int = 10_000, seed: int = 0) -> dict:
    d = np.asarray(other, dtype=np.float64) - np.asarray(ref, dtype=np.float64)
    n = len(d)
    rng = np.random.default_rng(seed)
    boots = d[rng.integers(0, n, size=(n_boot, n))].mean(1)
    lo, hi = np.quantile(boots, [0.025, 0.975])
    if n < 2 or np.allclose(d, d[0]):
        p = 1.0 if np.allclose(d, 0) else 0.0
    else:
        p = float(stats.ttest_1samp(d, 0.0).pvalue)
    return {"diff": float(d.mean()), "ci95": [float(lo), float(hi)], "p": p, "n": n, "test": "paired t, bootstrap CI"}


def compare(ref_cell: CellRecord, cell: CellRecord) -> dict | None:
    """The paired difference cell - reference on their common items, or None when they cannot be paired."""
    a, b = item_scores(ref_cell), item_scores(cell)
    if not a or not b or a[0] != b[0] or len(a[1]) != len(b[1]) or item_keys(ref_cell) != item_keys(cell):
        return None
    return (mcnemar if a[0] == "accuracy" else paired_mean)(a[1], b[1])


def chance_levels(cell: CellRecord) -> list[float] | None:
    """Per item, the accuracy of guessing, as each record declares it ("chance"); None when any record lacks it."""
    recs = cell.records or []
    if recs and all(isinstance(r.get("chance"), (int, float)) and 0 <= r["chance"] <= 1 for r in recs):
        return [float(r["chance"]) for r in recs]
    return None


def above_chance(cell: CellRecord) -> dict | None:
    """One-sided test that the cell's per-item accuracy exceeds chance (exact binomial when chance is constant,
    normal approximation of the Poisson-binomial otherwise)."""
    scores, chance = item_scores(cell), chance_levels(cell)
    if not scores or scores[0] != "accuracy" or chance is None or len(chance) != len(scores[1]):
        return None
    k, n = int(sum(scores[1])), len(chance)
    expected = float(sum(chance))
    if len(set(chance)) == 1:
        p = float(stats.binomtest(k, n, chance[0], alternative="greater").pvalue)
    else:
        var = sum(c * (1 - c) for c in chance)
        p = float(stats.norm.sf((k - 0.5 - expected) / math.sqrt(var))) if var > 0 else float(k <= expected)
    return {"acc": k / n, "chance": expected / n, "p": p, "above": p < ALPHA, "n": n}


# two-sided 5 % and 80 % power: z_0.975 + z_0.8
Z_DETECT = 1.959963984540054 + 0.8416212335729143


def detectable_difference(ref_cell: CellRecord, cell: CellRecord) -> float | None:
    """The smallest true paired difference the comparison of `cell` with `ref_cell` had 80 % power to detect
    (two-sided, 5 %), from the measured spread of the paired differences and their count: for accuracy,
    z sqrt(((p10 + p01) - d^2) / n) with p10 and p01 the discordant shares (Connor 1987's form for McNemar's test);
    for per-window NLL, z sd(d) / sqrt(n). None where the cells cannot be paired."""
    a, b = item_scores(ref_cell), item_scores(cell)
    if not a or not b or a[0] != b[0] or len(a[1]) != len(b[1]) or item_keys(ref_cell) != item_keys(cell):
        return None
    x, y = np.asarray(a[1], dtype=np.float64), np.asarray(b[1], dtype=np.float64)
    n = len(x)
    if n < 2:
        return None
    d = y - x
    if a[0] == "accuracy":
        discordant = float(np.mean(d != 0))
        return Z_DETECT * math.sqrt(max(discordant - float(d.mean()) ** 2, 0.0) / n)
    return Z_DETECT * float(d.std(ddof=1)) / math.sqrt(n)
