"""Paired comparisons between result cells on the same items, and whether a task is above chance.

Accuracy: McNemar's exact test (a binomial test on the discordant pairs) with the matching exact (Clopper-Pearson,
conditional on the discordant count) interval of the paired difference. Perplexity: per-window mean-NLL differences, the paired t-test and its
t interval (so an interval excludes zero exactly when the test rejects it). A task counts towards recovery only where the dense model is significantly above chance.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from acbench.core.record import CellRecord, records_digest

ALPHA = 0.05


def item_scores(cell: CellRecord) -> tuple[str, list] | None:
    """('accuracy', [0/1 per item]) or ('nll', [per window]) from a cell's per-item records, in stored order.
    Any task gets paired tests by storing "correct" or "nll" per item (older cells are upgraded on reading)."""
    return record_scores(cell.records)


def record_scores(recs) -> tuple[str, list] | None:
    """item_scores of a list of records."""
    if not isinstance(recs, list) or not recs or not all(isinstance(r, dict) for r in recs):
        return None
    if all("correct" in r for r in recs):
        return "accuracy", [float(bool(r["correct"])) for r in recs]
    if all(isinstance(r.get("nll"), (int, float)) for r in recs):
        return "nll", [float(r["nll"]) for r in recs]
    return None


def item_keys(cell: CellRecord) -> list:
    """What identifies each item, to check that two cells scored the same items in the same order."""
    return record_keys(cell.records)


def record_keys(records) -> list:
    """item_keys of a list of records."""
    out = []
    for r in records or []:
        out.append(tuple(str(r.get(k)) for k in ("id", "subject", "relation", "gold", "window") if k in r))
    return out


def mcnemar(ref: list[float], other: list[float]) -> dict:
    n = len(ref)
    b = sum(1 for x, y in zip(ref, other) if x and not y)  # reference right, other wrong
    c = sum(1 for x, y in zip(ref, other) if y and not x)
    diff = (c - b) / n
    if not b + c:
        return {"diff": 0.0, "ci95": [0.0, 0.0], "ci90": [0.0, 0.0], "p": 1.0, "n": n, "discordant": [0, 0],
                "test": "McNemar exact"}
    test = stats.binomtest(c, b + c, 0.5)
    # Conditional on the discordant count, diff = (b + c) / n * (2 pi - 1) with pi = P(other right | discordant);
    # the Clopper-Pearson interval of pi gives an interval that agrees with the exact test.
    scale = (b + c) / n
    ci95, ci90 = (test.proportion_ci(level, method="exact") for level in (0.95, 1 - 2 * ALPHA))
    return {"diff": diff, "ci95": [scale * (2 * ci95.low - 1), scale * (2 * ci95.high - 1)],
            "ci90": [scale * (2 * ci90.low - 1), scale * (2 * ci90.high - 1)], "p": float(test.pvalue),
            "n": n, "discordant": [b, c], "test": "McNemar exact"}


def paired_mean(ref: list[float], other: list[float]) -> dict:
    """The paired t-test of the per-item differences (other - ref) and its own t intervals (95 %, and the 90 % the
    two one-sided tests read): an interval excludes zero exactly when the test rejects it (Student 1908). n = 1 or
    a constant difference: the interval is that difference, p 0 where it is not zero, 1 where it is."""
    d = np.asarray(other, dtype=np.float64) - np.asarray(ref, dtype=np.float64)
    n, mean = len(d), float(d.mean())
    if n < 2 or np.allclose(d, d[0]):
        p, se = (1.0 if np.allclose(d, 0) else 0.0), 0.0
    else:
        se = float(d.std(ddof=1)) / math.sqrt(n)
        p = float(2 * stats.t.sf(abs(mean) / se, n - 1))
    half95 = float(stats.t.ppf(0.975, n - 1)) * se if se else 0.0
    half90 = float(stats.t.ppf(1 - ALPHA, n - 1)) * se if se else 0.0
    return {"diff": mean, "ci95": [mean - half95, mean + half95], "ci90": [mean - half90, mean + half90], "p": p,
            "n": n, "test": "paired t"}


def until_decided(cell: CellRecord) -> dict | None:
    """The cell's `--until-decided` record (its reference, looks, budget, items and decision), or None."""
    spec = (cell.details or {}).get("until_decided") if isinstance(cell.details, dict) else None
    return spec if isinstance(spec, dict) and isinstance(spec.get("budget"), int) and spec["budget"] > 0 else None


def sequential_compare(ref_cell: CellRecord, cell: CellRecord) -> dict | None:
    """Two cells evaluated until decided, paired on the items both scored (a prefix of the same seeded order): the
    difference, and the confidence sequence at that count in place of a fixed-n interval (they were read after every
    block, so only a sequence is valid); its decision at the last look, the items used, and the difference it could
    detect: a sequence detects one beyond its half-width plus z_b standard errors. None: not pairable."""
    from acbench.core.confidence_sequences import paired_cs

    spec = until_decided(cell) or until_decided(ref_cell)
    a, b = item_scores(ref_cell), item_scores(cell)
    if spec is None or not a or not b or a[0] != b[0]:
        return None
    n = min(len(a[1]), len(b[1]))
    if n < 1 or item_keys(ref_cell)[:n] != item_keys(cell)[:n]:
        return None
    own = until_decided(cell) or {}
    if own.get("reference_digest") is not None and own["reference_digest"] != records_digest(ref_cell.records[:n]):
        return None  # the reference's records are not those this cell was decided against: no verdict from them
    d = np.asarray(b[1][:n], dtype=np.float64) - np.asarray(a[1][:n], dtype=np.float64)
    alpha = sequence_alpha(spec)
    if alpha is None:
        return None  # a level no run writes: the cell is not valid, and no verdict is read from it
    lo, hi = paired_cs(a[0], d, spec["budget"], alpha)
    sd = float(d.std(ddof=1)) if n > 1 else float("inf")
    half = (float(hi[-1]) - float(lo[-1])) / 2
    return {"diff": float(d.mean()), "ci95": [float(lo[-1]), float(hi[-1])], "ci90": [float(lo[-1]), float(hi[-1])],
            "p": None, "n": n, "budget": spec["budget"], "decision": spec.get("decision") if until_decided(cell)
            else None, "detectable": half + Z_POWER * sd / math.sqrt(n) if math.isfinite(half) else None,
            "test": "confidence sequence (anytime-valid)", "alpha": alpha}


def sequence_alpha(spec: dict) -> float | None:
    """The level an until-decided cell's sequences were read at (0.05 unless its run set one), or None where the
    cell holds one no run writes (outside (0, 0.5]: cell_problem refuses such a cell)."""
    from acbench.core.record import is_sequence_level

    alpha = spec.get("alpha", ALPHA)
    return float(alpha) if is_sequence_level(alpha) else None


def compare(ref_cell: CellRecord, cell: CellRecord) -> dict | None:
    """The paired difference cell - reference on their common items with the difference it could detect, or None
    when they cannot be paired. Cells evaluated until decided pair on the items both scored, with their confidence
    sequence (sequential_compare)."""
    if until_decided(cell) or until_decided(ref_cell):
        return sequential_compare(ref_cell, cell)
    pair = same_items(ref_cell, cell)
    if pair is None:
        return None
    kind, x, y = pair
    return {**(mcnemar if kind == "accuracy" else paired_mean)(x, y), "detectable": _detectable(kind, x, y)}


def same_items(ref_cell: CellRecord, cell: CellRecord) -> tuple[str, list, list] | None:
    """(kind, reference scores, scores) of two cells that scored the same items in the same order, else None."""
    a, b = item_scores(ref_cell), item_scores(cell)
    if not a or not b or a[0] != b[0] or len(a[1]) != len(b[1]) or item_keys(ref_cell) != item_keys(cell):
        return None
    return a[0], a[1], b[1]


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


POWER = 0.8
Z_ALPHA = float(stats.norm.ppf(1 - ALPHA / 2))  # two-sided
Z_POWER = float(stats.norm.ppf(POWER))
Z_DETECT = Z_ALPHA + Z_POWER


def detectable_accuracy(discordant: float, n: int) -> float:
    """The paired accuracy difference McNemar's test on n items detects with 80 % power (two-sided 5 %), where a
    share `discordant` of the pairs disagree: Connor (1987)'s sample size, n = (z_a sqrt(psi) + z_b sqrt(psi -
    delta^2))^2 / delta^2, solved for delta (the larger root of its quadratic in delta sqrt(n)), at most 1. A share
    below one pair is taken as one pair: with none observed, the spread is not known to be zero."""
    psi = min(max(discordant, 1.0 / n), 1.0)
    a, q = Z_ALPHA * math.sqrt(psi), 1.0 + Z_POWER ** 2 / n
    root = math.sqrt(max(Z_POWER ** 2 * psi * (1.0 + (Z_POWER ** 2 - Z_ALPHA ** 2) / n), 0.0))
    return min((a + root) / q / math.sqrt(n), 1.0)


def detectable_mean(sd: float, n: int) -> float:
    """The paired mean difference (per-window NLL) a two-sided 5 % test on n pairs of spread sd detects with 80 %
    power: (z_a + z_b) sd / sqrt(n), the normal approximation."""
    return Z_DETECT * sd / math.sqrt(n)


def detectable_difference(ref_cell: CellRecord, cell: CellRecord) -> float | None:
    """The smallest true paired difference the comparison of `cell` with `ref_cell` had 80 % power to detect
    (two-sided, 5 %), from the measured spread of the paired differences and their count: for accuracy from the
    discordant share (detectable_accuracy), for per-window NLL from sd(d) (detectable_mean). None where the cells
    cannot be paired or hold fewer than two items. What `compare` carries, by the one pairing it does."""
    d = compare(ref_cell, cell)
    return None if d is None else d["detectable"]


def _detectable(kind: str, ref: list, other: list) -> float | None:
    d = np.asarray(other, dtype=np.float64) - np.asarray(ref, dtype=np.float64)
    if len(d) < 2:
        return None
    if kind == "accuracy":
        return detectable_accuracy(float(np.mean(d != 0)), len(d))
    return detectable_mean(float(d.std(ddof=1)), len(d))


def verdict(d: dict, margin: float | None, higher: bool | None) -> str:
    """A paired comparison's decision, row against reference: 'equivalent' where two one-sided tests at ALPHA put
    the difference inside +-margin (the 90 % interval within it: Schuirmann 1987), else 'better' or 'worse' where
    the two-sided test rejects zero (the metric's direction says which), else 'undecided'. A metric with no better
    direction reads 'higher' or 'lower'."""
    lo90, hi90 = d.get("ci90") or d["ci95"]
    if d.get("p") is None:  # a confidence sequence: decided by its bounds, as the run stopped it
        from acbench.core.confidence_sequences import sequential_decision

        return sequential_decision(lo90, hi90, margin, higher) or "undecided"
    if margin is not None and margin > 0 and -margin < lo90 and hi90 < margin:
        return "equivalent"
    if d["p"] >= ALPHA:
        return "undecided"
    up = d["diff"] > 0
    if higher is None:
        return "higher" if up else "lower"
    return "better" if up == higher else "worse"


def _excludes_zero(kind: str, d: np.ndarray, budget: int, alpha: float) -> bool:
    from acbench.core.confidence_sequences import paired_cs

    lo, hi = paired_cs(kind, d, budget, alpha)
    return bool(lo[-1] > 0 or hi[-1] < 0)  # nan bounds (an NLL sequence not yet readable) exclude nothing


def anytime_p(kind: str, d, budget: int) -> float:
    """The anytime-valid p-value of paired differences `d` read as a confidence sequence: the least level at which
    the sequence after the last item excludes zero (1 where none below 1 does). Valid at a count chosen by the data
    (P(p_t <= a for some t) <= a, since a sequence at level a covers at every count at once), so Holm's correction
    may take it beside fixed-n p-values. Found by bisection on the log of the level (the sequences narrow as the
    level grows)."""
    d = np.asarray(d, dtype=np.float64)
    if d.size == 0 or not _excludes_zero(kind, d, budget, 0.999999):
        return 1.0
    lo, hi = math.log(1e-300), math.log(0.999999)
    if _excludes_zero(kind, d, budget, math.exp(lo)):
        return 1e-300
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if _excludes_zero(kind, d, budget, math.exp(mid)) else (mid, hi)
    return float(math.exp(hi))


def sequence_detectable(kind: str, d, budget: int, alpha: float, n: int | None = None) -> float | None:
    """The difference a confidence sequence at level `alpha` detects with 80 % power after `n` items (default: the
    budget): its half-width there plus z_b standard errors, the observed differences repeated to n items (their
    spread kept; what the items not scored would have shown is not known) in a seeded random order. None with
    fewer than two differences."""
    from acbench.core.confidence_sequences import paired_cs

    d = np.asarray(d, dtype=np.float64)
    if d.size < 2:
        return None
    n = budget if n is None else n
    # repeated to n and put in a seeded random order, as the task's seeded item order draws them: the width then
    # reflects the spread, not the order the differences were listed in
    longer = np.random.default_rng(0).permutation(np.resize(d, n))
    lo, hi = paired_cs(kind, longer, max(budget, n), alpha)
    half = max((float(hi[-1]) - float(lo[-1])) / 2, 0.0)
    return half + Z_POWER * float(d.std(ddof=1)) / math.sqrt(n) if math.isfinite(half) else None


def fixed_items_needed(kind: str, d, delta: float, alpha: float = ALPHA) -> int | None:
    """The items a fixed-n test (McNemar for accuracy, the paired t for NLL) needs to detect `delta` with 80 % power
    (two-sided, at level `alpha`: a family's share where the comparison is one of m), at the spread of the paired
    differences `d`: Connor (1987)'s n = (z_a sqrt(psi) + z_b sqrt(psi - delta^2))^2 / delta^2 from the discordant
    share psi; ((z_a + z_b) sd / delta)^2 for a mean. None without a spread (fewer than two differences) or
    delta <= 0."""
    d = np.asarray(d, dtype=np.float64)
    if d.size < 2 or not delta > 0:
        return None
    z_a = float(stats.norm.ppf(1 - alpha / 2))
    if kind == "accuracy":
        psi = min(max(float(np.mean(d != 0)), 1.0 / d.size), 1.0)
        return math.ceil((z_a * math.sqrt(psi) + Z_POWER * math.sqrt(max(psi - delta ** 2, 0.0))) ** 2
                         / delta ** 2)
    return math.ceil(((z_a + Z_POWER) * float(d.std(ddof=1)) / delta) ** 2)


def sequence_items_needed(kind: str, d, alpha: float, delta: float, cap: int = 200_000) -> int | None:
    """The least budget at which a confidence sequence at level `alpha`, tuned to that budget and read at its end,
    detects `delta` with 80 % power (sequence_detectable, the observed differences repeated), by bisection up to
    `cap` items; None where even `cap` does not or there is no spread."""
    def reaches(n: int) -> bool:
        got = sequence_detectable(kind, d, n, alpha)
        return got is not None and got <= delta

    if np.asarray(d).size < 2 or not reaches(cap):
        return None
    lo, hi = 1, cap
    while hi - lo > max(1, lo // 100):  # to 1 %: a count of items, not a constant
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if reaches(mid) else (mid, hi)
    return hi
