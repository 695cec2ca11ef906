"""What each method promises beyond its formula, checked where a mutation test found it unchecked: a non-finite
statistic is refused naming the method and the statistic; a projection method says its B is shared (so its
parameters are counted once per group); whitened-svd per site is SVD-LLM's per-matrix formula; fwsvd's floor on
the row weights is recorded where it bites; truncated_factors is the truncated SVD in either precision and shape;
teal refuses an N:M pattern itself; capabilities answer on the class; fasc's in-sample swap search ends at a
local optimum below its start."""

import numpy as np
import pytest
import torch

from acbench import methods
from acbench.core.stats import GroupStats, RankSpec, SparsitySpec

from acbench.testing import poisoned
from test_methods import FakeGroup, random_stats

D = 10


def _w(d_out=7, d=D, seed=2):
    return torch.randn(d_out, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _stats(d=D):
    st = random_stats(d, seed=4)
    st.row_fisher = {"s": torch.rand(7, generator=torch.Generator().manual_seed(1), dtype=torch.float64) + 0.1}
    return st


def _reads(method):
    needs = methods.get_method(method).needs
    return sorted((needs & {"C", "F", "abs_mean", "row_fisher"}) | ({"xs", "gs"} if "pairs" in needs else set()))


LOW_RANK_READING = [(m, s) for m in methods.known_methods("low-rank") for s in _reads(m)]
# who says it: the method itself, or the shared solve it goes through (C's whitening, fasc's K-FAC basis)
WHERE = {"asvd": "asvd", "espace-nl": "espace-nl", "fwsvd": "fwsvd", "fasc": "fasc", "fasc-kfac": "fasc",
         "svd-llm-v2": "svd-llm-v2", "pca": "pca"}  # pca: a decorated function, checked by its decorator


@pytest.mark.parametrize("method,stat", LOW_RANK_READING, ids=lambda v: str(v))
def test_a_non_finite_statistic_is_refused_naming_the_method_and_the_statistic(method, stat):
    from acbench.core.linalg import NumericError

    comp = methods.get_method(method)()
    with pytest.raises(NumericError) as e:
        comp.compress(FakeGroup({"s": _w().float()}), poisoned(_stats(), stat), RankSpec(0.4))
    assert f"non-finite {stat} statistics in {WHERE.get(method, 'the group')}:" in str(e.value)
    assert str(e.value).endswith(": recalibrate in float32 (--dtype float32) or with fewer/shorter calibration windows")


@pytest.mark.parametrize("method", methods.known_methods("low-rank"))
def test_projection_methods_share_one_B_and_count_it_once(method):
    comp = methods.get_method(method)()
    weights = {"a": _w(7), "b": _w(5, seed=3)}
    res = comp.compress(FakeGroup({n: W.float() for n, W in weights.items()}), _stats_two(), RankSpec(0.4))
    assert res.shared_projection == comp.projection
    if comp.projection:
        (_, Ba), (_, Bb) = res.factors.values()
        assert torch.equal(Ba, Bb)
        assert res.params_deployed == res.k * (D + 7 + 5)  # B once (k x d), each A (d_out x k)


def _stats_two():
    st = _stats()
    st.row_fisher = {n: torch.rand(o, generator=torch.Generator().manual_seed(5), dtype=torch.float64) + 0.1
                     for n, o in (("a", 7), ("b", 5))}
    return st


def test_whitened_svd_per_site_is_svdllm_per_matrix():
    """SVD-LLM per matrix: S = chol(C), W' = trunc_k(W S) S^-1, each site with its own k."""
    W, st = _w(), random_stats(D, seed=6)
    comp = methods.get_method("whitened-svd").from_options({"per_site": True})
    res = comp.compress(FakeGroup({"s": W.float()}), st, RankSpec(0.4))
    A, B = res.factors["s"]
    k = res.k_sites["s"]
    assert 0 < k < 7
    C = st.C.numpy()
    S = np.linalg.cholesky(C)
    U, s, Vt = np.linalg.svd(W.float().double().numpy() @ S, full_matrices=False)
    want = U[:, :k] @ np.diag(s[:k]) @ Vt[:k] @ np.linalg.inv(S)
    got = (A.double() @ B.double()).numpy()
    assert np.linalg.norm(got - want) <= 1e-5 * np.linalg.norm(want)


@pytest.mark.parametrize("scale", [1e-4, 1.0, 1e4])
def test_fwsvd_floors_the_row_weights_it_cannot_invert_and_says_how_many(scale):
    """r = sqrt(row Fisher), floored at 1e-6 mean(r); every floored row is counted in the fallback record."""
    W = _w()
    row = torch.tensor([4.0, 1.0, 0.0, 9.0, 1e-14, 2.0, 1e-20], dtype=torch.float64) * scale
    res = methods.get_method("fwsvd")().compress(FakeGroup({"s": W.float()}), GroupStats(row_fisher={"s": row}),
                                                 RankSpec(0.4))
    r = np.sqrt(row.numpy())
    floor = 1e-6 * r.mean()
    assert res.fallbacks == [{"op": "fwsvd", "kind": "row-weight-floor", "rows": int((r < floor).sum())}]
    assert res.fallbacks[0]["rows"] == 3
    # the floored weights define the factorisation: trunc_k(diag(r) W) with r floored, undone
    rf = np.maximum(r, floor)
    U, s, Vt = np.linalg.svd(rf[:, None] * W.float().double().numpy(), full_matrices=False)
    k = res.k_sites["s"]
    want = (U[:, :k] * s[:k]) @ Vt[:k] / rf[:, None]
    A, B = res.factors["s"]
    assert np.allclose((A.double() @ B.double()).numpy(), want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_fwsvd_without_any_gradient_is_the_plain_svd_and_says_so():
    """A site no gradient reaches (Doge's dt_proj feeds a top-k mask) has an all-zero row Fisher: FWSVD is then
    the plain SVD, recorded, never diag(0)^-1."""
    W = _w()
    zero = GroupStats(row_fisher={"s": torch.zeros(W.shape[0], dtype=torch.float64)})
    res = methods.get_method("fwsvd")().compress(FakeGroup({"s": W.float()}), zero, RankSpec(0.4))
    plain = methods.get_method("svd")().compress(FakeGroup({"s": W.float()}), GroupStats(), RankSpec(0.4))
    assert res.fallbacks == [{"op": "fwsvd", "kind": "row-weight-floor: all zero, unweighted", "rows": W.shape[0]}]
    got, want = (r.factors["s"][0].double() @ r.factors["s"][1].double() for r in (res, plain))
    assert torch.allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(12, 5), (5, 12), (6, 6)])
def test_truncated_factors_is_the_truncated_svd(dtype, shape):
    from acbench.methods.svd import truncated_factors

    gen = torch.Generator().manual_seed(7)
    # singular values spread over four decades: a float32 Gram matrix (cond squared) would lose the small ones
    U, _ = torch.linalg.qr(torch.randn(shape[0], shape[0], generator=gen, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(shape[1], shape[1], generator=gen, dtype=torch.float64))
    n = min(shape)
    sig = torch.logspace(0, -4, n, dtype=torch.float64)
    M = (U[:, :n] * sig) @ V[:, :n].T
    k = n - 1
    A, B = truncated_factors(M.to(dtype), k)
    assert A.dtype == dtype and A.shape == (shape[0], k) and B.shape == (k, shape[1])
    want = (U[:, :k] * sig[:k]) @ V[:, :k].T
    err = ((A.double() @ B.double()) - want).norm() / want.norm()
    assert err <= (1e-12 if dtype == torch.float64 else 2e-6), float(err)
    # the kept directions' smallest singular value survives (1e-4 x the largest), in either precision
    got_sig = torch.linalg.svdvals(A.double() @ B.double())
    assert torch.allclose(got_sig[:k], sig[:k], rtol=1e-3 if dtype == torch.float32 else 1e-10)


def test_teal_refuses_an_n_of_m_pattern_itself():
    from acbench.methods.teal import Teal

    pattern = SparsitySpec.parse("2:4")
    with pytest.raises(ValueError, match="cannot be an N:M pattern"):
        Teal().compress(FakeGroup({"s": _w()}), GroupStats(), pattern)


@pytest.mark.parametrize("method", methods.known_methods())
def test_capabilities_answer_on_the_class_and_on_an_instance(method):
    cls = methods.get_method(method)
    needs = cls.needs
    want = {"data_free": not cls().required_stats(), "activations": bool(needs & {"C", "abs_mean", "mean", "abs_hist", "act_hist"}),
            "gradients": bool(needs & {"F", "pairs", "row_fisher"})}
    assert cls.capabilities() == want == cls().capabilities()


def test_in_sample_swaps_end_at_a_local_optimum_below_the_start():
    from acbench.methods.fasc import coupled_selection

    gen = torch.Generator().manual_seed(11)
    d = 7
    R = torch.randn(d, d, generator=gen, dtype=torch.float64)
    Q = R @ R.T
    discard = torch.tensor([0, 1, 2])

    def f(mask):
        v = mask.to(torch.float64)
        return float(v @ Q @ v)

    start = torch.zeros(d, dtype=torch.bool)
    start[discard] = True
    in_D, swaps = coupled_selection(Q, discard, max_swaps=50)
    assert swaps > 0 and in_D.sum() == 3 and f(in_D) < f(start)
    for i in torch.nonzero(in_D).flatten():  # no single swap improves the end point
        for j in torch.nonzero(~in_D).flatten():
            other = in_D.clone()
            other[i], other[j] = False, True
            assert f(other) >= f(in_D) - 1e-12


@pytest.mark.parametrize("method", methods.known_methods("low-rank"))
def test_a_float32_solve_is_the_float64_solve_to_float32_precision(method):
    """--solve-dtype float32: every statistic, weight and draw in float32 (a float64 tensor left in the solve
    would stop it with a dtype error), the product within float32 rounding of the float64 one."""
    comp = methods.get_method(method)()
    group = FakeGroup({"s": _w().float()})
    got = {}
    for dtype in (torch.float64, torch.float32):
        res = comp.compress(group, _stats(), RankSpec(0.4), dtype=dtype)
        A, B = res.factors["s"]
        got[dtype] = A.double() @ B.double()
    assert (got[torch.float32] - got[torch.float64]).norm() <= 1e-3 * got[torch.float64].norm()


@pytest.mark.parametrize("per_site", [False, True])
def test_whitened_svd_records_a_rank_deficient_C(per_site):
    xs = torch.randn(6, D, generator=torch.Generator().manual_seed(2), dtype=torch.float64)  # 6 tokens < d = 10
    st = GroupStats(n_tokens=6, C=xs.T @ xs / 6)
    comp = methods.get_method("whitened-svd").from_options({"per_site": per_site})
    res = comp.compress(FakeGroup({"s": _w().float()}), st, RankSpec(0.4))
    assert [f["kind"] for f in res.fallbacks][:1] == ["rank-deficient"] and res.fallbacks[0]["rank"] == 6


def test_shared_solves_are_memoised_under_the_names_the_plan_prices():
    """bench plan prices each memoised per-group solve once, by its memo key (acbench.methods.base.basis_ops); the solves
    must store themselves under those keys, or a sweep would be priced for one solve and pay another."""
    from acbench.core.linalg import fisher_basis, group_whitening, pca_basis
    from acbench.methods.base import basis_ops

    st = _stats()
    first = {"pca_basis": pca_basis(st), "whitening": group_whitening(st), "fisher_basis": fisher_basis(st)}
    assert set(st.memo) == set(first)
    assert {key.split()[0] for key in basis_ops(D)} == set(first)
    for key, value in first.items():
        assert st.memo[key] is value
    assert pca_basis(st) is first["pca_basis"] and fisher_basis(st) is first["fisher_basis"]


def test_pca_basis_solves_in_the_stats_precision_whatever_c_holds():
    from acbench.core.linalg import pca_basis

    st = _stats()
    st32 = GroupStats(n_tokens=st.n_tokens, C=st.C.float())  # a float32 C handed in: solved in float64 all the same
    sol = pca_basis(st32)
    assert sol["lam"].dtype == torch.float64 and sol["U"].dtype == torch.float64
    ref = torch.linalg.eigvalsh(st.C.float().double()).flip(0)
    assert torch.allclose(sol["lam"], ref, rtol=1e-12, atol=1e-12)


def test_rank_spec_refusals_floor_and_alignment():
    with pytest.raises(ValueError, match=r"^budget 'flops' is unknown: use rank or params$"):
        RankSpec(0.5, budget="flops")
    with pytest.raises(ValueError, match=r"^rank alignment must be >= 1$"):
        RankSpec(0.5, align=0)
    assert RankSpec(0.01).k_group(10, (10,)) == 1  # round(0.1) = 0, floored at one direction
    assert RankSpec(0.3).k_group(10, (10,)) == 3
    assert RankSpec(0.3, align=2).k_group(10, (10,)) == 4  # 3 rounded up to a multiple of 2
    assert RankSpec(0.3, align=4).k_group(10, (10,)) == 4 and RankSpec(0.9, align=4).k_group(10, (10,)) == 10


def test_stats_on_a_float32_solve_recasts_the_moments_not_the_token_sample():
    st = _stats()
    st.xs = torch.randn(5, D, dtype=torch.float32)
    assert st.on("cpu") is st  # float64 on the host: nothing to move
    st32 = st.on("cpu", torch.float32)
    assert st32 is not st and st32.solve_dtype == torch.float32
    assert st32.C.dtype == torch.float32 and st32.F.dtype == torch.float32 and st32.xs.dtype == torch.float32
    assert all(t.dtype == torch.float32 for t in st32.row_fisher.values())
    assert torch.equal(st32.C, st.C.float()) and st.C.dtype == torch.float64  # the original is untouched
    assert st32.memo is st.memo["on cpu torch.float32"]
    with pytest.raises(ValueError, match=r"^solves run in float64 or float32, not torch.float16$"):
        st.on("cpu", torch.float16)
    st.xs = st.xs.double()  # a token sample is never recast, whatever precision it holds
    assert st.on("cpu", torch.float32).xs.dtype == torch.float64


def test_weighted_subspace_passes_its_damping_on_and_solves_in_the_whitening_precision():
    """eps reaches the whitening it builds; F and a factor of F given in float32 are solved in float64 all the same
    (the whitening factor's dtype), equal to the float64 solve to float32 rounding."""
    from acbench.core.linalg import weighted_subspace, whitening_factor

    st = _stats()
    damped = weighted_subspace(st.C, F=st.F, eps=0.1)
    ref = weighted_subspace(st.C, F=st.F, whitening=whitening_factor(st.C, 0.1))
    assert torch.equal(damped["lam"], ref["lam"]) and torch.equal(damped["U"], ref["U"])
    assert not torch.allclose(damped["lam"], weighted_subspace(st.C, F=st.F)["lam"], rtol=1e-4)
    base = weighted_subspace(st.C, F=st.F)
    f32 = weighted_subspace(st.C, F=st.F.float())
    assert f32["lam"].dtype == torch.float64 and torch.allclose(f32["lam"], base["lam"], rtol=1e-5)
    R = torch.linalg.cholesky(st.F).T  # F = R^T R
    for m_rows in (R, R[:6]):  # square (m = d) and wide (m < d) factors
        by_factor = weighted_subspace(st.C, F_factor=m_rows.float())
        by_f = weighted_subspace(st.C, F=(m_rows.T @ m_rows))
        assert by_factor["lam"].dtype == torch.float64
        assert torch.allclose(by_factor["lam"], by_f["lam"], rtol=1e-4, atol=1e-6 * float(by_f["lam"][0]))


def test_damping_whitening_and_rank_tolerance_by_hand():
    """damp adds eps times C's mean diagonal (1 where that is not positive) to the diagonal, in C's precision;
    the whitening factor satisfies S S^T = C + that damping in the requested precision; an eigenvalue at the rank
    tolerance (eps of the dtype times d, at least 1e-10, relative to the top one) counts as zero."""
    from acbench.core.linalg import damp, rank_tolerance, tiny, whitening_factor

    # the divisor floor: 1e-300 in float64; in float32, where 1e-300 rounds to 0, its smallest normal number
    assert tiny(torch.float64) == 1e-300 and tiny(torch.float32) == torch.finfo(torch.float32).tiny
    assert float(torch.zeros(1).clamp_min(tiny(torch.float32))) > 0
    C = _stats().C
    scale = float(torch.trace(C)) / D
    assert scale != 1.0
    assert torch.equal(damp(C, 1e-6), C + (1e-6 * scale) * torch.eye(D, dtype=torch.float64))
    half = torch.diag(torch.full((D,), 0.5, dtype=torch.float64))  # mean diagonal 0.5: below 1, still positive
    assert torch.equal(damp(half, 0.1), half + 0.05 * torch.eye(D, dtype=torch.float64))
    zero = torch.zeros(D, D, dtype=torch.float64)
    assert torch.equal(damp(zero, 1e-3), 1e-3 * torch.eye(D, dtype=torch.float64))
    assert rank_tolerance(torch.float64, 10) == 1e-10
    assert rank_tolerance(torch.float32, 100) == pytest.approx(torch.finfo(torch.float32).eps * 100, rel=1e-12)
    S, Sinv, fallbacks = whitening_factor(C.float())  # a float32 C is whitened in float64
    assert S.dtype == torch.float64 and fallbacks == []
    C64 = C.float().double()
    assert torch.allclose(S @ S.T, damp(C64, 1e-6), rtol=1e-12, atol=1e-12)
    assert torch.allclose(Sinv @ S, torch.eye(D, dtype=torch.float64), atol=1e-10)
    two = torch.diag(torch.tensor([1.0, 1e-10], dtype=torch.float64))
    _, _, fb = whitening_factor(two, evals=torch.tensor([1e-10, 1.0], dtype=torch.float64))
    assert fb[0] == {"op": "whiten", "kind": "rank-deficient", "rank": 1, "d": 2,
                     "note": "C has numerical rank 1 < d; directions outside its range are set by damping eps=1e-06"}


@pytest.mark.parametrize("neg,eps_at", [(-1e-5, 1e-4), (-0.03, 0.1)])
def test_cholesky_damping_escalates_by_tens_up_to_max_eps(neg, eps_at):
    """An indefinite C: the damping grows tenfold from eps until Cholesky succeeds, MAX_EPS (0.1) included, and the
    eps it took is recorded."""
    from acbench.core.linalg import MAX_EPS, damp, whitening_factor

    assert MAX_EPS == 0.1
    C = torch.diag(torch.tensor([1.0, neg], dtype=torch.float64))
    S, _, fallbacks = whitening_factor(C)
    assert [f for f in fallbacks if f["op"] == "cholesky"] == [
        {"op": "cholesky", "kind": "damping-escalated", "eps": pytest.approx(eps_at, rel=1e-9)}]
    assert torch.allclose(S @ S.T, damp(C, eps_at), rtol=1e-12, atol=1e-15)


def test_eigh_fallback_floors_eigenvalues_at_eps_times_the_mean_diagonal():
    """Cholesky fails at every damping up to MAX_EPS: S = U sqrt(w) from eigh, each eigenvalue floored at eps times
    C's mean diagonal (here 4.5e-6), and the fallback is recorded."""
    from acbench.core.linalg import whitening_factor

    C = torch.diag(torch.tensor([10.0, -1.0], dtype=torch.float64))
    S, Sinv, fallbacks = whitening_factor(C)
    assert fallbacks[-1] == {"op": "cholesky", "kind": "eigh-fallback", "eps": 1e-6}
    w = torch.linalg.eigvalsh(S @ S.T)
    assert float(w[0]) == pytest.approx(1e-6 * 4.5, rel=1e-9) and float(w[1]) == pytest.approx(10 + 1e-6 * 4.5)
    assert torch.allclose(Sinv @ S, torch.eye(2, dtype=torch.float64), atol=1e-9)


@pytest.mark.parametrize("method,stat", [("teal", "abs_hist"), ("wanda", "C")])
def test_a_sparsity_method_refuses_a_non_finite_statistic_naming_itself(method, stat):
    """teal's threshold and wanda's channel norms refuse a NaN in what they read, as the low-rank solves do."""
    from acbench.core.linalg import NumericError
    from acbench.core.stats import magnitude_histogram

    st = _stats(16)
    hist = magnitude_histogram(st.xs.reshape(-1))
    st.abs_hist = hist / hist.sum()
    with pytest.raises(NumericError) as e:
        methods.get_method(method)().compress(FakeGroup({"s": _w(7, 16).float()}), poisoned(st, stat),
                                              SparsitySpec.parse("0.5"))
    assert str(e.value).startswith(f"non-finite {stat} statistics in {method}: recalibrate")
