"""Verdicts across models: a method's paired differences to a reference pooled over models, and methods ranked
over (model, task) scenarios.

- Each model's own verdict first, and in how many models the difference is significant with Holm's (1979)
  step-down correction across the models. The common-effect (fixed, inverse-variance) estimate: the one
  difference every model would share if they shared one, labelled as such. Random effects need the between-model
  variance estimated, which two models cannot do (one degree of freedom for tau^2 and for the Hartung-Knapp t), so
  they are given from RANDOM_EFFECTS_MIN_K models on (Cochrane Handbook, ch. 10.10.4; IntHout et al. 2014).
- Pooled difference (random effects): DerSimonian and Laird's estimate of the per-model paired differences, each
  weighted by 1 / (its variance + tau^2), where tau^2 is the between-model variance estimated from Cochran's Q; its
  95 % interval is normal. I^2 is the share of Q beyond what the within-model variances explain. With few models
  the Hartung-Knapp interval (t with k - 1 degrees of freedom, the effects' own weighted spread) is also given.
- Accuracy, over the items of every model at once: McNemar's exact test on the pooled discordant pairs. Each item
  pair is its own stratum, so this is the Cochran-Mantel-Haenszel test stratified by model (and by item).
- Win rate (HELM): per scenario, the share of the other methods a method beats (a tie counts a half), averaged
  over scenarios. Mean rank (1 = best, ties share the mean of their ranks), Friedman's test of equal ranks (with the
  tie correction) and Nemenyi's critical difference (Demsar, JMLR 2006): two methods whose mean ranks differ by
  less than it are not told apart at the 5 % level.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from acbench.core.significance import ALPHA, mcnemar

Z95 = float(stats.norm.ppf(0.975))
RANDOM_EFFECTS_MIN_K = 3  # fewer models give no estimate of the between-model variance worth reading


def holm(pvalues: list[float]) -> list[float]:
    """Holm (1979)'s step-down adjusted p-values, in the order given: the i-th smallest p times (m - i + 1), made
    non-decreasing, capped at 1. A hypothesis is rejected at ALPHA exactly when its adjusted p is below it."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    out, running = [1.0] * len(pvalues), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * float(pvalues[i])))
        out[i] = running
    return out


def common_effect(effects: list[float], variances: list[float]) -> dict:
    """The common-effect (fixed, inverse-variance) pooled estimate: {estimate, se, ci95, p, k}. It assumes every
    model shares one true difference; with two models that cannot be checked, so it is reported under this name."""
    y, v = np.asarray(effects, dtype=np.float64), np.asarray(variances, dtype=np.float64)
    if len(y) == 0 or len(y) != len(v) or not (np.all(np.isfinite(y)) and np.all(np.isfinite(v)) and np.all(v > 0)):
        raise ValueError("common_effect needs one finite positive variance per finite effect, and at least one")
    w = 1.0 / v
    est = float(np.sum(w * y) / np.sum(w))
    se = float(math.sqrt(1.0 / np.sum(w)))
    return {"estimate": est, "se": se, "ci95": [est - Z95 * se, est + Z95 * se],
            "p": float(2 * stats.norm.sf(abs(est) / se)), "k": len(y)}


def paired_effect(ref: list[float], other: list[float]) -> tuple[float, float]:
    """(mean of other - ref over the items, its variance: the items' sample variance / n). A difference that does
    not vary (every item pair alike) is given the variance it would have with one item a unit away from the rest,
    1 / n^2, so that it carries a large but finite weight instead of all of it."""
    d = np.asarray(other, dtype=np.float64) - np.asarray(ref, dtype=np.float64)
    n = len(d)
    if n < 2:
        raise ValueError(f"a paired difference needs at least 2 items, got {n}")
    var = float(d.var(ddof=1)) / n
    if var == 0.0:
        var = 1.0 / (n * n)
    return float(d.mean()), var


def dersimonian_laird(effects: list[float], variances: list[float]) -> dict:
    """Random-effects pooled estimate: {estimate, se, ci95, p, tau2, i2, q, df, k, weights}."""
    y = np.asarray(effects, dtype=np.float64)
    v = np.asarray(variances, dtype=np.float64)
    if len(y) == 0 or len(y) != len(v):
        raise ValueError("dersimonian_laird needs one variance per effect, and at least one effect")
    if not (np.all(np.isfinite(y)) and np.all(np.isfinite(v)) and np.all(v > 0)):
        raise ValueError("dersimonian_laird needs finite effects and finite positive variances")
    w = 1.0 / v
    fixed = float(np.sum(w * y) / np.sum(w))
    q = float(np.sum(w * (y - fixed) ** 2))
    df = len(y) - 1
    c = float(np.sum(w) - np.sum(w * w) / np.sum(w))
    tau2 = max(0.0, (q - df) / c) if df > 0 and c > 0 else 0.0
    ws = 1.0 / (v + tau2)
    est = float(np.sum(ws * y) / np.sum(ws))
    se = float(math.sqrt(1.0 / np.sum(ws)))
    p = float(2 * stats.norm.sf(abs(est) / se))
    i2 = max(0.0, (q - df) / q) if q > 0 else 0.0
    return {"estimate": est, "se": se, "ci95": [est - Z95 * se, est + Z95 * se], "p": p, "tau2": tau2, "i2": i2,
            "q": q, "df": df, "k": len(y), "weights": (ws / ws.sum()).tolist(),
            "hartung_knapp": hartung_knapp(y, v, tau2) if df > 0 else None}


def hartung_knapp(y: np.ndarray, v: np.ndarray, tau2: float) -> dict:
    """The Hartung-Knapp(-Sidik-Jonkman) interval around the random-effects estimate: the weighted spread of the
    effects about it as its variance, t with k - 1 degrees of freedom; the interval the Cochrane Handbook prefers to
    DerSimonian-Laird's normal one when there are few studies (here, models). The spread's scale is kept at 1 or
    more (the ad hoc variant, Knapp and Hartung 2003; Roever et al. 2015): two models with nearly equal effects
    would otherwise give an interval narrower than DerSimonian-Laird's own. {se, ci95, p, df, scale}."""
    ws = 1.0 / (v + tau2)
    est = float(np.sum(ws * y) / np.sum(ws))
    df = len(y) - 1
    scale = float(np.sum(ws * (y - est) ** 2)) / df
    se = math.sqrt(max(1.0, scale) / float(np.sum(ws)))
    t = float(stats.t.ppf(1 - ALPHA / 2, df))
    return {"se": se, "ci95": [est - t * se, est + t * se], "p": float(2 * stats.t.sf(abs(est) / se, df)), "df": df,
            "scale": scale}


def stratified_mcnemar(pairs: list[tuple[list[float], list[float]]]) -> dict:
    """McNemar's exact test over the items of every stratum (model) at once: (reference, other) 0/1 lists per
    stratum. With each item pair its own stratum, Mantel-Haenszel's statistic is McNemar's on the pooled discordant
    pairs; the difference is per item over all strata."""
    ref = [x for r, _ in pairs for x in r]
    other = [x for _, o in pairs for x in o]
    if not ref or any(len(r) != len(o) for r, o in pairs):
        raise ValueError("stratified_mcnemar needs equal-length, non-empty item lists per stratum")
    out = mcnemar(ref, other)
    out["strata"] = len(pairs)
    out["test"] = "McNemar exact, stratified by model"
    return out


def scenario_ranks(values: dict[str, float], higher: bool) -> dict[str, float]:
    """Ranks of the methods in one scenario, 1 = best; tied methods share the mean of their ranks."""
    names = sorted(values)
    keyed = [-values[m] if higher else values[m] for m in names]
    return dict(zip(names, (float(r) for r in stats.rankdata(keyed, method="average"))))


def win_rates(scenarios: list[tuple[dict[str, float], bool]]) -> dict[str, float]:
    """HELM's mean win rate: per scenario ({method: value}, higher is better), the share of the other methods each
    method beats, a tie a half; averaged over the scenarios the method is in with at least one other."""
    shares: dict[str, list[float]] = {}
    for values, higher in scenarios:
        if len(values) < 2:
            continue
        for m, v in values.items():
            beats = sum(1.0 if (v > o if higher else v < o) else 0.5 if v == o else 0.0
                        for n, o in values.items() if n != m)
            shares.setdefault(m, []).append(beats / (len(values) - 1))
    return {m: sum(s) / len(s) for m, s in shares.items()}


def friedman(rank_rows: list[dict[str, float]]) -> dict:
    """Friedman's chi-square over blocks of within-block ranks (every block ranks the same k >= 3 methods), with the
    correction for ties; {statistic, df, p, n, k, mean_ranks}."""
    if not rank_rows:
        raise ValueError("friedman needs at least one block")
    names = sorted(rank_rows[0])
    if any(sorted(r) != names for r in rank_rows):
        raise ValueError("friedman needs every block to rank the same methods")
    k, n = len(names), len(rank_rows)
    if k < 3:
        raise ValueError(f"friedman needs at least 3 methods, got {k}")
    r = np.array([[row[m] for m in names] for row in rank_rows], dtype=np.float64)
    sums = r.sum(0)
    ties = 0.0
    for row in r:
        _, counts = np.unique(row, return_counts=True)
        ties += float(np.sum(counts ** 3 - counts))
    correction = 1.0 - ties / (n * k * (k * k - 1))
    chi2 = (12.0 / (n * k * (k + 1)) * float(np.sum(sums ** 2)) - 3.0 * n * (k + 1))
    chi2 = chi2 / correction if correction > 0 else 0.0  # every block one tie: no ordering to test
    return {"statistic": chi2, "df": k - 1, "p": float(stats.chi2.sf(chi2, k - 1)), "n": n, "k": k,
            "mean_ranks": dict(zip(names, (float(x) for x in sums / n)))}


def nemenyi_cd(k: int, n: int, alpha: float = ALPHA) -> float:
    """Nemenyi's critical difference of mean ranks for k methods over n blocks: q_alpha * sqrt(k (k + 1) / (6 n)),
    q_alpha the studentized range's upper quantile (infinite degrees of freedom) over sqrt(2)."""
    if k < 2 or n < 1:
        raise ValueError(f"nemenyi_cd needs k >= 2 methods and n >= 1 blocks, got k={k}, n={n}")
    q = float(stats.studentized_range.ppf(1 - alpha, k, np.inf)) / math.sqrt(2)
    return q * math.sqrt(k * (k + 1) / (6.0 * n))


def cliques(mean_ranks: dict[str, float], cd: float) -> list[list[str]]:
    """The maximal runs of methods (sorted by mean rank) whose extreme mean ranks differ by less than cd: the bars
    of a critical-difference diagram. Runs of one method are left out."""
    order = sorted(mean_ranks, key=lambda m: (mean_ranks[m], m))
    runs = []
    for i in range(len(order)):
        j = i
        while j + 1 < len(order) and mean_ranks[order[j + 1]] - mean_ranks[order[i]] < cd:
            j += 1
        if j > i and not (runs and runs[-1][-1] == order[j]):  # a run inside the previous one is not maximal
            runs.append(order[i:j + 1])
    return runs
