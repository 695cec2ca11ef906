"""FASC's coupling correction generalises: synthetic distributions of docs/design.md, section 4, mean of 5 seeds."""

import functools

import pytest
import torch

from acbench.core.linalg import direction_scores, weighted_subspace
from acbench.methods.fasc import _apply, select_discard, swap_path

from coupling_synthetic import Distribution

SEEDS = range(5)


@functools.cache
def _distribution_reference(kind: str, d: int, seed: int):
    """What a held-out comparison on one (kind, d, seed) shares whatever N and folds are: the 8,192 calibration
    tokens and their solve, Q on 40,000 held-out tokens, fasc-kfac's surrogate there, and an oracle's change (swaps
    searched on another 40,000 tokens). Computed once per distribution, in the order the draws were always made."""
    dist = Distribution(kind, d, seed)
    x, g = dist.sample(8192)
    sol = weighted_subspace(x.T @ x / len(x), F=g.T @ g / len(g))
    kfac = torch.arange(d // 2, d)

    def Q_of(n):
        z = direction_scores(sol, *dist.sample(n))
        return z.T @ z / n

    Qh, Qo = Q_of(40_000), Q_of(40_000)
    base = float(_apply(d, kfac, []).double() @ Qh @ _apply(d, kfac, []).double())
    oracle = _apply(d, kfac, swap_path(Qo, kfac, 10_000))
    return x, g, sol, kfac, Qh, base, float(oracle.double() @ Qh @ oracle.double()) / base - 1


def heldout_change(kind: str, d: int, N: int, seed: int, folds: int = 4) -> tuple[float, float]:
    """(fasc's, an oracle's) held-out surrogate change vs fasc-kfac: C, F from 8,192 tokens, the pair sample their
    first N, held-out surrogate on 40,000 fresh tokens; the oracle searches swaps on another 40,000 tokens."""
    x, g, sol, kfac, Qh, base, oracle_change = _distribution_reference(kind, d, seed)
    D, extras = select_discard(direction_scores(sol, x[:N], g[:N]), kfac, 512, folds)
    assert extras["swaps"] <= extras["swaps_in_sample"]
    return float(D.double() @ Qh @ D.double()) / base - 1, oracle_change


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # small matrices: threads only add overhead
    yield
    torch.set_num_threads(n)


def test_no_overfitting_where_kfac_is_right():
    changes = [heldout_change("A", 64, 512, s)[0] for s in SEEDS]
    assert sum(changes) / len(changes) <= 0.01
    # the unvalidated in-sample search (folds=1) is what overfits: it is measurably worse held-out
    unvalidated = [heldout_change("A", 64, 512, s, folds=1)[0] for s in SEEDS]
    assert sum(unvalidated) / len(unvalidated) > 0.03


@pytest.mark.parametrize("N", [512, 4096])
def test_keeps_half_the_oracle_gain_where_kfac_misranks(N):
    pairs = [heldout_change("B", 128, N, s) for s in SEEDS]
    fasc = sum(p[0] for p in pairs) / len(pairs)
    oracle = sum(p[1] for p in pairs) / len(pairs)
    assert oracle < -0.1
    assert fasc <= 0.5 * oracle


def test_fasc_settings_are_validated():
    from acbench.methods.fasc import FASC

    with pytest.raises(ValueError, match="max_swaps must be >= 0"):
        FASC.from_options({"max_swaps": -5})
    with pytest.raises(TypeError, match="max_swaps must be int"):
        FASC.from_options({"max_swaps": "abc"})
    with pytest.raises(ValueError, match="folds must be >= 1"):
        FASC.from_options({"folds": 0})


def reference_swap_path(Q: torch.Tensor, discard: torch.Tensor, max_swaps: int) -> list[tuple[int, int]]:
    """The plain form of the greedy search (D x K gathered again at every swap), against which the incremental
    one in methods/fasc.py is pinned."""
    d = Q.shape[0]
    in_D = torch.zeros(d, dtype=torch.bool)
    in_D[discard] = True
    r = Q[:, in_D].sum(1)
    diag = Q.diagonal()
    scale = diag.abs().sum().clamp_min(1e-300)
    path = []
    while len(path) < max_swaps:
        D, K = in_D.nonzero().squeeze(1), (~in_D).nonzero().squeeze(1)
        delta = (-2 * r[D] + diag[D])[:, None] + (2 * r[K] + diag[K])[None, :] - 2 * Q[D][:, K]
        best = int(delta.argmin())
        if delta.view(-1)[best] >= -1e-12 * scale:
            break
        i, j = int(D[best // K.numel()]), int(K[best % K.numel()])
        in_D[i], in_D[j] = False, True
        r += Q[:, j] - Q[:, i]
        path.append((i, j))
    return path


@pytest.mark.parametrize("d,k,seed", [(64, 32, 0), (200, 60, 1), (640, 320, 2)])
def test_swap_path_equals_the_plain_search(d, k, seed):
    gen = torch.Generator().manual_seed(seed)
    # directions in random order of size, some coupled across the cut: the K-FAC discard set is far from the
    # greedy optimum, so the paths are long
    z = torch.randn(512, d, generator=gen, dtype=torch.float64) * (torch.rand(d, generator=gen, dtype=torch.float64) + 0.1)
    z[:, :8] += 0.7 * z[:, k:k + 8]
    Q = z.T @ z / len(z)
    discard = torch.arange(k, d)
    got, want = swap_path(Q, discard, 300), reference_swap_path(Q, discard, 300)
    assert len(want) > 5 and got == want


def test_swap_path_breaks_ties_as_the_plain_search():
    gen = torch.Generator().manual_seed(3)
    for _ in range(20):  # small integers: many exactly equal deltas
        Q = torch.randint(-3, 4, (30, 30), generator=gen).double()
        Q = Q + Q.T
        discard = torch.arange(12, 30)
        assert swap_path(Q, discard, 40) == reference_swap_path(Q, discard, 40)


def test_fasc_selection_is_memoised_per_group_and_rank():
    from acbench.core.stats import GroupStats
    from acbench.methods.fasc import FASC

    d, n = 48, 256
    dist = Distribution("B", d, 0)
    x, g = dist.sample(n)
    st = GroupStats(n_tokens=n, C=x.T @ x / n, F=g.T @ g / n, xs=x.float(), gs=g.float())
    W = {"w": torch.randn(32, d, dtype=torch.float64)}
    fasc = FASC.from_options({})
    first = fasc.solve(W, st, 24)
    keys = [key for key in st.memo if key.startswith("fasc_discard:")]
    assert keys == ["fasc_discard:24:512:4"]
    st.memo[keys[0]] = (st.memo[keys[0]][0], {**st.memo[keys[0]][1], "marker": 1})
    again = fasc.solve(W, st, 24)  # read from the memo, not searched again
    assert again[3]["marker"] == 1
    assert all(torch.equal(a, b) for a, b in zip(first[0]["w"], again[0]["w"]))
    fasc.solve(W, st, 12)
    assert len([key for key in st.memo if key.startswith("fasc_discard:")]) == 2


def test_rho_reads_the_scores_fasc_memoised_with_the_same_numbers():
    from types import SimpleNamespace

    from acbench.analyses.rho import group_rho
    from acbench.core.stats import GroupStats, RankSpec
    from acbench.methods.fasc import FASC

    d, n = 48, 256
    x, g = Distribution("B", d, 1).sample(n)

    def fresh():
        return GroupStats(n_tokens=n, C=x.T @ x / n, F=g.T @ g / n, xs=x.float(), gs=g.float())

    group = SimpleNamespace(name="g", block=0, kind="mlp_in", d_in=d, d_outs=(32,))
    cold = group_rho({"g": fresh()}, [group], RankSpec(0.5))[0]
    warm_stats = fresh()
    FASC.from_options({}).solve({"w": torch.randn(32, d, dtype=torch.float64)}, warm_stats, 24)
    assert "fisher_scores" in warm_stats.memo
    warm = group_rho({"g": warm_stats}, [group], RankSpec(0.5))[0]
    assert {k: v for k, v in cold.items() if k != "seconds"} == {k: v for k, v in warm.items() if k != "seconds"}


@pytest.mark.parametrize("seed", [0, 1])
def test_fasc_method_swaps_and_beats_fasc_kfac_held_out_where_kfac_misranks(seed):
    """The `fasc` method end to end on distribution B (where the coupling makes K-FAC misrank directions): it
    swaps, and its projection has a lower token surrogate than fasc-kfac's on fresh tokens, so the two methods
    are told apart (on random_stats' Gaussian-like tokens fasc makes no swap and equals fasc-kfac)."""
    from acbench import methods
    from acbench.core.stats import GroupStats, RankSpec
    from test_methods import FakeGroup, projection_of

    d = 32
    dist = Distribution("B", d, seed)
    x, g = dist.sample(8192)
    st = GroupStats(n_tokens=len(x), C=x.T @ x / len(x), F=g.T @ g / len(g), xs=x[:2048], gs=g[:2048])
    group = FakeGroup({"s": torch.eye(d)})  # identity weights: the surrogate is the projection's alone
    kf = methods.get_method("fasc-kfac")().compress(group, st, RankSpec(0.5))
    fa = methods.get_method("fasc")().compress(group, st, RankSpec(0.5))
    assert fa.extras["swaps"] > 0
    xh, gh = dist.sample(40_000)

    def held_out(res):
        P = projection_of(res, {"s": torch.eye(d)})
        e = xh @ (torch.eye(d, dtype=torch.float64) - P).T
        return float(((gh * e).sum(1) ** 2).mean())

    assert held_out(fa) < 0.9 * held_out(kf)  # 0.63 and 0.57 of it when written


def _direct(Q: torch.Tensor, in_D: torch.Tensor) -> float:
    ones = in_D.double()
    return float(ones @ Q @ ones)


def _scores(seed: int, n: int = 240, d: int = 24, coupling: float = 0.8, spread: float = 1.0) -> torch.Tensor:
    """Per-direction scores z (n x d) whose K-FAC discard set (the last half) is some swaps from the optimum
    (spread 0: every direction alike, so that swaps fit the sample's noise)."""
    gen = torch.Generator().manual_seed(seed)
    scale = spread * torch.rand(d, generator=gen, dtype=torch.float64) + 0.1
    z = torch.randn(n, d, generator=gen, dtype=torch.float64) * scale
    z[:, :4] += coupling * z[:, d // 2:d // 2 + 4]
    return z


def test_path_values_are_the_surrogate_after_each_swap_on_another_sample():
    from acbench.methods.fasc import path_values

    z, other = _scores(0), _scores(1)
    d, discard = z.shape[1], torch.arange(12, 24)
    path = swap_path(z.T @ z / len(z), discard, 50)
    assert len(path) >= 3
    Q = other.T @ other / len(other)
    got = path_values(Q, discard, path)
    want = torch.tensor([_direct(Q, _apply(d, discard, path[:t])) for t in range(len(path) + 1)], dtype=torch.float64)
    assert got.dtype == Q.dtype and got.shape == want.shape and torch.allclose(got, want, rtol=1e-12, atol=0)
    assert torch.equal(_apply(d, discard, []), torch.arange(d) >= 12)


def reference_cross_validation(z: torch.Tensor, discard: torch.Tensor, max_swaps: int, folds: int, seed: int = 0):
    """K-fold cross-validation of the swap path's length, written out: token t is in fold (its place in a seeded
    permutation) mod folds; each fold's path is fitted on the other folds and scored on its own, relative to no
    swap; a length qualifies only if every fold's held-out surrogate is below its K-FAC value; the qualifying length
    (or 0) of least mean wins, the shorter on a tie."""
    n, d = z.shape
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    fold_of = [0] * n
    for place, token in enumerate(perm):
        fold_of[token] = place % folds
    curves = []
    for f in range(folds):
        fit = z[[t for t in range(n) if fold_of[t] != f]]
        held = z[[t for t in range(n) if fold_of[t] == f]]
        path = reference_swap_path(fit.T @ fit / len(fit), discard, max_swaps)
        Qh = held.T @ held / len(held)
        values = [_direct(Qh, _apply(d, discard, path[:t])) for t in range(len(path) + 1)]
        values += [values[-1]] * (max_swaps + 1 - len(values))
        curves.append([v / values[0] for v in values])
    mean = [sum(c[t] for c in curves) / folds for t in range(max_swaps + 1)]
    qualify = [0] + [t for t in range(1, max_swaps + 1) if all(c[t] < 1 for c in curves)]
    best = min(qualify, key=lambda t: (mean[t], t))
    return best, mean


# coupled directions, where every fold keeps all 6 swaps or 5; directions alike, where the swaps fit noise: some
# fold disagrees with the best mean (0 swaps kept although 4, 2 or 3 have the least mean), the path ends early and
# the mean is flat from 4 swaps on (the shortest is kept), a single swap generalises
CASES = [(0, 240, 0.8, 1.0), (3, 240, 0.0, 1.0), (0, 60, 0.0, 0.0), (7, 240, 0.0, 0.0), (11, 240, 0.0, 0.0),
         (1, 60, 0.0, 0.0), (6, 60, 0.0, 0.0)]


@pytest.mark.parametrize("seed, n, coupling, spread", CASES)
def test_cross_validated_swaps_equal_the_written_out_validation(seed, n, coupling, spread):
    from acbench.methods.fasc import cross_validated_swaps

    z = _scores(seed, n=n, coupling=coupling, spread=spread)
    discard = torch.arange(12, 24)
    max_swaps = 6
    got = cross_validated_swaps(z, discard, max_swaps, folds=3, seed=seed)
    best, mean = reference_cross_validation(z, discard, max_swaps, 3, seed)
    assert got["swaps"] == best
    assert got["heldout_ratio"] == pytest.approx(mean[best], rel=1e-10)
    assert torch.allclose(got["curve"], torch.tensor(mean, dtype=torch.float64), rtol=1e-10, atol=0)


@pytest.mark.parametrize("seed, n, coupling, spread, folds", [(0, 240, 0.8, 1.0, 3), (0, 60, 0.0, 0.0, 3),
                                                              (1, 60, 0.0, 0.0, 4), (0, 240, 0.8, 1.0, 1),
                                                              (0, 60, 0.0, 0.0, 2)])
def test_select_discard_records_each_surrogate_as_written_out(seed, n, coupling, spread, folds):
    """select_discard against its description: the in-sample path from K-FAC's discard set, cut to the validated
    length (folds > 1), and every surrogate it records computed directly."""
    z = _scores(seed, n=n, coupling=coupling, spread=spread)
    d, kfac = z.shape[1], torch.arange(12, 24)
    Q = z.T @ z / n
    path = reference_swap_path(Q, kfac, 512)
    assert path
    in_D, extras = select_discard(z, kfac, 512, folds)
    want = {"swaps_in_sample": len(path), "pair_tokens": n, "folds": folds}
    if folds > 1:
        best, mean = reference_cross_validation(z, kfac, len(path), folds)
        want.update(swaps=best, surrogate_heldout_ratio=pytest.approx(mean[best], rel=1e-10),
                    surrogate_heldout_ratio_all_swaps=pytest.approx(mean[len(path)], rel=1e-10))
    else:
        want["swaps"] = len(path)
    chosen = _apply(d, kfac, path[:want["swaps"]])
    want.update(surrogate_tokens=pytest.approx(_direct(Q, chosen), rel=1e-10),
                surrogate_tokens_kfac_choice=pytest.approx(_direct(Q, torch.arange(d) >= 12), rel=1e-10))
    assert torch.equal(in_D, chosen)
    assert extras == want


def test_select_discard_without_a_swap_keeps_kfac_and_skips_the_validation():
    z = _scores(0, spread=0.0, coupling=0.0)
    z[:, 12:] *= 1e-3  # the discarded directions carry next to nothing: no swap improves
    in_D, extras = select_discard(z, torch.arange(12, 24), 512, 4)
    assert torch.equal(in_D, torch.arange(24) >= 12)
    assert extras["swaps"] == extras["swaps_in_sample"] == 0 and "surrogate_heldout_ratio" not in extras


def test_fasc_solve_reports_the_kfac_surrogate_of_its_own_discard_set():
    """fasc-kfac records tr of the discarded eigenvalues, sum lam[k:]; fasc the same sum over the set it discards
    after its swaps; the projection keeps the complementary directions of the K-FAC basis."""
    from acbench.core.linalg import fisher_basis, fisher_scores
    from acbench.core.stats import GroupStats
    from acbench.methods.fasc import FASC, FASCKFAC

    d, n = 32, 2048
    x, g = Distribution("B", d, 0).sample(n)
    st = GroupStats(n_tokens=n, C=x.T @ x / n, F=g.T @ g / n, xs=x.float(), gs=g.float())
    W = {"w": torch.randn(20, d, generator=torch.Generator().manual_seed(0), dtype=torch.float64)}
    sol = fisher_basis(st)
    factors, shared, fallbacks, extras = FASCKFAC().solve(W, st, 16)
    assert shared and fallbacks == sol["fallbacks"]
    assert extras == {"surrogate_kfac": pytest.approx(float(sol["lam"][16:].sum()), rel=1e-12)}
    A, B = factors["w"]
    assert torch.allclose(B, sol["Wt"][:16]) and torch.allclose(A, W["w"] @ sol["U"][:, :16])
    factors, shared, _, extras = FASC().solve(W, st, 16)
    in_D, _ = select_discard(fisher_scores(st), torch.arange(16, d), 512, 4)  # pinned above
    assert extras["swaps"] > 0 and int(in_D.sum()) == 16
    assert extras["surrogate_kfac"] == pytest.approx(float(sol["lam"][in_D].sum()), rel=1e-12)
    assert extras["surrogate_kfac"] > float(sol["lam"][16:].sum())  # the swaps give up some K-FAC surrogate
    keep = (~in_D).nonzero().squeeze(1)
    assert torch.allclose(factors["w"][1], sol["Wt"][keep]) and torch.allclose(factors["w"][0],
                                                                                W["w"] @ sol["U"][:, keep])


def test_fasc_settings_floor_and_cost_declaration():
    from acbench.methods.fasc import FASC, FASCKFAC, FASCSettings
    from acbench.methods.base import basis_ops, projection_ops

    assert FASCSettings(folds=3).minimums() == {"folds": (3, 1)}
    kfac = FASCKFAC().solve_ops(64, (32, 96), 16, 500)
    assert kfac == [*basis_ops(64).values(), *projection_ops(64, (32, 96), 16)]
    fasc = FASC.from_options({"folds": 3}).solve_ops(64, (32, 96), 16, 500)
    assert fasc == kfac + [("fisher_scores", "flops", 4 * 500 * 64 * 64), ("", "flops", 4 * 500 * 64 * 64),
                           ("", "bytes", 4 * 50 * 4 * 8 * 16 * 48)]


def test_a_fold_whose_held_out_surrogate_stays_put_vetoes_every_swap():
    """Nine sparse tokens in three folds: one fold's curve stays exactly at its K-FAC value (1.0: no swap changes its
    held-out surrogate) while the other two fall. A length qualifies only where every fold is strictly below K-FAC,
    so no swap is kept, although the mean curve falls."""
    from acbench.methods.fasc import cross_validated_swaps

    gen = torch.Generator().manual_seed(0)
    z = torch.randn(9, 4, generator=gen, dtype=torch.float64)
    z = z * (torch.rand(9, 4, generator=gen) < 0.4)
    got = cross_validated_swaps(z, torch.arange(2, 4), 3, 3, seed=0)
    best, mean = reference_cross_validation(z, torch.arange(2, 4), 3, 3, 0)
    assert got["swaps"] == best == 0 and min(mean[1:]) < 1
    assert torch.allclose(got["curve"], torch.tensor(mean, dtype=torch.float64), rtol=1e-12, atol=0)


def test_least_swap_gain_per_precision():
    """1e-12 of tr Q in float64; in float32, 64 times its machine epsilon (7.6e-6), above its round-off."""
    from acbench.methods.fasc import _improvement

    assert _improvement(torch.float64) == 1e-12
    assert _improvement(torch.float32) == 64 * 2.0 ** -23


def test_a_gain_at_the_least_swap_gain_is_not_taken():
    """d = 2, D = {1}: swapping 1 for 0 changes 1_D^T Q 1_D by Q00 - Q11 + 2 (Q01 - Q10), here exactly -2e-12, and
    the least gain taken is 1e-12 of sum |Q_ii| = 2: a gain exactly there is not taken, a larger one is."""
    at = torch.tensor([[1.0, 0.0], [1e-12, 1.0]], dtype=torch.float64)
    assert swap_path(at, torch.tensor([1]), 5) == []
    above = torch.tensor([[1.0, 0.0], [1.5e-12, 1.0]], dtype=torch.float64)
    assert swap_path(above, torch.tensor([1]), 5) == [(1, 0)]


def test_first_minimum_takes_the_smallest_index_pair_not_the_first_slot():
    """After swaps the slots of D and K no longer hold their indices in order: slot 0 of D holds direction 5 and
    slot 1 direction 2. Of the tied minima (5, 7), (2, 7) and (2, 3), the pair first in index order is (2, 3)."""
    from acbench.methods.fasc import _first_minimum

    D, K = torch.tensor([5, 2]), torch.tensor([7, 3])
    delta = torch.tensor([[-1.0, 0.0], [-1.0, -1.0]])
    row_low = delta.amin(1)
    assert _first_minimum(delta, row_low, row_low.min(), D, K, 8) == (1, 1)
    D = torch.tensor([2, 5])  # the same pairs, slots the other way round
    assert _first_minimum(delta.flip(0), row_low.flip(0), -1.0, D, K, 8) == (0, 1)
