"""The method interface (methods/base.py) on shapes worked out by hand: each result type's parameter, compute and
activation ratios and its whole summary; what `Compressor.compress` hands a method's solve (the k from the rank
or an allocation, clamped; the weights and statistics in the solve precision) and what it returns (float32
factors, the solve's fallbacks and extras); the sparsity family's refusals, each one line."""

import dataclasses

import pytest
import torch

from acbench.core.errors import UserError
from acbench.core.stats import GroupStats, RankSpec, SparsitySpec
from acbench.methods.base import (Compressor, GroupCompression, MaskedWeights, SparseActivation, SparsityMethod,
                          factorised_params, stacked_column_norms)

from test_sparsity import fake_group


def test_factorised_params_one_shared_b_or_one_per_site():
    # d_in 8, sites of 4 and 12 outputs, k 2 and 3: A's are 4x2 + 12x3 = 44; one B 2x8, or B's 2x8 + 3x8
    assert factorised_params(8, (4, 12), (2, 3), shared=True) == 44 + 16
    assert factorised_params(8, (4, 12), (2, 3), shared=False) == 44 + 40


def _factors(ks, d_outs=(4, 12), d_in=8):
    return {f"s{i}": (torch.zeros(d, k), torch.zeros(k, d_in)) for i, (d, k) in enumerate(zip(d_outs, ks))}


def test_group_compression_summary_in_full():
    extras = {"swaps": 3, "gain": 0.5, "note": "x", "basis": torch.zeros(2), "path": [1, 2]}
    res = GroupCompression(group="g", method="pca", k=2, factors=_factors((2, 2)), shared_projection=True, d_in=8,
                           d_outs=(4, 12), fallbacks=[{"what": "damping"}], extras=extras)
    assert res.form == "factorised"  # 2 x 8 + 16 x 2 = 48 < 128
    assert res.summary() == {
        "group": "g", "result": "factors", "k": 2, "k_sites": {"s0": 2, "s1": 2}, "d_in": 8, "form": "factorised",
        "params_dense": 128, "params_deployed": 48, "param_ratio": 48 / 128, "compute_ratio": 48 / 128,
        "activation_ratio": 2 / 8, "fallbacks": [{"what": "damping"}], "swaps": 3, "gain": 0.5, "note": "x"}


def test_group_compression_form_and_ratios_at_the_break_even():
    # one site 8 x 8: k 4 costs 4 x 8 + 8 x 4 = 64 = dense, so it stays merged (no gain from factors); k 3 is 48
    even = GroupCompression(group="g", method="pca", k=4, factors=_factors((4,), (8,)), shared_projection=True,
                            d_in=8, d_outs=(8,))
    assert (even.form, even.params_factorised, even.params_deployed) == ("merged", 64, 64)
    assert (even.compute_ratio, even.activation_ratio) == (1.0, 1.0)
    below = GroupCompression(group="g", method="pca", k=3, factors=_factors((3,), (8,)), shared_projection=True,
                             d_in=8, d_outs=(8,))
    assert (below.form, below.params_deployed, below.compute_ratio, below.activation_ratio) == (
        "factorised", 48, 48 / 64, 3 / 8)
    # per-site factors each read the whole x; a form given is kept
    own = GroupCompression(group="g", method="svd", k=3, factors=_factors((3, 1)), shared_projection=False,
                           d_in=8, d_outs=(4, 12))
    assert (own.form, own.k_sites, own.params_deployed, own.activation_ratio) == (
        "factorised", {"s0": 3, "s1": 1}, 4 * 3 + 12 + 4 * 8, 1.0)
    kept = GroupCompression(group="g", method="pca", k=3, factors=_factors((3,), (8,)), shared_projection=True,
                            d_in=8, d_outs=(8,), form="merged")
    assert (kept.form, kept.params_deployed, kept.activation_ratio) == ("merged", 64, 1.0)


def test_sparse_activation_summary_in_full():
    res = SparseActivation(pattern=SparsitySpec.parse("2:8"), group="g", method="act-sparse", d_in=16,
                           d_outs=(4, 12), fallbacks=[{"what": "x"}], extras={"density": 0.25, "t": torch.ones(1)},
                           mitigation="shift")
    assert res.params_dense == 256
    assert res.summary() == {
        "group": "g", "result": "sparse-activation", "form": "sparse-activation", "pattern": "2:8",
        "density": 0.25, "kept_per_token": 4, "d_in": 16, "params_dense": 256, "params_deployed": 256,
        "param_ratio": 1.0, "compute_ratio": 0.25, "activation_ratio": 0.25, "fallbacks": [{"what": "x"}],
        "mitigation": "shift", "index_bits_per_token": 2 * 5}  # ceil(log2 C(8, 2)) = 5 per block of 8


def test_masked_weights_summary_in_full():
    masks = {"a": torch.zeros(4, 8, dtype=torch.bool), "b": torch.zeros(12, 8, dtype=torch.bool)}
    masks["a"][:, :2] = True
    masks["b"][:, 4:8] = True
    res = MaskedWeights(pattern=SparsitySpec.parse("0.375"), group="g", method="wanda", d_in=8, d_outs=(4, 12),
                        masks=masks, extras={"n": 1})
    kept = 4 * 2 + 12 * 4
    assert res.summary() == {
        "group": "g", "result": "masked-weights", "form": "masked-weights", "pattern": "unstructured",
        "density": 0.375, "kept_per_token": 3, "d_in": 8, "params_dense": 128, "params_deployed": kept,
        "param_ratio": kept / 128, "compute_ratio": kept / 128, "activation_ratio": 1.0, "fallbacks": [], "n": 1}


class Spy(Compressor):
    """Records what compress hands its solve; returns float64 factors of the k it was given."""

    name = "spy"
    seen: dict = {}

    def solve(self, weights, stats, k):
        Spy.seen = {"weights": weights, "stats": stats, "k": k}
        ks = k if isinstance(k, dict) else {n: k for n in weights}
        factors = {n: (torch.ones(W.shape[0], ks[n], dtype=torch.float64), torch.ones(ks[n], W.shape[1],
                                                                                     dtype=torch.float64))
                   for n, W in weights.items()}
        return factors, not isinstance(k, dict), [{"what": "damping"}], {"swaps": 2}


class SiteSpy(Spy):
    name = "site-spy"
    per_site = True


def _group():
    gen = torch.Generator().manual_seed(0)
    return fake_group({"a": torch.randn(6, 10, generator=gen), "b": torch.randn(20, 10, generator=gen)})


def test_compress_hands_the_solve_the_rank_k_in_the_solve_precision():
    g, st = _group(), GroupStats(C=torch.eye(10, dtype=torch.float64))
    res = Spy().compress(g, st, RankSpec(0.5))
    assert Spy.seen["k"] == 5  # round(0.5 x d_in)
    assert all(W.dtype == torch.float64 for W in Spy.seen["weights"].values())
    assert torch.equal(Spy.seen["weights"]["b"], g.sites[1].weight.double())
    assert Spy.seen["stats"].C.dtype == torch.float64
    assert (res.group, res.method, res.k, res.shared_projection, res.d_in, res.d_outs) == ("g", "spy", 5, True, 10,
                                                                                           (6, 20))
    assert (res.fallbacks, res.extras) == ([{"what": "damping"}], {"swaps": 2})
    assert all(A.dtype == B.dtype == torch.float32 for A, B in res.factors.values())
    Spy().compress(g, st, RankSpec(0.5), dtype=torch.float32)
    assert Spy.seen["weights"]["a"].dtype == Spy.seen["stats"].C.dtype == torch.float32
    Spy().compress(g, st, RankSpec(0.5), device="meta")  # the solve device: weights and statistics moved there
    assert Spy.seen["weights"]["a"].device.type == Spy.seen["stats"].C.device.type == "meta"


@pytest.mark.parametrize("k, want", [(3, 3), (3.9, 3), (0, 1), (-2, 1), (10, 10), (11, 10)])
def test_compress_takes_an_allocations_k_clamped_to_one_and_d_in(k, want):
    res = Spy().compress(_group(), GroupStats(), RankSpec(0.5), k=k)
    assert Spy.seen["k"] == want and res.k == want


def test_a_per_site_method_gets_each_sites_own_k():
    res = SiteSpy().compress(_group(), GroupStats(), RankSpec(0.5, budget="params"))
    # floor(0.5 x 10 x d_out / (10 + d_out)): 6 -> 1 (1.875), 20 -> 3 (3.33)
    want = {"a": RankSpec(0.5, budget="params").k_site(10, 6), "b": RankSpec(0.5, budget="params").k_site(10, 20)}
    assert Spy.seen["k"] == want == res.k_sites
    assert res.k == max(want.values()) and not res.shared_projection
    assert SiteSpy().site_wise and not SiteSpy().projection and Spy().projection


def test_compress_refusals_name_the_method_and_the_fix():
    with pytest.raises(TypeError) as err:
        Spy().compress(_group(), GroupStats(), SparsitySpec.parse("2:4"))
    assert str(err.value).startswith("spy is a low-rank method: it takes a rank ratio (--rank), not SparsitySpec(")
    with pytest.raises(ValueError) as err:
        SiteSpy().compress(_group(), GroupStats(), RankSpec(0.5), k=2)
    assert str(err.value) == "site-spy factorises each site on its own: a per-group k does not apply"


class SparseSpy(SparsityMethod):
    name = "sparse-spy"

    def solve(self, weights, stats, pattern):
        SparseSpy.seen = {"weights": weights, "stats": stats}
        return SparseActivation(pattern=pattern, group="not this", method="nor this")


def test_sparsity_compress_fills_the_result_and_refuses_the_rest():
    g = _group()
    res = SparseSpy().compress(g, GroupStats(C=torch.eye(10, dtype=torch.float64)), SparsitySpec.parse("0.5"),
                               dtype=torch.float32)
    assert (res.group, res.method, res.d_in, res.d_outs) == ("g", "sparse-spy", 10, (6, 20))
    # the family's scores are elementwise and always in float64, whatever dtype is asked for
    assert SparseSpy.seen["weights"]["a"].dtype == SparseSpy.seen["stats"].C.dtype == torch.float64
    assert not SparseSpy().projection
    SparseSpy().compress(g, GroupStats(C=torch.eye(10, dtype=torch.float64)), SparsitySpec.parse("0.5"), device="meta")
    assert SparseSpy.seen["weights"]["b"].device.type == SparseSpy.seen["stats"].C.device.type == "meta"
    with pytest.raises(TypeError) as err:
        SparseSpy().compress(g, GroupStats(), RankSpec(0.5))
    assert str(err.value).startswith("sparse-spy is a sparsity method: it takes an N:M pattern or density "
                                     "(--sparsity), not RankSpec(")
    with pytest.raises(ValueError) as err:
        SparseSpy().compress(g, GroupStats(), SparsitySpec.parse("0.5"), k=3)
    assert str(err.value) == "sparse-spy keeps a pattern per token: a per-group k does not apply"
    with pytest.raises(UserError, match="cannot split group g"):
        SparseSpy().compress(g, GroupStats(), SparsitySpec.parse("2:4"))
    with pytest.raises(TypeError) as err:
        SparseSpy().rank_for(g, RankSpec(0.5))
    assert str(err.value) == "sparse-spy is a sparsity method: it has no rank"
    assert SparseSpy.pattern_problem(SparsitySpec.parse("2:4")) is None


def test_capabilities_on_the_class_use_the_default_settings():
    """A method whose needs depend on a setting: on the class, capabilities are its default instance's."""

    @dataclasses.dataclass(frozen=True)
    class Settings:
        gradients: bool = False

    class Switch(Spy):
        name = "switch"

        def required_stats(self):
            return frozenset({"F"} if self.settings.gradients else {"C"})

    Switch.Settings = Settings
    assert Switch.capabilities() == {"data_free": False, "activations": True, "gradients": False}
    assert Switch(Settings(gradients=True)).capabilities() == {"data_free": False, "activations": False,
                                                               "gradients": True}
    assert Spy.capabilities() == {"data_free": True, "activations": False, "gradients": False}


def test_stacked_column_norms_by_hand():
    a = torch.tensor([[3.0, 0.0], [0.0, 1.0]])
    b = torch.tensor([[4.0, 2.0]])
    assert torch.allclose(stacked_column_norms({"a": a, "b": b}), torch.tensor([5.0, 5.0 ** 0.5]))


def test_cost_declarations_by_hand():
    """What `bench plan` prices a solve by (methods/base.py's helpers), on d_in 8, sites of 4 and 12, k 2."""
    from acbench.methods.base import basis_ops, factor_svd_ops, projection_ops, site_svd_ops

    assert projection_ops(8, (4, 12), 2) == [("", "flops", 2 * 16 * 8 * 2)]  # A_i = W_i U_k, a multiply-add 2 flops
    assert site_svd_ops(8, (4, 12)) == [("", "truncated_svd", 4, 8), ("", "truncated_svd", 12, 8)]
    # a Cholesky and its triangular inverse: 2 d^3 / 3 flops, a whole number
    assert basis_ops(10) == {"pca_basis": ("pca_basis", "eigh", 10), "whitening": ("whitening", "flops", 666),
                             "fisher_basis products": ("fisher_basis products", "flops", 8000),
                             "fisher_basis eigh": ("fisher_basis eigh", "eigh", 10)}
    assert type(basis_ops(10)["whitening"][2]) is int
    assert factor_svd_ops(10, 10, 5) == [("", "truncated_svd", 10, 10)]  # m >= d: R^T R's eigh
    assert factor_svd_ops(6, 10, 6) == [("", "svd", 6, 10)]  # keep inside R's row space: the thin SVD
    assert factor_svd_ops(6, 10, 7) == [("", "svd", 6, 10), ("", "flops", 4 * 100 * 6)]  # and the square V


class ReturnsAsTold(SparsityMethod):
    """A sparsity method returning whatever SparseActivation fields the test hands it."""

    name = "as-told"
    fields: dict = {}

    def solve(self, weights, stats, pattern):
        return SparseActivation(pattern=pattern, **type(self).fields)


@pytest.mark.parametrize("fields,problem", [
    ({"threshold": 0.5, "mitigation": "shift", "mu": torch.zeros(10)},
     "a threshold together with mitigation 'shift': a threshold keeps |x_j| * scale_j > threshold and applies no "
     "mitigation; return mitigation='none' with the threshold, or a top-k pattern without it"),
    ({"threshold": 0.5, "mitigation": "median"}, "a threshold together with mitigation 'median'"),
    ({"threshold": 0.5, "mitigation": "variance"}, "a threshold together with mitigation 'variance'"),
    ({"mitigation": "shfit"}, "mitigation 'shfit' is not one of none, variance, shift, median"),
    ({"mitigation": "shift"}, "mitigation 'shift' without mu: return the calibrated per-channel mean as mu"),
    ({"scale": torch.ones(4)}, "scale has shape (4,), not (10,): one factor per input channel"),
    ({"mitigation": "shift", "mu": torch.ones(10, 1)}, "mu has shape (10, 1), not (10,): one factor per input channel"),
])
def test_a_result_no_layer_can_deploy_whole_is_refused_in_one_line(fields, problem, monkeypatch):
    monkeypatch.setattr(ReturnsAsTold, "fields", fields)
    with pytest.raises(UserError) as err:
        ReturnsAsTold().compress(_group(), GroupStats(), SparsitySpec.parse("0.5"))
    line = str(err.value)
    assert line.startswith(f"method as-told (group g) returned {problem}") and "\n" not in line


@pytest.mark.parametrize("fields", [
    {"threshold": 0.5}, {"threshold": 0.5, "scale": torch.ones(10)}, {"scale": torch.ones(10), "mitigation": "median"},
    {"mitigation": "shift", "mu": torch.zeros(10), "scale": torch.ones(10)}, {"mitigation": "variance"}])
def test_every_combination_a_layer_honours_is_accepted(fields, monkeypatch):
    monkeypatch.setattr(ReturnsAsTold, "fields", fields)
    res = ReturnsAsTold().compress(_group(), GroupStats(), SparsitySpec.parse("0.5"))
    assert res.deployment_problem() is None and res.threshold == fields.get("threshold")


def test_floored_raises_what_is_below_the_floor_and_records_how_many():
    from acbench.methods.svd import floored

    fallbacks = []
    v = torch.tensor([0.0, 1e-7, 1e-6, 1.0, 2.0], dtype=torch.float64)  # mean 0.6000002: floor 6.000002e-7
    floor = 1e-6 * float(v.mean())
    got = floored(v, "op", "kind", "channels", fallbacks)
    assert torch.equal(got, torch.tensor([floor, floor, 1e-6, 1.0, 2.0], dtype=torch.float64))
    assert fallbacks == [{"op": "op", "kind": "kind", "channels": 2}]
    at = torch.tensor([1.0, 1.0], dtype=torch.float64)  # an entry exactly at the floor (rel = 1) is not raised
    assert torch.equal(floored(at, "op", "kind", "channels", fallbacks, rel=1.0), at) and len(fallbacks) == 1
    zeros = torch.zeros(3, dtype=torch.float64)  # all zero: nothing to weigh by, every entry 1 (the plain SVD)
    assert torch.equal(floored(zeros, "op", "kind", "rows", fallbacks), torch.ones(3, dtype=torch.float64))
    assert fallbacks[-1] == {"op": "op", "kind": "kind: all zero, unweighted", "rows": 3}
    tiny = torch.tensor([0.0, 1e-300], dtype=torch.float64)  # one positive entry: floored as usual
    assert float(floored(tiny, "op", "kind", "rows", fallbacks)[1]) == 1e-300 and fallbacks[-1]["rows"] == 1


def test_scaled_truncated_factors_is_the_scaled_svd_unscaled():
    from acbench.methods.svd import scaled_truncated_factors

    gen = torch.Generator().manual_seed(3)
    W = torch.randn(6, 5, generator=gen, dtype=torch.float64)
    s, r = torch.rand(5, generator=gen, dtype=torch.float64) + 0.5, torch.rand(6, generator=gen, dtype=torch.float64) + 0.5
    for inputs, outputs in ((s, None), (None, r), (s, r), (None, None)):
        M = W * (1 if inputs is None else inputs)
        M = M * (1 if outputs is None else outputs[:, None])
        U, sig, Vh = torch.linalg.svd(M, full_matrices=False)
        want = (U[:, :2] * sig[:2]) @ Vh[:2]
        want = want / (1 if inputs is None else inputs) / (1 if outputs is None else outputs[:, None])
        A, B = scaled_truncated_factors(W, 2, inputs=inputs, outputs=outputs)
        assert A.shape == (6, 2) and B.shape == (2, 5)
        assert torch.allclose(A @ B, want, atol=1e-12)
