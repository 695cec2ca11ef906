"""Core: rank semantics, each method's optimality on its own objective, fallbacks, parameter accounting."""

import itertools
import math

import pytest
import torch

from acbench import methods
from acbench.deploy.apply import apply_compression
from acbench.model.checkpoint import load_checkpoint, write_checkpoint
from acbench.calibration.engine import CalibSpec, calibrate, next_token_loss_sum
from acbench.core.errors import did_you_mean
from acbench.model.groups import find_input_groups
from acbench.core.linalg import NumericError, whitening_factor
from acbench.core.stats import GroupStats, RankSpec
from acbench.methods.fasc import coupled_selection

from conftest import tiny_model

ALL_STATS = frozenset({"C", "F", "pairs", "abs_mean", "row_fisher"})


def compress_model(model, stats, name, ratio):
    comp = methods.get_method(name)()
    results = []
    for g in find_input_groups(model):
        res = comp.compress(g, stats[g.name], RankSpec(ratio))
        apply_compression(model, g, res)
        results.append(res)
    return results


@pytest.mark.parametrize("name", methods.known_methods("low-rank"))
def test_rank_one_reproduces_dense(arch, windows, name):
    model = tiny_model(arch)
    dense = model(windows).logits
    stats = calibrate(model, find_input_groups(model), windows, ALL_STATS, CalibSpec(pair_tokens=64), progress=False)
    compress_model(model, stats, name, 1.0)
    assert (model(windows).logits - dense).abs().max().item() < 1e-4


def random_stats(d=8, n=400, seed=0, coupled=True):
    gen = torch.Generator().manual_seed(seed)
    mix = torch.randn(d, d, generator=gen, dtype=torch.float64)
    xs = torch.randn(n, d, generator=gen, dtype=torch.float64) @ mix
    gs = torch.randn(n, d, generator=gen, dtype=torch.float64) @ torch.randn(d, d, generator=gen, dtype=torch.float64)
    if coupled:
        a, b = torch.randn(d, generator=gen, dtype=torch.float64), torch.randn(d, generator=gen, dtype=torch.float64)
        gs = gs + (xs @ a)[:, None] * b[None, :]
    return GroupStats(n_tokens=n, C=xs.T @ xs / n, F=gs.T @ gs / n, xs=xs, gs=gs, abs_mean=xs.abs().mean(0))


def fisher_objective(P, C, F):
    E = torch.eye(C.shape[0], dtype=torch.float64) - P
    return float(torch.trace(E.T @ F @ E @ C))


def projection_of(res, weights):
    """Recover P (d x d) from a shared-projection result: B is shared and U_k = W^+ A is not needed;
    we rebuild P from the method's own B and the kept basis via least squares on the first site."""
    A, B = next(iter(res.factors.values()))
    W = next(iter(weights.values()))
    U = torch.linalg.lstsq(W.double(), A.double()).solution
    return U @ B.double()


class FakeGroup:
    def __init__(self, weights):
        from torch import nn

        self.name = "g"
        self.site_names = tuple(weights)
        self.sites = []
        for W in weights.values():
            lin = nn.Linear(W.shape[1], W.shape[0], bias=False)
            with torch.no_grad():
                lin.weight.copy_(W)
            self.sites.append(lin)

    @property
    def d_in(self):
        return self.sites[0].in_features

    @property
    def d_outs(self):
        return tuple(s.out_features for s in self.sites)


def random_projections(d, k, count=300, seed=1):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(count):
        U = torch.randn(d, k, generator=gen, dtype=torch.float64)
        V = torch.randn(d, k, generator=gen, dtype=torch.float64)
        yield U @ torch.linalg.pinv(V.T @ U) @ V.T  # an oblique rank-k projection


def brute_force_best(d, k, objective, basis):
    """Best projection among all k-subsets of a basis's directions (exhaustive on small d)."""
    U, Wt = basis
    return min(objective(U[:, list(s)] @ Wt[list(s)]) for s in itertools.combinations(range(d), k))


@pytest.mark.parametrize("name,weighting", [("pca", "identity"), ("whitened-svd", "output"), ("fasc-kfac", "fisher")])
def test_projection_minimises_its_objective(name, weighting):
    d, k = 8, 3
    st = random_stats(d)
    gen = torch.Generator().manual_seed(5)
    W = torch.randn(12, d, generator=gen)
    weights = {"site": W}
    Fw = {"identity": torch.eye(d, dtype=torch.float64), "output": W.double().T @ W.double(), "fisher": st.F}[weighting]
    res = methods.get_method(name)().compress(FakeGroup(weights), st, RankSpec(k / d))
    assert res.k == k
    P = projection_of(res, weights)
    best = fisher_objective(P, st.C, Fw)
    for Pr in random_projections(d, k):
        assert best <= fisher_objective(Pr, st.C, Fw) * (1 + 1e-6)
    # exhaustive over subsets of generalised eigen-directions of several weightings: none beats the method
    from acbench.core.linalg import weighted_subspace

    for other in (None, st.F, W.double().T @ W.double()):
        sol = weighted_subspace(st.C, F=other)
        brute = brute_force_best(d, k, lambda P: fisher_objective(P, st.C, Fw), (sol["U"], sol["Wt"]))
        assert best <= brute * (1 + 1e-6)


def test_whitened_svd_equals_svdllm_cholesky_formula():
    d, k = 10, 4
    st = random_stats(d, seed=3)
    W = torch.randn(7, d, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    res = methods.get_method("whitened-svd")().compress(FakeGroup({"s": W.float()}), st, RankSpec(k / d))
    A, B = res.factors["s"]
    ours = A.double() @ B.double()
    # SVD-LLM: S = cholesky(X X^T); SVD(W S); W' = U_k Sigma_k V_k^T S^-1
    S = torch.linalg.cholesky(st.C)
    U, sig, Vh = torch.linalg.svd(W.float().double() @ S, full_matrices=False)
    ref = U[:, :k] @ torch.diag(sig[:k]) @ Vh[:k] @ torch.linalg.inv(S)
    assert (ours - ref).norm() / ref.norm() < 1e-6


def test_fasc_never_worse_than_kfac_on_token_surrogate():
    for seed in range(4):
        st = random_stats(12, n=300, seed=seed)
        g = FakeGroup({"s": torch.randn(16, 12, generator=torch.Generator().manual_seed(seed))})
        kf = methods.get_method("fasc-kfac")().compress(g, st, RankSpec(0.5))
        fa = methods.get_method("fasc")().compress(g, st, RankSpec(0.5))

        def token_surrogate(res):
            P = projection_of(res, {"s": g.sites[0].weight.detach()})
            e = st.xs @ (torch.eye(12, dtype=torch.float64) - P).T
            return float(((st.gs * e).sum(1) ** 2).mean())

        assert token_surrogate(fa) <= token_surrogate(kf) * (1 + 1e-6) + 1e-12
        assert fa.extras["surrogate_tokens"] <= fa.extras["surrogate_tokens_kfac_choice"] + 1e-12
        assert fa.extras["surrogate_tokens"] == pytest.approx(token_surrogate(fa), rel=1e-5)


def test_coupled_selection_reaches_exhaustive_optimum_small():
    gen = torch.Generator().manual_seed(0)
    Z = torch.randn(50, 6, generator=gen, dtype=torch.float64)
    Q = Z.T @ Z / 50
    in_D, _ = coupled_selection(Q, torch.arange(3, 6), max_swaps=100)
    got = float(in_D.double() @ Q @ in_D.double())
    best = min(float(Q[list(s)][:, list(s)].sum()) for s in itertools.combinations(range(6), 3))
    assert got <= best + 0.5 * abs(best)  # local search: close to, and never worse than start
    start = float(Q[3:, 3:].sum())
    assert got <= start


def test_gradient_statistic_equals_autograd(windows):
    model = tiny_model("llama")
    groups = find_input_groups(model)
    stats = calibrate(model, groups, windows, frozenset({"F", "C"}), CalibSpec(), batch_size=3, progress=False)
    # direct: capture the input of layer 1's q_proj, retain its grad
    captured = {}
    site = model.model.layers[1].self_attn.q_proj
    h = site.register_forward_pre_hook(lambda m, a: captured.setdefault("x", a[0]).retain_grad())
    emb = model.get_input_embeddings().register_forward_hook(lambda m, a, o: o.requires_grad_(True))
    for p in model.parameters():
        p.requires_grad_(False)
    logits = model(windows).logits
    torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1),
                                      reduction="sum").backward()
    h.remove(), emb.remove()
    g = captured["x"].grad.reshape(-1, 32).double()
    F_direct = g.T @ g / g.shape[0]
    F_hook = stats["layers.1.attn_in"].F
    assert (F_hook - F_direct).abs().max() / F_direct.abs().max() < 1e-5


def test_loss_shifts_labels_once():
    logits = torch.zeros(1, 3, 5)
    logits[0, 0, 2] = 10.0  # position 0 predicts token at position 1
    ids = torch.tensor([[0, 2, 4]])
    loss = next_token_loss_sum(logits, ids)
    by_hand = torch.nn.functional.cross_entropy(logits[0, :2], ids[0, 1:], reduction="sum")
    assert torch.isclose(loss, by_hand)


def test_rank_deficient_calibration_records_fallback():
    model = tiny_model("llama", hidden=32, inter=48)
    few = torch.randint(0, 101, (1, 12), generator=torch.Generator().manual_seed(0))  # 12 tokens < d = 32
    stats = calibrate(model, find_input_groups(model), few, ALL_STATS, CalibSpec(pair_tokens=8), progress=False)
    for name in ["pca", "whitened-svd", "fasc", "fasc-kfac", "espace-nl", "asvd"]:
        results = compress_model(tiny_model("llama"), stats, name, 0.5)
        if name in ("whitened-svd", "fasc", "fasc-kfac"):  # the methods that invert C record it
            assert any(f["kind"] == "rank-deficient" for r in results for f in r.fallbacks)
        for r in results:
            for A, B in r.factors.values():
                assert torch.isfinite(A).all() and torch.isfinite(B).all()


def test_cholesky_failure_escalates_then_falls_back():
    C = -torch.eye(4, dtype=torch.float64)  # not PSD: no damping up to the cap rescues Cholesky
    S, Sinv, fallbacks = whitening_factor(C)
    assert fallbacks[-1]["kind"] == "eigh-fallback"
    assert torch.isfinite(S).all()
    C2 = torch.diag(torch.tensor([1.0, 1.0, 1.0, -1e-3], dtype=torch.float64))
    _, _, fb2 = whitening_factor(C2)
    assert any(f["kind"] == "damping-escalated" for f in fb2)


def test_nan_statistics_are_rejected():
    st = random_stats(6)
    st.F[0, 0] = float("nan")
    with pytest.raises(NumericError, match="non-finite F"):
        methods.get_method("fasc-kfac")().compress(FakeGroup({"s": torch.randn(4, 6)}), st, RankSpec(0.5))


def test_parameter_accounting(windows):
    model = tiny_model("llama", hidden=32, inter=96)
    stats = calibrate(model, find_input_groups(model), windows, frozenset({"C"}), CalibSpec(), progress=False)
    res = {r.group: r for r in compress_model(model, stats, "pca", 0.5)}
    o = res["layers.0.attn_out"]  # square 32 -> 32 at k = 16: 16*32 + 16*32 = dense: merged
    assert (o.form, o.params_dense, o.params_deployed) == ("merged", 1024, 1024)
    gu = res["layers.0.mlp_in"]  # 32 -> 2 x 96 at k = 16: 16*32 + 16*192 < 32*192: factorised
    assert gu.form == "factorised"
    assert gu.params_deployed == 16 * 32 + 16 * 192 < gu.params_dense == 32 * 192


def test_rank_semantics():
    assert RankSpec(0.5).k_group(640, (640,)) == 320
    assert RankSpec(0.5, align=64).k_group(600, (600,)) == 320
    assert RankSpec(0.5).k_site(640, 2048) == 320
    assert RankSpec(0.5, budget="params").k_group(640, (2048, 2048)) == math.floor(0.5 * 640 * 4096 / 4736)


# Gemma-3-270m's q/k/v group: d_in 640, q 1024, k 256, v 256 (grouped-query attention)
GQA = {"q_proj": 1024, "k_proj": 256, "v_proj": 256}


def gqa_group(d_in=640, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return FakeGroup({n: torch.randn(d, d_in, generator=gen) / d_in**0.5 for n, d in GQA.items()})


@pytest.mark.parametrize("name,options", [("svd", {}), ("asvd", {}), ("fwsvd", {}), ("whitened-svd", {"per_site": True})])
@pytest.mark.parametrize("budget,expected", [("rank", {"q_proj": 320, "k_proj": 128, "v_proj": 128}),
                                             ("params", {"q_proj": 196, "k_proj": 91, "v_proj": 91})])
def test_per_site_budget_on_grouped_query_attention(name, options, budget, expected):
    """k per site from the site's own shape: round(r min(d_in, d_out_i)) or floor(r d_in d_out_i / (d_in + d_out_i))."""
    group = gqa_group()
    d = group.d_in
    gen = torch.Generator().manual_seed(3)
    xs = torch.randn(2000, d, generator=gen, dtype=torch.float64)
    stats = GroupStats(n_tokens=2000, C=xs.T @ xs / 2000, abs_mean=xs.abs().mean(0),
                       row_fisher={n: torch.rand(o, generator=gen, dtype=torch.float64) + 0.1 for n, o in GQA.items()})
    res = methods.get_method(name).from_options(options).compress(group, stats, RankSpec(0.5, budget))
    assert res.k_sites == expected
    assert res.summary()["k_sites"] == expected
    if budget == "params":  # SVD-LLM's int(m*n*r/(m+n)) per matrix: the block lands at (just under) 0.5
        assert res.form == "factorised"
        assert 0.49 < res.params_deployed / res.params_dense <= 0.5


def test_group_methods_keep_one_k_on_grouped_query_attention():
    group = gqa_group()
    stats = random_stats(640, n=1500)
    res = methods.get_method("pca")().compress(group, stats, RankSpec(0.5))
    assert res.k_sites == {n: 320 for n in GQA}
    res = methods.get_method("whitened-svd")().compress(group, stats, RankSpec(0.5, "params"))
    assert set(res.k_sites.values()) == {math.floor(0.5 * 640 * 1536 / (640 + 1536))}


def test_rank_ratio_outside_unit_interval_refused():
    for bad in (0, 1.5, float("nan"), -0.1):
        with pytest.raises(ValueError, match="outside"):
            RankSpec(bad)


def test_registry_unknown_name_and_settings():
    with pytest.raises(KeyError, match="Did you mean 'fasc'"):
        methods.get_method("fsac")
    assert set(methods.expand_methods("all")) >= {"svd", "pca", "whitened-svd", "asvd", "fasc", "fasc-kfac", "random"}
    with pytest.raises(ValueError, match="no setting bogus"):
        methods.get_method("asvd").from_options({"bogus": 1})
    assert methods.get_method("asvd").from_options({"alpha": 1.0}).settings.alpha == 1.0
    caps = methods.get_method("fasc").capabilities()
    assert caps == {"data_free": False, "activations": True, "gradients": True}
    assert methods.get_method("svd").capabilities()["data_free"]
    assert "Known:" in did_you_mean("x", ["a"])


def test_entry_point_plugin(tmp_path, monkeypatch):
    pkg = tmp_path / "myplugin.py"
    pkg.write_text(
        "from acbench.methods.base import Compressor\nfrom acbench.methods.svd import truncated_factors\n"
        "class Half(Compressor):\n    name = 'my-svd'\n    per_site = True\n"
        "    def solve(self, weights, stats, k):\n"
        "        return {n: truncated_factors(W, k[n]) for n, W in weights.items()}, False, [], {}\n"
    )
    dist = tmp_path / "myplugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: myplugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[acbench.methods]\nmy-svd = myplugin:Half\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    methods.REGISTRY.reload()
    try:
        assert "my-svd" in methods.expand_methods("all")
    finally:
        methods.REGISTRY.unregister("my-svd")


def test_save_pretrained_roundtrip(tmp_path, windows):
    model = tiny_model("llama", hidden=32, inter=96)
    stats = calibrate(model, find_input_groups(model), windows, frozenset({"C", "F"}), CalibSpec(), progress=False)
    results = compress_model(model, stats, "fasc-kfac", 0.5)
    assert {r.form for r in results} == {"merged", "factorised"}
    before = model(windows).logits
    gen = model.generate(windows[:1, :5], max_new_tokens=4, do_sample=False)
    write_checkpoint(model, None, tmp_path / "ck", {"method": "fasc-kfac"})
    again = load_checkpoint(tmp_path / "ck")
    assert (again(windows).logits - before).abs().max() < 1e-5
    assert torch.equal(again.generate(windows[:1, :5], max_new_tokens=4, do_sample=False), gen)


def test_readme_method_example_runs():
    """The worked example in the README is real code: it compresses a group and keeps its top-norm channels."""
    from conftest import readme_example

    cls = readme_example("# my_methods/my_methods/top_weight_norm.py")["TopNorm"]
    assert cls.capabilities()["data_free"]
    W = torch.zeros(5, 6)
    W[:, 1], W[:, 4] = 3.0, 2.0
    res = cls().compress(FakeGroup({"s": W}), GroupStats(), RankSpec(2 / 6))
    A, B = res.factors["s"]
    assert torch.allclose(A @ B, W)  # the two non-zero columns are kept exactly


@pytest.mark.parametrize("ratio", [0.5, 1.0])  # factorised modules at 0.5, merged weights at full rank
def test_in_place_compression_restores_the_dense_model_bit_for_bit(ratio, windows):
    """A sweep compresses the one model in place and restores it: no copy per cell, and the dense logits after
    every method equal those before, bit for bit (the originals are kept by reference, never modified)."""
    from acbench.deploy.compression import compressed

    model = tiny_model("llama", hidden=32, inter=96)
    stats = calibrate(model, find_input_groups(model), windows, ALL_STATS, CalibSpec(pair_tokens=64), progress=False)
    with torch.no_grad():
        dense = model(windows).logits
    n_params = sum(p.numel() for p in model.parameters())
    n_groups = len(find_input_groups(model))
    for name in methods.known_methods("low-rank"):
        with compressed(model, name, RankSpec(ratio), stats, progress=False) as (m, summaries):
            assert m is model and len(summaries) == n_groups
            with torch.no_grad():
                inside = model(windows).logits
            if ratio == 0.5:
                assert not torch.equal(inside, dense), name
                assert sum(p.numel() for p in model.parameters()) < n_params
        with torch.no_grad():
            assert torch.equal(model(windows).logits, dense), name
        assert sum(p.numel() for p in model.parameters()) == n_params
        assert not hasattr(model.config, "acbench_compression")


def test_in_place_compression_restores_on_error(windows):
    from acbench.deploy.compression import compressed

    model = tiny_model("llama", hidden=32, inter=96)
    stats = calibrate(model, find_input_groups(model), windows, ALL_STATS, CalibSpec(pair_tokens=64), progress=False)
    with torch.no_grad():
        dense = model(windows).logits
    with pytest.raises(RuntimeError, match="evaluation failed"):
        with compressed(model, "pca", RankSpec(0.5), stats, progress=False):
            raise RuntimeError("evaluation failed")
    with torch.no_grad():
        assert torch.equal(model(windows).logits, dense)


@pytest.mark.parametrize("shape,k", [((40, 12), 5), ((12, 40), 5), ((16, 16), 16), ((30, 10), 10)])
def test_truncated_factors_from_the_gram_equal_the_svd(shape, k):
    """float64 takes the top singular pairs from the smaller Gram's eigenvectors: the same rank-k product as the
    SVD's, balanced the same way; a weight of rank below k (zeroed rows) keeps its product finite and exact."""
    from acbench.methods.svd import truncated_factors

    gen = torch.Generator().manual_seed(11)
    M = torch.randn(*shape, generator=gen, dtype=torch.float64) * torch.logspace(0, -3, shape[1], dtype=torch.float64)
    for W in (M, torch.cat([M[: shape[0] // 2], torch.zeros(shape[0] - shape[0] // 2, shape[1], dtype=M.dtype)])):
        U, sig, Vh = torch.linalg.svd(W, full_matrices=False)
        ref = U[:, :k] * sig[:k] @ Vh[:k]
        A, B = truncated_factors(W, k)
        assert A.shape == (shape[0], k) and B.shape == (k, shape[1]) and torch.isfinite(A).all()
        assert (A @ B - ref).norm() <= 1e-10 * ref.norm()
        # balanced: both factors carry sigma^1/2, as the SVD's (U_k S^1/2, S^1/2 V_k^T)
        n = min(k, int((sig > 1e-12 * sig[0]).sum()))
        assert torch.allclose(A[:, :n].norm(dim=0), sig[:n].sqrt(), rtol=1e-8)
        A32, B32 = truncated_factors(W.float(), k)  # float32: the SVD itself
        assert (A32.double() @ B32.double() - ref).norm() <= 1e-5 * ref.norm()


@pytest.mark.parametrize("m,d,keep", [(20, 8, 3), (6, 10, 4), (6, 10, 8), (6, 10, None)])
def test_weighted_subspace_factor_paths_agree(m, d, keep):
    """F = R^T R given as its factor R: R^T R's eigenvectors (m >= d, float64), the thin SVD (keep inside R's row
    space) and the full SVD (else) give the projections the eigenvectors of S^T R^T R S give."""
    from acbench.core.linalg import weighted_subspace

    st = random_stats(d, seed=4)
    R = torch.randn(m, d, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    got = weighted_subspace(st.C, F_factor=R, keep=keep)
    ref = weighted_subspace(st.C, F=R.T @ R)
    k = min(keep or d, m)  # beyond R's rank the directions carry lam = 0 and are any completion
    assert got["U"].shape == (d, keep or d) and got["Wt"].shape == (keep or d, d)
    assert torch.allclose(got["lam"], ref["lam"].clamp_min(0), atol=1e-9 * float(ref["lam"][0]))
    P, P_ref = got["U"][:, :k] @ got["Wt"][:k], ref["U"][:, :k] @ ref["Wt"][:k]
    assert (P - P_ref).norm() <= 1e-8 * P_ref.norm()
