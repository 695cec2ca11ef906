"""The confidence sequences' bounds against an independent, item-by-item implementation written from the papers'
formulas (not from core/confidence_sequences.py's vectorised code), at several points, and a few values pinned as
numbers; the detectable difference of a sequential comparison pinned to a number computed by hand; the direction of
a stored until-decided decision against a hand-worked case; a resumed run deciding each look on that look's items.

References: Waudby-Smith and Ramdas, "Estimating means of bounded random variables by betting", JRSSB 2024,
Theorem 2 and eq. (13)-(15) (the predictable plug-in empirical-Bernstein sequence); Waudby-Smith, Arnold, Wu, Chugg
and Ramdas, "Time-uniform central limit theory and asymptotic confidence sequences", Annals of Statistics 2024,
Theorem 2.2 (Robbins' normal mixture with the sample standard deviation); Cochran, "Sampling Techniques", 1977."""

from __future__ import annotations

import math

import numpy as np
import pytest

from acbench.core.confidence_sequences import accuracy_cs, mean_cs, sequential_decision


def eb_lower_reference(x: list[float], alpha: float, cap: float = 0.5) -> list[float]:
    """PrPl-EB's one-sided lower bound after each x_t in [0, 1], item by item: mu and sigma^2 plug-ins with one
    prior observation (1/2 and 1/4), lambda_t from the values known before x_t, psi_E(l) = (-log(1 - l) - l) / 4,
    v_t = 4 (x_t - mu_{t-1})^2."""
    out, s_lx, s_l, s_vpsi = [], 0.0, 0.0, 0.0
    mu_prev, sigma2_prev, s_x, s_dev = 0.5, 0.25, 0.0, 0.0
    for t, xt in enumerate(x, start=1):
        lam = min(math.sqrt(2 * math.log(1 / alpha) / (sigma2_prev * t * math.log(1 + t))), cap)
        s_l += lam
        s_lx += lam * xt
        s_vpsi += 4 * (xt - mu_prev) ** 2 * (-math.log(1 - lam) - lam) / 4
        out.append(s_lx / s_l - (math.log(1 / alpha) + s_vpsi) / s_l)
        s_x += xt
        mu = (0.5 + s_x) / (t + 1)
        s_dev += (xt - mu) ** 2
        mu_prev, sigma2_prev = mu, (0.25 + s_dev) / (t + 1)
    return out


def accuracy_reference(d: list[float], alpha: float = 0.05) -> tuple[list[float], list[float]]:
    x = [(v + 1) / 2 for v in d]
    lo = eb_lower_reference(x, alpha / 2)
    hi = [1 - v for v in eb_lower_reference([1 - v for v in x], alpha / 2)]
    out_lo, out_hi, best_lo, best_hi = [], [], 0.0, 1.0
    for a, b in zip(lo, hi):
        best_lo, best_hi = max(best_lo, min(max(a, 0.0), 1.0)), min(best_hi, min(max(b, 0.0), 1.0))
        out_lo.append(2 * best_lo - 1)
        out_hi.append(2 * best_hi - 1)
    return out_lo, out_hi


def mean_reference(d: list[float], budget: int, alpha: float = 0.05) -> tuple[list[float], list[float]]:
    """Robbins' two-sided normal mixture, rho^2 tuned at the budget, with the unbiased sample sd; not read before 8
    items nor before Cochran's 25 (|g1| + sqrt(6 / t))^2, g1 the sample skewness (scipy's, biased form)."""
    from scipy import stats

    rho2 = (-2 * math.log(alpha) + math.log(-2 * math.log(alpha) + 1)) / budget
    out_lo, out_hi, best_lo, best_hi = [], [], -math.inf, math.inf
    for t in range(1, len(d) + 1):
        seen = np.asarray(d[:t])
        sd = float(seen.std(ddof=1)) if t > 1 else 0.0
        g = abs(float(stats.skew(seen))) if sd > 0 else 0.0
        if t >= 8 and sd > 0 and t >= 25 * (g + math.sqrt(6 / t)) ** 2:
            half = sd * math.sqrt(2 * (t * rho2 + 1) / (t * t * rho2) * math.log(math.sqrt(t * rho2 + 1) / alpha))
            best_lo, best_hi = max(best_lo, seen.mean() - half), min(best_hi, seen.mean() + half)
        out_lo.append(best_lo)
        out_hi.append(best_hi)
    return out_lo, out_hi


def test_the_accuracy_sequence_is_the_papers_at_every_item():
    rng = np.random.default_rng(3)
    for plus, minus in ((0.2, 0.1), (0.1, 0.1), (0.05, 0.3)):
        u = rng.random(150)
        d = np.where(u < plus, 1.0, np.where(u < plus + minus, -1.0, 0.0))
        lo, hi = accuracy_cs(d)
        want_lo, want_hi = accuracy_reference(list(d))
        assert lo == pytest.approx(want_lo, abs=1e-12) and hi == pytest.approx(want_hi, abs=1e-12)


def test_the_nll_sequence_is_the_papers_at_every_item():
    rng = np.random.default_rng(4)
    for d, budget in ((0.05 + 0.1 * rng.standard_normal(120), 120), (0.1 * (rng.gamma(1.0, 1.0, 200) - 1), 400),
                      (-0.02 + 0.2 * rng.standard_t(5, 60), 60)):
        lo, hi = mean_cs(d, budget)
        want_lo, want_hi = mean_reference(list(d), budget)
        assert lo == pytest.approx(want_lo, rel=1e-10) and hi == pytest.approx(want_hi, rel=1e-10)


def test_a_few_bounds_pinned_as_numbers():
    """Values of the reference implementation above, written down: a change to either side shows here."""
    d = np.array([1, 0, 0, -1, 1, 1, 0, 1] * 25, dtype=float)  # 75 for, 25 against, 100 ties
    lo, hi = accuracy_cs(d)
    assert (lo[49], hi[49]) == pytest.approx((-0.015430, 0.775679), abs=1e-6)
    assert (lo[-1], hi[-1]) == pytest.approx((0.201432, 0.540841), abs=1e-6)
    ramp = 0.05 + 0.1 * np.sin(np.arange(1, 101))  # a known sequence of differences: mean 0.04987, sd 0.07126
    lo, hi = mean_cs(ramp, 100)
    assert np.isinf(lo[15]) and np.isfinite(lo[16])  # read from item 17, where Cochran's wait ends
    assert (lo[-1], hi[-1]) == pytest.approx((0.030073, 0.071501), abs=1e-6)


def test_the_detectable_difference_of_a_sequential_comparison_is_pinned():
    """sequential_compare's detectable difference: the sequence's half-width at n (its intersected bounds) plus
    z_0.8 sd / sqrt(n). For 40 windows whose differences alternate +0.05, -0.03 (mean 0.01): from the reference
    implementation, and the total pinned as a number."""
    from acbench.core.record import CellRecord, until_decided_digest
    from acbench.core.significance import compare

    diffs = [0.05 if i % 2 == 0 else -0.03 for i in range(40)]

    def cell(method, records):
        spec = {"reference": "pca", "looks": 20, "margin": 0.02, "budget": 40, "block": 2, "items": 40,
                "decision": None}
        spec["digest"] = until_decided_digest(records, spec)
        return CellRecord.from_json({
            "schema_version": 4, "cell": {"model": "m", "method": method, "rank": 0.5, "budget": "rank",
                                          "task": "ppl-token", "key": "k"},
            "metrics": {"nll": sum(r["nll"] for r in records) / len(records)}, "records": records, "env": {"x": 1}, "model_fingerprint": {"id": "m"},
            "compression": {"param_ratio": 0.5},
            "details": {"until_decided": spec}, "primary_metric": "nll", "stderr": {}, "higher_is_better": {}})

    ref = cell("pca", [{"window": i, "nll": 3.0} for i in range(40)])
    other = cell("svd", [{"window": i, "nll": 3.0 + diffs[i]} for i in range(40)])
    got = compare(ref, other)
    sd = float(np.std(diffs, ddof=1))
    lo, hi = mean_reference(diffs, 40)  # intersected over the looks: the half-width at 40 is the narrowest so far
    half = (hi[-1] - lo[-1]) / 2
    assert got["n"] == 40 and got["diff"] == pytest.approx(0.01)
    assert got["detectable"] == pytest.approx(half + 0.8416212335729143 * sd / math.sqrt(40), rel=1e-9)
    assert got["detectable"] == pytest.approx(0.024443, abs=1e-6)


def test_the_direction_of_a_decision_by_hand():
    """Per-window NLL, lower is better: a variant whose NLL is above the reference's by a clear margin is 'worse',
    never 'better'; for accuracy (higher is better) the same sign is 'better'."""
    assert sequential_decision(0.03, 0.09, 0.02, False) == "worse"  # NLL up: worse
    assert sequential_decision(-0.09, -0.03, 0.02, False) == "better"  # NLL down: better
    assert sequential_decision(0.03, 0.09, 0.02, True) == "better"  # accuracy up: better
    assert sequential_decision(-0.015, 0.019, 0.02, False) == "equivalent"
    assert sequential_decision(-0.02, 0.019, 0.02, False) is None  # touching the margin is not inside it
    assert sequential_decision(0.0, 0.05, 0.02, False) is None  # touching zero decides nothing
    assert sequential_decision(-0.05, 0.0, 0.02, False) is None  # from either side
    assert sequential_decision(-0.01, 0.02, 0.02, False) is None  # the upper bound on the margin: not inside
    assert sequential_decision(0.01, 0.05, None, None) == "higher"  # a metric with no better direction
    assert sequential_decision(-0.05, -0.01, None, None) == "lower"


class _Shifted:
    """40 windows whose NLL difference against the reference is known: +0.3 for the first 20 windows (they alone
    would decide 'worse'), then -0.3 (the whole 40 decide nothing)."""

    name, primary_metric, higher_is_better = "fake", "ppl", {"ppl": False}

    def __init__(self):
        from acbench.tasks.base import UntilDecided

        self.until_decided = UntilDecided("pca", looks=2, margin=None)
        self.scored = []

    def item_pool(self, tokenizer):
        return [(i, None) for i in range(40)]

    def score_items(self, model, tokenizer, items, progress=True):
        self.scored += [i for i, _ in items]
        return [{"window": i, "nll": 3.0 + (0.3 if i < 20 else -0.3) + 0.01 * (i % 3)} for i, _ in items]

    def item_identity(self, item):
        return {"window": item[0]}

    def result_of(self, records):
        from acbench.tasks.base import TaskResult

        return TaskResult(metrics={"ppl": len(records)}, stderr={}, details={}, records=records, config={})


def test_a_resumed_run_decides_each_look_on_that_looks_items_only(tmp_path):
    """Resumed with all 40 windows kept, the first look (20 windows, all +0.3 with a spread) decides 'worse' there,
    as a fresh run does; a look that read the kept items past it would see a mean near 0 and decide nothing."""
    import json

    from acbench.runner.until_decided import evaluate_until_decided
    from acbench.core.record import records_digest

    ref = [{"window": i, "nll": 3.0} for i in range(40)]
    fresh = evaluate_until_decided(_Shifted(), None, None, ref, progress=False)
    assert fresh.details["until_decided"]["decision"] == "worse" and fresh.details["until_decided"]["items"] == 20
    keep = tmp_path / "cell.json.partial"
    every = _Shifted().score_items(None, None, _Shifted().item_pool(None))
    keep.write_text(json.dumps({"cell": "cell.json", "task": "fake", "digest": records_digest(every),
                                "records": every}))
    task = _Shifted()
    again = evaluate_until_decided(task, None, None, ref, progress=False, keep=keep)
    assert task.scored == [] and again.records == fresh.records
    assert again.details["until_decided"] == fresh.details["until_decided"]


def test_each_way_an_until_decided_evaluation_ends_is_recorded_and_sealed():
    """The details a cell stores, for each way the evaluation ends: decided (its records cut at the deciding look,
    the reference records it was decided against sealed in), the budget spent against a reference, the whole budget
    for dense and the reference, the budget where no stored reference scored the same items."""
    from acbench.runner.until_decided import evaluate_until_decided
    from acbench.core.record import records_digest, until_decided_digest

    def details(reference):
        task = _Shifted()
        result = evaluate_until_decided(task, None, None, reference, progress=False)
        ud = result.details["until_decided"]
        assert ud["digest"] == until_decided_digest(result.records, ud)
        assert {k: ud[k] for k in ("reference", "looks", "margin", "budget", "block")} == \
            {"reference": "pca", "looks": 2, "margin": None, "budget": 40, "block": 20}
        assert ud["items"] == len(result.records) == len(task.scored)
        return ud, result.records

    ref = [{"window": i, "nll": 3.0} for i in range(40)]
    ud, records = details(ref)
    assert (ud["decision"], ud["stopped"], ud["items"]) == ("worse", "decided", 20) and len(ud["interval"]) == 2
    assert ud["interval"][0] > 0 and ud["reference_digest"] == records_digest(ref[:20])
    level = [{"window": i, "nll": 3.0 + (0.3 if i < 20 else -0.3) + 0.01 * (i % 3)} for i in range(40)]
    ud, records = details(level)  # the same scores as the variant's: never decided, the budget spent
    assert (ud["decision"], ud["stopped"], ud["items"]) == (None, "budget", 40)
    assert ud["reference_digest"] == records_digest(level)
    ud, _ = details(False)
    assert (ud["decision"], ud["interval"], ud["stopped"]) == (None, None, "whole budget (dense or the reference)")
    assert "reference_digest" not in ud
    for missing in (None, [{"window": i + 1, "nll": 3.0} for i in range(40)], ref[:10]):
        ud, _ = details(missing)
        assert (ud["decision"], ud["stopped"], ud["items"]) == (None, "budget (no stored reference on the same items)",
                                                              40)
        assert "reference_digest" not in ud


def test_the_nll_sequence_never_reads_a_spread_of_zero_and_refuses_what_it_cannot_read():
    """Constant differences (two models that differ by the same amount on every window) have no spread: the bounds
    stay infinite however many windows come, never a zero-width interval that would decide at once. An empty
    sequence, a NaN, or a budget below one item are refused; a budget of one item is a budget."""
    lo, hi = mean_cs(np.full(200, 0.05), 200)
    assert np.all(np.isinf(lo)) and np.all(np.isinf(hi))
    for bad, budget in (([], 10), ([0.1, math.nan], 10), ([0.1], 0)):
        with pytest.raises(ValueError) as e:
            mean_cs(bad, budget)
        assert str(e.value) == "mean_cs needs finite differences and an item budget of at least 1"
    assert np.isinf(mean_cs([0.1], 1)[0][0])
    with pytest.raises(ValueError) as e:
        accuracy_cs([0.5])
    assert str(e.value) == "accuracy_cs needs paired differences in {-1, 0, +1}"


def test_paired_cs_takes_the_sequence_of_its_kind():
    from acbench.core.confidence_sequences import paired_cs

    d = np.array([1.0, 0.0, -1.0, 1.0] * 10)
    assert [list(v) for v in paired_cs("accuracy", d, 40)] == [list(v) for v in accuracy_cs(d)]
    assert [list(v) for v in paired_cs("nll", d, 40)] == [list(v) for v in mean_cs(d, 40)]
    assert [list(v) for v in paired_cs("accuracy", d, 40, alpha=0.2)] == [list(v) for v in accuracy_cs(d, 0.2)]
    assert [list(v) for v in paired_cs("nll", d, 40, alpha=0.2)] == [list(v) for v in mean_cs(d, 40, 0.2)]
    assert not np.array_equal(paired_cs("nll", d, 40, alpha=0.2)[0], paired_cs("nll", d, 40)[0])
