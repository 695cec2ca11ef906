"""acbench.core.significance against references written out here: McNemar's exact test and its conditional interval from
the binomial sums and beta quantiles, the paired t-test from its closed form, the bootstrap interval against the
normal one it approaches, and both branches of the above-chance test (the exact binomial tail, and the normal
approximation against the exact Poisson-binomial by dynamic programming). Every case has discordance both ways."""

import math

import numpy as np
import pytest
from scipy import stats as sps

from acbench.core.record import CellId, CellRecord
from acbench.core.significance import above_chance, compare, detectable_difference, mcnemar, paired_mean


def _pairs(b, c, both, neither):
    """Items: b where the reference is right and the other wrong, c the reverse, then agreements."""
    ref = [1.0] * b + [0.0] * c + [1.0] * both + [0.0] * neither
    other = [0.0] * b + [1.0] * c + [1.0] * both + [0.0] * neither
    return ref, other


@pytest.mark.parametrize("b,c,both,neither", [(7, 2, 30, 11), (3, 12, 5, 0), (5, 5, 10, 10), (1, 9, 0, 0),
                                              (20, 13, 40, 27)])
def test_mcnemar_is_the_exact_binomial_test_on_the_discordant_pairs(b, c, both, neither):
    ref, other = _pairs(b, c, both, neither)
    n, m = len(ref), b + c
    got = mcnemar(ref, other)
    assert got["discordant"] == [b, c] and got["n"] == n
    assert got["diff"] == pytest.approx((c - b) / n)
    # two-sided exact p at 1/2: twice the smaller tail, capped at 1
    tail = sum(math.comb(m, i) for i in range(min(b, c) + 1)) / 2 ** m
    assert got["p"] == pytest.approx(min(1.0, 2 * tail), rel=1e-9)
    # Clopper-Pearson for pi = P(other right | discordant), mapped to diff = m / n (2 pi - 1)
    lo = sps.beta.ppf(0.025, c, m - c + 1) if c > 0 else 0.0
    hi = sps.beta.ppf(0.975, c + 1, m - c) if c < m else 1.0
    assert got["ci95"] == pytest.approx([m / n * (2 * lo - 1), m / n * (2 * hi - 1)], rel=1e-7)
    assert got["ci95"][0] < got["diff"] < got["ci95"][1]
    # the interval excludes 0 exactly when the test rejects at 5 %
    assert (got["p"] < 0.05) == (not got["ci95"][0] <= 0 <= got["ci95"][1])


def test_mcnemar_without_discordant_pairs_is_no_difference():
    ref, other = _pairs(0, 0, 8, 4)
    assert mcnemar(ref, other) == {"diff": 0.0, "ci95": [0.0, 0.0], "ci90": [0.0, 0.0], "p": 1.0, "n": 12,
                                   "discordant": [0, 0], "test": "McNemar exact"}


def test_paired_mean_is_the_t_test_and_its_own_interval():
    rng = np.random.default_rng(4)
    ref = rng.normal(3.0, 1.0, 400)
    other = ref + rng.normal(0.05, 0.3, 400)  # differences of both signs
    got = paired_mean(list(ref), list(other))
    d = other - ref
    se = d.std(ddof=1) / math.sqrt(d.size)
    assert got["diff"] == pytest.approx(d.mean())
    assert got["p"] == pytest.approx(2 * sps.t.sf(abs(d.mean() / se), d.size - 1), rel=1e-9)
    assert got["ci95"] == pytest.approx([d.mean() - 1.9659 * se, d.mean() + 1.9659 * se], rel=1e-4)  # t(399)
    assert got["ci90"] == pytest.approx([d.mean() - 1.6487 * se, d.mean() + 1.6487 * se], rel=1e-4)


def test_the_interval_excludes_zero_exactly_when_the_test_rejects():
    """Two windows: the t interval (1 degree of freedom) agrees with the test where a bootstrap's did not (it
    printed [1.31, 2.02] beside p = 0.08)."""
    got = paired_mean([0.0, 0.0], [1.3, 2.0])
    assert got["p"] > 0.05 and got["ci95"][0] < 0 < got["ci95"][1]
    rng = np.random.default_rng(1)
    for n in (2, 3, 5, 16, 60):
        for _ in range(50):
            d = rng.normal(0.3, 1.0, n)
            r = paired_mean([0.0] * n, list(d))
            assert (r["p"] < 0.05) == (r["ci95"][0] > 0 or r["ci95"][1] < 0)


def test_paired_mean_of_a_constant_difference():
    assert paired_mean([1.0, 2.0, 3.0], [1.5, 2.5, 3.5])["p"] == 0.0
    assert paired_mean([1.0, 2.0], [1.0, 2.0])["p"] == 1.0


def _cell(correct, chance):
    recs = [{"id": i, "correct": x, "chance": ch} for i, (x, ch) in enumerate(zip(correct, chance))]
    return CellRecord(cell=CellId("m", "dense", None, "rank", "t"), metrics={"acc": float(np.mean(correct))},
                      primary_metric="acc", records=recs)


def test_above_chance_with_one_chance_level_is_the_binomial_tail():
    correct = [1] * 19 + [0] * 41  # 19 of 60 at chance 1/4
    got = above_chance(_cell(correct, [0.25] * 60))
    want = sum(math.comb(60, i) * 0.25 ** i * 0.75 ** (60 - i) for i in range(19, 61))
    assert got["p"] == pytest.approx(want, rel=1e-9)
    assert got["acc"] == pytest.approx(19 / 60) and got["chance"] == pytest.approx(0.25) and not got["above"]


def _poisson_binomial_tail(chance, k):
    """P(at least k successes) for independent items with these success probabilities, by dynamic programming."""
    dist = np.zeros(len(chance) + 1)
    dist[0] = 1.0
    for p in chance:
        dist[1:] = dist[1:] * (1 - p) + dist[:-1] * p
        dist[0] *= 1 - p
    return float(dist[k:].sum())


@pytest.mark.parametrize("k", [70, 80, 95])
def test_above_chance_with_varied_levels_is_the_normal_approximation(k):
    """LAMA's items have 1 / (number of candidates) each: the normal approximation with continuity correction,
    written out, and within 0.01 of the exact Poisson-binomial tail at n = 300."""
    chance = [1 / n for n in np.random.default_rng(0).integers(2, 12, 300)]
    correct = [1] * k + [0] * (300 - k)
    got = above_chance(_cell(correct, chance))
    mean, var = sum(chance), sum(p * (1 - p) for p in chance)
    assert got["p"] == pytest.approx(sps.norm.sf((k - 0.5 - mean) / math.sqrt(var)), rel=1e-9)
    assert got["p"] == pytest.approx(_poisson_binomial_tail(chance, k), abs=0.01)
    assert got["above"] == (got["p"] < 0.05)


def test_compare_pairs_cells_only_on_the_same_items():
    ref, other = _pairs(4, 9, 10, 7)
    a, b = _cell(ref, [0.25] * len(ref)), _cell(other, [0.25] * len(ref))
    # McNemar's result, with the difference the comparison could detect beside it
    assert compare(a, b) == {**mcnemar(ref, other), "detectable": detectable_difference(a, b)}
    b.records = b.records[::-1]  # the same scores in another order: not the same items
    assert compare(a, b) is None


def test_paired_mean_interval_is_pinned_by_hand():
    """Differences 0.3, -0.1, 0.4, -0.3, 0.6: mean 0.18, sd 0.370135, t(4, 0.975) = 2.776445 from the table, so the
    interval is 0.18 +- 0.459583 (a z quantile, or a bootstrap, would be narrower)."""
    got = paired_mean([1.0, 2.0, 3.5, 0.5, 2.2], [1.3, 1.9, 3.9, 0.2, 2.8])
    assert got["ci95"] == pytest.approx([0.18 - 0.459583, 0.18 + 0.459583], abs=1e-6)
    assert got["test"] == "paired t" and got["n"] == 5


def test_item_scores_and_keys():
    from acbench.core.significance import item_keys, item_scores

    acc = _cell([1, 0, 1], [0.25] * 3)
    assert item_scores(acc) == ("accuracy", [1.0, 0.0, 1.0])
    nll = CellRecord(cell=CellId("m", "dense", None, "rank", "ppl-token"), metrics={"ppl": 2.0}, primary_metric="ppl",
                     records=[{"window": 0, "nll": 1.5}, {"window": 1, "nll": 2}])
    assert item_scores(nll) == ("nll", [1.5, 2.0])
    for bad in ([], [{"correct": 1}, "x"], [{"correct": 1}, {"nll": 2.0}], "records"):
        acc.records = bad
        assert item_scores(acc) is None
    rec = {"id": 3, "subject": "s", "relation": "r", "gold": ["g"], "window": 7, "other": 1}
    acc.records = [rec]
    assert item_keys(acc) == [("3", "s", "r", "['g']", "7")]  # every identifying field, in this order


@pytest.mark.parametrize("field", ["subject", "relation", "gold", "window"])
def test_compare_refuses_cells_whose_items_differ_in_any_identifying_field(field):
    a = _cell([1, 0, 1, 1], [0.25] * 4)
    b = _cell([1, 1, 0, 1], [0.25] * 4)
    for r in a.records + b.records:
        r.update(subject="s", relation="r", gold="g", window=0)
    assert compare(a, b) is not None
    b.records[2][field] = "changed"
    assert compare(a, b) is None


def test_compare_refuses_different_lengths_and_kinds():
    a, b = _cell([1, 0, 1], [0.25] * 3), _cell([1, 0], [0.25] * 2)
    assert compare(a, b) is None
    nll = CellRecord(cell=CellId("m", "dense", None, "rank", "t"), metrics={"ppl": 2.0}, primary_metric="ppl",
                     records=[{"id": i, "nll": 1.0} for i in range(3)])
    assert compare(a, nll) is None and compare(nll, a) is None
    assert mcnemar(*_pairs(2, 3, 1, 1))["test"] == "McNemar exact"


def test_chance_levels_need_every_record_to_declare_one_in_the_unit_interval():
    from acbench.core.significance import chance_levels

    c = _cell([1, 0], [0.0, 1.0])
    assert chance_levels(c) == [0.0, 1.0]  # the bounds are allowed
    for bad in ([0.5, 1.5], [0.5, -0.1], [0.5, "0.5"]):
        c = _cell([1, 0], bad)
        assert chance_levels(c) is None and above_chance(c) is None
    c.records = []
    assert chance_levels(c) is None


def test_above_chance_needs_accuracy_records_of_the_same_length():
    c = _cell([1, 0, 1], [0.25] * 3)
    c.records[1]["chance"] = None
    assert above_chance(c) is None
    nll = CellRecord(cell=CellId("m", "dense", None, "rank", "t"), metrics={"ppl": 2.0}, primary_metric="ppl",
                     records=[{"nll": 1.0, "chance": 0.5}])
    assert above_chance(nll) is None
    got = above_chance(_cell([1, 0, 1], [0.25] * 3))
    assert set(got) == {"acc", "chance", "p", "above", "n"} and got["n"] == 3


@pytest.mark.parametrize("k,p", [(1, 1.0), (2, 0.0)])
def test_above_chance_without_variance_is_decided_by_the_count(k, p):
    """Chance levels of only 0 and 1 (varied, so not the binomial branch) have no variance: the count either
    exceeds the expected number (p = 0) or does not (p = 1)."""
    got = above_chance(_cell([1] * k + [0] * (2 - k), [0.0, 1.0]))
    assert got["p"] == p and got["above"] == (p < 0.05)


def test_above_chance_at_exactly_alpha_is_not_above():
    """p < 0.05, not <=: on the boundary the task does not count as above chance. 0.05 exactly is reached by a
    one-item task at chance 0.05 answered right (P(X >= 1) = 0.05)."""
    got = above_chance(_cell([1], [0.05]))
    assert got["p"] == pytest.approx(0.05) and got["above"] is (got["p"] < 0.05)


def test_above_chance_uses_the_normal_branch_for_any_positive_variance():
    chance = [0.5, 0.25]  # variance 0.4375, below 1
    got = above_chance(_cell([1, 1], chance))
    assert got["p"] == pytest.approx(sps.norm.sf((2 - 0.5 - 0.75) / math.sqrt(0.4375)), rel=1e-9)


def test_paired_mean_of_two_items_is_a_t_test():
    got = paired_mean([0.0, 0.0], [1.0, 3.0])  # differences 1 and 3: t = 2 / (sqrt(2) / sqrt(2)) = 2, 1 dof
    assert got["p"] == pytest.approx(2 * sps.t.sf(2.0, 1), rel=1e-9)


def test_compare_with_one_cell_without_records_is_none():
    a = _cell([1, 0, 1], [0.25] * 3)
    empty = CellRecord(cell=CellId("m", "pca", 0.5, "rank", "t"), metrics={"acc": 0.5}, primary_metric="acc")
    assert compare(empty, a) is None and compare(a, empty) is None
