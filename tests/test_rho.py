"""rho: the Gram-trick estimator, its behaviour under independence and dependence, and its correlations."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from acbench.analyses.dependence import correlations, rho_directional, rho_explicit, rho_scores


def pairs(N, d, seed, coupled=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, d, generator=g, dtype=torch.float64) @ torch.randn(d, d, generator=g, dtype=torch.float64)
    grad = torch.randn(N, d, generator=g, dtype=torch.float64)
    if coupled:  # g = (a.x) b + noise
        a, b = torch.randn(d, generator=g, dtype=torch.float64), torch.randn(d, generator=g, dtype=torch.float64)
        s = x @ a
        grad = s[:, None] * b[None, :] + 0.1 * s.std() * grad
    return x, grad


def test_gram_trick_equals_explicit_kron():
    for seed in range(3):
        x, g = pairs(40, 4, seed, coupled=seed == 1)
        fast = rho_scores(x, g, debias=False)
        ref = rho_explicit(x, g)
        assert fast["rho"] == pytest.approx(ref["rho"], rel=1e-9)
        assert fast["rho_cos"] == pytest.approx(ref["rho_cos"], rel=1e-9, abs=1e-12)


def test_independent_rho_small_and_shrinking_with_samples():
    means = []
    for N in (200, 800, 3200):
        vals = [rho_scores(*pairs(N, 8, seed))["rho"] for seed in range(4)]
        means.append(np.mean(vals))
        assert max(vals) < 3.0 / np.sqrt(N) ** 0.5  # a bound that shrinks with N
    assert means[2] < means[0]


def test_independent_rho_near_zero_at_llm_width():
    # the plug-in estimate is swamped by its n = m term at d = 640; the U-statistic is not
    x, g = pairs(512, 640, 0)
    assert rho_scores(x, g)["rho"] < 0.05
    assert rho_scores(x, g, debias=False)["rho"] > 0.9


def test_dependent_rho_far_from_zero():
    x, g = pairs(2000, 8, 1, coupled=True)
    dep = rho_scores(x, g)
    ind = rho_scores(*pairs(2000, 8, 1))
    assert dep["rho"] > 0.3 and dep["rho"] > 5 * ind["rho"]
    assert dep["rho_cos"] > 10 * max(ind["rho_cos"], 1e-4)


@pytest.mark.parametrize("coupled", [False, True])
def test_rho_cos_in_unit_interval(coupled):
    for seed in range(5):
        for debias in (True, False):
            r = rho_scores(*pairs(100, 6, seed, coupled), debias=debias)
            assert 0.0 <= r["rho_cos"] <= 1.0


def test_rho_dir_zero_when_independent_positive_when_coupled():
    U = torch.linalg.qr(torch.randn(8, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64))[0]
    ind = rho_directional(*pairs(20000, 8, 2), U)
    dep = rho_directional(*pairs(20000, 8, 2, coupled=True), U)
    assert rho_scores(*pairs(300, 8, 2), discard=U)["rho_dir"] == pytest.approx(rho_directional(*pairs(300, 8, 2), U))
    assert abs(ind) < 0.02 and dep > 0.1  # jointly Gaussian: E[s^2 t^2] / (E s^2 E t^2) - 1 = 2 corr(s, t)^2


def test_correlations_equal_scipy():
    x = [0.1, 0.4, 0.35, 0.8, 0.7, 0.2, 0.9, 0.5, 0.05, 0.6]  # above 8 points: scipy's p
    y = [1.0, 2.1, 1.9, 3.5, 3.9, 1.1, 4.2, 1.5, 0.9, 3.0]
    c = correlations(x, y, n_boot=200, seed=0)
    s, p = stats.spearmanr(x, y), stats.pearsonr(x, y)
    assert c["spearman"]["r"] == pytest.approx(s[0]) and c["spearman"]["p"] == pytest.approx(s[1])
    assert c["pearson"]["r"] == pytest.approx(p[0]) and c["pearson"]["p"] == pytest.approx(p[1])
    lo, hi = c["spearman"]["ci95"]
    assert -1 <= lo <= c["spearman"]["r"] <= hi <= 1
    assert correlations([1, 2], [3, 4])["spearman"] is None


def _tiny_context(**spec_kw):
    """The harness's AnalysisContext over the smoke model's calibration statistics."""
    from acbench.calibration.engine import CalibSpec, calibrate
    from acbench.model.groups import find_input_groups
    from acbench.model.sources import open_and_load_model
    from acbench.cli.smoke import tiny_checkpoint
    from acbench.runner.config import RunConfig
    from acbench.runner.resolve import resolve_run
    from acbench.runner.worker import AnalysisContext
    from acbench.tasks.data.text_data import sample_text_windows, load_text

    lm = open_and_load_model(str(tiny_checkpoint()), progress=False)
    config = RunConfig(task_options={"ppl-token": {"seq_len": 32}, "lama": {"max_candidates": 5}}, progress=False,
                       bos="none", tasks=["ppl-token", "lama"], **spec_kw)
    run = resolve_run(config)
    windows = sample_text_windows(lm.tokenizer, load_text("wiki", "calib"), 4, 32, 0)
    groups = find_input_groups(lm.model)
    st = calibrate(lm.model, groups, windows, frozenset({"C", "F", "pairs"}), CalibSpec(pair_tokens=32),
                   progress=False)
    return AnalysisContext(lm.model, lm.tokenizer, st, groups, 0, False, run)


def test_sensitivity_at_full_rank_is_zero():
    from acbench.analyses.rho import RhoSettings, _units, sensitivity
    from acbench.core.stats import RankSpec

    ctx = _tiny_context()
    rows, dense = sensitivity(ctx, RankSpec(1.0), RhoSettings(lama_limit=1, loss_windows=1), _units(2, 2))
    assert len(rows) == 4
    for r in rows:
        assert abs(r["loss_rise"]) < 1e-5 and r["lama_drop"] == 0


def test_rho_per_group_headline_on_tiny_model():
    """rho.per_group=true: every group's loss rise alone, correlated with rho over all groups (the headline)."""
    from acbench import analyses
    from acbench.core.record import CellId, CellRecord
    from acbench.core.stats import RankSpec
    from acbench.analyses.rho_report import rho_section as _rho_section

    ctx = _tiny_context()
    rho = analyses.build(["rho"], {"rho": {"lama_limit": 0, "loss_windows": 1, "units": 2, "per_group": True}})["rho"]
    res = rho.run(ctx, RankSpec(0.5))
    per_group = res.details["per_group"]
    assert len(per_group) == len(ctx.groups) == 8
    assert all(abs(r["loss_rise_pca_alone"]) < 50 for r in per_group)
    c = res.details["correlations"]["rho_vs_loss_rise_per_group"]
    assert c["n"] == 8
    cell = CellRecord(cell=CellId("m", "rho-analysis", 0.5, "rank", "rho", "k"), metrics=res.metrics,
                      primary_metric="rho_mean", details=res.details)
    text = "\n".join(_rho_section(cell))
    assert text.startswith("**Per group, n = 8: Spearman(rho, surrogate_gain)") or "n = 8" in text.split("\n")[0]


@pytest.mark.parametrize("coupled", [False, True])
def test_debiased_rho_equals_brute_force_u_statistics(coupled):
    """The default (debiased) rho by loops over distinct tokens: ||M||^2 over pairs n != m of
    (x_n.x_m)^2 (g_n.g_m)^2; <M, C (x) F> over triples of distinct n, m, l of (x_n.x_m)^2 (g_n.g_l)^2; ||C||^2 ||F||^2
    as the product of the pair U-statistics of (x_n.x_m)^2 and (g_n.g_m)^2."""
    import itertools
    import math

    X, G = pairs(11, 3, 4, coupled)
    N = X.shape[0]
    kx = [[float(X[i] @ X[j]) ** 2 for j in range(N)] for i in range(N)]
    kg = [[float(G[i] @ G[j]) ** 2 for j in range(N)] for i in range(N)]
    two = list(itertools.permutations(range(N), 2))
    m_sq = sum(kx[i][j] * kg[i][j] for i, j in two) / len(two)
    three = list(itertools.permutations(range(N), 3))
    inner = sum(kx[n][m] * kg[n][l] for n, m, l in three) / len(three)
    cf_sq = sum(kx[i][j] for i, j in two) / len(two) * sum(kg[i][j] for i, j in two) / len(two)
    got = rho_scores(X, G)
    assert got["debiased"] is True
    assert got["rho"] == pytest.approx(math.sqrt(max(m_sq - 2 * inner + cf_sq, 0.0)) / math.sqrt(m_sq), rel=1e-9)
    assert got["rho_cos"] == pytest.approx(min(1.0, max(0.0, 1 - inner / math.sqrt(m_sq * cf_sq))), rel=1e-9, abs=1e-12)


def test_rho_directional_equals_its_formula_by_loops():
    """Mean over unit directions u of E[(g.u)^2 (u.x)^2] / (E[(g.u)^2] E[(u.x)^2]) - 1, with un-normalised
    directions given (the function normalises them)."""
    X, G = pairs(40, 5, 9, coupled=True)
    U = torch.randn(5, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64) * 3
    vals = []
    for j in range(U.shape[1]):
        u = U[:, j] / U[:, j].norm()
        s, t = [float(x @ u) for x in X], [float(g @ u) for g in G]
        joint = sum(a * a * b * b for a, b in zip(s, t)) / len(s)
        vals.append(joint / (sum(a * a for a in s) / len(s) * sum(b * b for b in t) / len(t)) - 1)
    assert rho_directional(X, G, U) == pytest.approx(sum(vals) / len(vals), rel=1e-9)


def test_small_samples_get_the_exact_permutation_p_value():
    """n = 4 in a perfect rank order: 2 of the 24 orderings are as extreme (two-sided), p = 1/12, not scipy's
    asymptotic 0; from 9 points on, scipy's own p."""
    from itertools import permutations

    from scipy import stats

    from acbench.analyses.dependence import correlations

    x, y = [1.0, 2.0, 3.0, 4.0], [2.0, 4.0, 6.0, 9.0]
    c = correlations(x, y)
    assert c["spearman"]["p"] == pytest.approx(1 / 12) and c["spearman"]["r"] == 1.0
    r0 = stats.pearsonr(x, y)[0]
    extreme = sum(abs(stats.pearsonr(x, list(p))[0]) >= abs(r0) - 1e-12 for p in permutations(y))
    assert c["pearson"]["p"] == pytest.approx(extreme / 24)
    x9 = [0.3, 1.2, 0.7, 2.2, 1.9, 3.1, 2.5, 4.0, 3.3]
    y9 = [0.1, 0.9, 1.1, 1.8, 2.4, 2.6, 3.5, 3.2, 4.4]
    assert correlations(x9, y9)["spearman"]["p"] == pytest.approx(stats.spearmanr(x9, y9)[1])


def test_rho_cost_is_two_grams_and_the_projections():
    """Multiply-adds of rho_scores, by hand: two N x N Gram matrices over d (2 N^2 d) and the m directional
    projections of x and g (2 N d m)."""
    from acbench.analyses.dependence import cost_flops

    assert cost_flops(3, 4, 5) == 2 * 9 * 4 + 2 * 3 * 4 * 5 == 192
    assert cost_flops(512, 640, 64) == 2 * 512 ** 2 * 640 + 2 * 512 * 640 * 64


def _brute_exact_p(x, y):
    """Two-sided permutation p by brute force: the share of the n! orderings of y whose |Pearson r| with x reaches
    the observed one, each r computed from its definition."""
    from itertools import permutations

    def r(a, b):
        ma, mb = sum(a) / len(a), sum(b) / len(b)
        num = sum((u - ma) * (v - mb) for u, v in zip(a, b))
        return num / math.sqrt(sum((u - ma) ** 2 for u in a) * sum((v - mb) ** 2 for v in b))

    r0 = abs(r(x, y))
    orders = list(permutations(y))
    return sum(abs(r(x, o)) >= r0 - 1e-12 for o in orders) / len(orders)


def test_correlations_guards_and_missing_values():
    from acbench.analyses.dependence import correlations

    none = {"spearman": None, "pearson": None, "note": "fewer than 3 points or a constant variable"}
    assert correlations([1, 2], [3, 4]) == {"n": 2, **none}
    assert correlations([1, 1, 1, 1], [1, 2, 3, 4]) == {"n": 4, **none}  # x constant alone
    assert correlations([1, 2, 3, 4], [5, 5, 5, 5]) == {"n": 4, **none}  # y constant alone
    # a range of exactly 1 is not constant; 3 points are enough: 2 of the 3! orderings are as extreme, p = 1/3
    c = correlations([0.0, 0.5, 1.0], [2.0, 2.25, 3.0])
    assert c["n"] == 3 and c["spearman"]["r"] == 1.0 and c["spearman"]["p"] == pytest.approx(1 / 3)
    assert c["pearson"]["p"] == pytest.approx(_brute_exact_p([0.0, 0.5, 1.0], [2.0, 2.25, 3.0]))
    assert correlations([2.0, 2.25, 3.0], [0.0, 0.5, 1.0])["pearson"] is not None
    # a pair with a missing side (NaN, inf or None) is dropped, whichever side it is on
    x, y = [0.3, 1.2, 0.7, 2.2, 1.9], [0.1, 0.9, 1.1, 1.8, 2.4]
    full = correlations(x, y, n_boot=0)
    for xs, ys in ((x + [5.0], y + [math.nan]), (x + [None], y + [3.0]), (x + [math.inf], y + [None])):
        got = correlations(xs, ys, n_boot=0)
        assert got["n"] == 5 and got["spearman"]["r"] == full["spearman"]["r"]
        assert got["pearson"]["p"] == full["pearson"]["p"]


def test_exact_p_up_to_eight_points_ranks_for_spearman_values_for_pearson():
    """At 8 points (EXACT_MAX_N) both p-values are exact permutation p's: Spearman's over the ranks, Pearson's
    over the values; scipy's asymptotic p differs from both here, so the cut-over is pinned at 8 exactly."""
    from scipy import stats

    from acbench.analyses.dependence import EXACT_MAX_N, correlations

    assert EXACT_MAX_N == 8
    x = [0.3, 1.2, 0.7, 2.2, 1.9, 3.1, 2.5, 4.0]
    y = [0.1, 1.6, 0.4, 1.2, 3.0, 1.4, 2.2, 1.9]
    c = correlations(x, y, n_boot=0)
    p_rank = _brute_exact_p(list(stats.rankdata(x)), list(stats.rankdata(y)))
    p_value = _brute_exact_p(x, y)
    assert abs(p_rank - p_value) > 0.005  # the data tell ranks from values apart
    assert c["spearman"]["p"] == pytest.approx(p_rank, abs=1e-12)
    assert c["pearson"]["p"] == pytest.approx(p_value, abs=1e-12)
    assert abs(c["spearman"]["p"] - stats.spearmanr(x, y)[1]) > 0.002
    assert abs(c["pearson"]["p"] - stats.pearsonr(x, y)[1]) > 1e-4


def test_bootstrap_interval_by_hand():
    """The 95 % interval is the 2.5th and 97.5th percentile of r over resamples drawn with replacement (1000 by
    default, seed 0, one generator shared by Spearman then Pearson), skipping a resample where either side is
    constant; with no resample the interval is NaN."""
    import numpy as np
    from scipy import stats

    from acbench.analyses.dependence import correlations

    def by_hand(x, y):
        rng, xa, ya, out = np.random.default_rng(0), np.array(x), np.array(y), {}
        for name, fn in (("spearman", stats.spearmanr), ("pearson", stats.pearsonr)):
            rs = []
            for _ in range(1000):
                idx = [int(i) for i in rng.integers(0, len(x), len(x))]
                xs, ys = xa[idx], ya[idx]
                if len(set(xs.tolist())) > 1 and len(set(ys.tolist())) > 1:
                    rs.append(float(fn(xs, ys)[0]))
            out[name] = (len(rs), [float(np.percentile(rs, 2.5)), float(np.percentile(rs, 97.5))])
        return out

    # continuous values: every percentile, draw count and seed shows in the interval
    xc, yc = [0.12, 0.47, 0.31, 0.93, 0.58, 0.77, 0.05], [0.2, 0.61, 0.15, 0.88, 0.79, 0.42, 0.33]
    gotc = correlations(xc, yc)
    for name, (_, want) in by_hand(xc, yc).items():
        assert gotc[name]["ci95"] == pytest.approx(want, abs=1e-12), name
    x = [0.1, 0.1, 0.1, 0.6, 0.3]  # ties: many resamples have a constant x or y
    y = [0.0, 0.5, 0.5, 0.8, 0.8]  # a range under 1: resamples with a range below 1 still count
    got = correlations(x, y)
    for name, (kept, want) in by_hand(x, y).items():
        assert 500 < kept < 1000  # some resamples were constant and skipped
        assert got[name]["ci95"] == pytest.approx(want, abs=1e-12), name
    # the seed reaches the resampling (on the continuous values: with these ties the 2.5th and 97.5th percentiles
    # fall on the same repeated values, 0.6597 and 1.0, under seeds 0, 1 and 2 alike)
    assert correlations(xc, yc, seed=1)["pearson"]["ci95"] != gotc["pearson"]["ci95"]
    empty = correlations(x, y, n_boot=0)
    assert all(math.isnan(v) for v in empty["spearman"]["ci95"] + empty["pearson"]["ci95"])
    assert empty["spearman"]["r"] == got["spearman"]["r"]


def test_rho_scores_when_the_pair_moment_vanishes_and_its_invariances():
    """Tokens whose x are mutually orthogonal make every distinct pair's (x_i . x_j)^2 zero, so the U-statistic of
    ||M||^2 is 0: rho is undefined and said so. rho is a ratio of norms (unchanged when x is scaled), rho_dir is
    reported for one discarded direction and not for none."""
    X = torch.eye(4, dtype=torch.float64)
    G = torch.randn(4, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    got = rho_scores(X, G)
    assert set(got) == {"rho", "rho_cos", "n_tokens", "debiased", "note"}
    assert math.isnan(got["rho"]) and math.isnan(got["rho_cos"])
    assert (got["n_tokens"], got["debiased"], got["note"]) == (4, True, "||M||^2 estimate <= 0: increase --pair-tokens")
    xs, gs = pairs(200, 6, 3, coupled=True)
    full = rho_scores(xs, gs)
    small = rho_scores(1e-3 * xs, gs)  # every moment tiny: no floor may enter
    assert small["rho"] == pytest.approx(full["rho"], rel=1e-9) and 0 < full["rho"] < 1
    plug_in = rho_scores(1e-3 * xs, gs, debias=False)["rho"]
    assert plug_in == pytest.approx(rho_explicit(1e-3 * xs, gs)["rho"], rel=1e-6)
    U = torch.linalg.qr(torch.randn(6, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64))[0]
    assert "rho_dir" not in rho_scores(xs, gs, discard=U[:, :0])
    assert rho_scores(xs, gs, discard=U[:, :1])["rho_dir"] == pytest.approx(rho_directional(xs, gs, U[:, :1]))
