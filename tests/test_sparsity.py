"""The sparsity family: N:M and unstructured masks, scores, mitigations, weight controls, deployment, ratios."""

import itertools

import pytest
import torch

from acbench import methods
from acbench.deploy.apply import sparsifier_for
from acbench.core.compressed_layers import InputSparsifier, SparseInputLinear, compressed_subclass
from acbench.calibration.engine import CalibSpec, calibrate
from acbench.deploy.compression import compressed, compression_summary
from acbench.model.groups import find_input_groups
from acbench.core.errors import UserError
from acbench.core.sparsity import sparsify, topk_mask
from acbench.core.stats import GroupStats, RankSpec, SparsitySpec
from acbench.methods.base import GroupCompression, MaskedWeights, SparseActivation

from conftest import tiny_model

ALL_STATS = frozenset({"C", "F", "mean", "abs_mean"})


def brute_force_nm(score, n, m):
    """Reference: for every token and block, the set of n positions with the largest sum of scores."""
    out = torch.zeros_like(score, dtype=torch.bool)
    for t in range(score.shape[0]):
        for b in range(0, score.shape[1], m):
            block = score[t, b:b + m].tolist()
            best = max(itertools.combinations(range(m), n), key=lambda c: sum(block[i] for i in c))
            for i in best:
                out[t, b + i] = True
    return out


@pytest.mark.parametrize("n,m", [(1, 4), (2, 4), (3, 4), (4, 8), (2, 8)])
def test_nm_mask_keeps_exactly_n_of_every_m_the_highest(n, m):
    gen = torch.Generator().manual_seed(n * 10 + m)
    score = torch.rand(7, 4 * m, generator=gen)
    mask = topk_mask(score, n, m)
    assert (mask.reshape(7, -1, m).sum(-1) == n).all()
    assert torch.equal(mask, brute_force_nm(score, n, m))


def test_unstructured_keeps_round_density_d_per_token():
    x = torch.randn(9, 50, generator=torch.Generator().manual_seed(0))
    for density in (0.1, 0.3, 0.5, 0.77):
        p = SparsitySpec.parse(str(density))
        xs, _ = sparsify(x, p.keep(50), 0)
        kept = (xs != 0).sum(-1)
        assert (kept == round(density * 50)).all()
        # the kept ones are the largest |x| of each token
        thresh = x.abs().sort(-1, descending=True).values[:, round(density * 50) - 1:round(density * 50)]
        assert ((xs != 0) == (x.abs() >= thresh)).all()


def test_shift_with_zero_mean_equals_none_and_variance_keeps_energy():
    x = torch.randn(6, 32, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    none, _ = sparsify(x, 2, 4)
    shifted, _ = sparsify(x, 2, 4, mitigation="shift", mu=torch.zeros(32, dtype=torch.float64))
    assert torch.equal(none, shifted)
    var, _ = sparsify(x, 2, 4, mitigation="variance")
    assert torch.allclose(var.pow(2).sum(-1), x.pow(2).sum(-1), rtol=1e-6)
    assert torch.equal(var != 0, none != 0)  # the same entries kept, only rescaled
    med, eta = sparsify(x, 2, 4, mitigation="median")
    assert torch.allclose(eta, x.median(-1).values)
    assert ((med != 0).reshape(6, -1, 4).sum(-1) <= 2).all()


def fake_group(weights: dict, name="g"):
    class Site:
        def __init__(self, W):
            self.weight = W

    class Group:
        pass

    g = Group()
    g.name, g.site_names = name, tuple(weights)
    g.sites = tuple(Site(W) for W in weights.values())
    g.d_in = next(iter(weights.values())).shape[1]
    g.d_outs = tuple(W.shape[0] for W in weights.values())
    return g


def test_fisher_with_identity_equals_abs_and_scores_use_their_statistics():
    gen = torch.Generator().manual_seed(2)
    weights = {"a": torch.randn(5, 16, generator=gen), "b": torch.randn(3, 16, generator=gen)}
    g = fake_group(weights)
    stats = GroupStats(F=torch.eye(16, dtype=torch.float64), mean=torch.zeros(16, dtype=torch.float64))
    p = SparsitySpec.parse("2:4")
    fisher = methods.build("act-sparse:score=fisher").compress(g, stats, p)
    x = torch.randn(10, 16, generator=gen)
    assert torch.equal(sparsify(x, 2, 4, fisher.scale)[0], sparsify(x, 2, 4)[0])
    wina = methods.build("act-sparse:score=wina").compress(g, stats, p)
    expected = torch.sqrt(weights["a"].pow(2).sum(0) + weights["b"].pow(2).sum(0))
    assert torch.allclose(wina.scale, expected)
    amber = methods.build("act-sparse:score=amber").compress(g, stats, p)
    assert amber.scale.min().item() == pytest.approx(1.0)
    assert methods.build("act-sparse:score=fisher").required_stats() == {"F"}
    assert methods.build("act-sparse:mitigation=shift").required_stats() == {"mean"}
    assert methods.build("act-sparse").capabilities()["data_free"]


def test_width_not_a_multiple_of_m_is_refused_naming_the_group():
    g = fake_group({"a": torch.randn(4, 10)}, name="layers.3.mlp_in")
    with pytest.raises(UserError, match=r"layers\.3\.mlp_in \(d_in = 10\).*blocks of 4"):
        methods.build("act-sparse").compress(g, GroupStats(), SparsitySpec.parse("2:4"))


@pytest.mark.parametrize("text", ["5:4", "0:4", "4:4", "1.5", "abc", "0", "-0.5", "nan", 124])
def test_bad_sparsity_specs_are_refused(text):
    with pytest.raises(ValueError):
        SparsitySpec.parse(text)


def test_weight_controls_mask_n_of_m_per_output_row():
    gen = torch.Generator().manual_seed(3)
    W = torch.randn(6, 16, generator=gen)
    g = fake_group({"a": W})
    C = torch.diag(torch.rand(16, generator=gen, dtype=torch.float64) + 0.1)
    for name in ("wanda", "magnitude-prune"):
        res = methods.build(name).compress(g, GroupStats(C=C), SparsitySpec.parse("2:4"))
        mask = res.masks["a"]
        assert (mask.reshape(6, 4, 4).sum(-1) == 2).all()
        score = W.abs().double() * (torch.diagonal(C).sqrt() if name == "wanda" else 1)
        assert torch.equal(mask, brute_force_nm(score, 2, 4))


def test_ratios_on_hand_computed_shapes():
    """d_in = 8, sites of 4 and 12 outputs (dense 128 weights and multiply-adds per token)."""
    d_outs = (4, 12)
    fac = GroupCompression(group="g", method="pca", k=2, shared_projection=True, d_in=8, d_outs=d_outs,
                           factors={"a": (torch.zeros(4, 2), torch.zeros(2, 8)), "b": (torch.zeros(12, 2), torch.zeros(2, 8))})
    s = fac.summary()
    # factorised: B 2x8 + A 4x2 + 12x2 = 48 weights and multiply-adds per token
    assert (s["params_deployed"], s["param_ratio"], s["compute_ratio"], s["activation_ratio"]) == (48, 48 / 128, 48 / 128, 2 / 8)
    merged = GroupCompression(group="g", method="pca", k=6, shared_projection=True, d_in=8, d_outs=d_outs,
                              factors={"a": (torch.zeros(4, 6), torch.zeros(6, 8)), "b": (torch.zeros(12, 6), torch.zeros(6, 8))})
    assert merged.form == "merged" and merged.summary()["compute_ratio"] == 1.0 and merged.activation_ratio == 1.0
    act = SparseActivation(pattern=SparsitySpec.parse("2:8"), group="g", d_in=8, d_outs=d_outs).summary()
    assert (act["param_ratio"], act["compute_ratio"], act["activation_ratio"]) == (1.0, 0.25, 0.25)
    assert act["index_bits_per_token"] == 5  # ceil(log2 C(8, 2)) = ceil(log2 28)
    masks = {"a": torch.zeros(4, 8, dtype=torch.bool), "b": torch.zeros(12, 8, dtype=torch.bool)}
    masks["a"][:, :4] = True
    masks["b"][:, :4] = True
    w = MaskedWeights(pattern=SparsitySpec.parse("4:8"), group="g", d_in=8, d_outs=d_outs, masks=masks).summary()
    assert (w["params_deployed"], w["param_ratio"], w["compute_ratio"], w["activation_ratio"]) == (64, 0.5, 0.5, 1.0)
    total = compression_summary([s, act], SparsitySpec.parse("2:8"), "act-sparse", None)
    # weighted by dense multiply-adds (128 each): (48 + 32) / 256; activations kept (2 + 2) / 16
    assert total["compute_ratio"] == pytest.approx(80 / 256) and total["activation_ratio"] == pytest.approx(4 / 16)


def test_group_sites_read_one_mask_per_token(windows):
    model = tiny_model("llama", hidden=32, inter=48)
    groups = find_input_groups(model)
    stats = calibrate(model, groups, windows, ALL_STATS, CalibSpec(), progress=False)
    with compressed(model, "act-sparse", SparsitySpec.parse("2:4"), stats, progress=False) as (m, summaries):
        sparsifiers = {id(mod): mod for mod in m.modules() if isinstance(mod, InputSparsifier)}
        with torch.no_grad():
            m(windows[:2])
        # one per group, each computed once per forward although 2-3 sites read it
        assert len(sparsifiers) == len(groups)
        assert all(s.n_computed == 1 for s in sparsifiers.values())
        assert {s.n_readers for s in sparsifiers.values()} == {1, 2, 3}
        assert all(s["compute_ratio"] == 0.5 and s["param_ratio"] == 1.0 for s in summaries)


@pytest.mark.parametrize("variant,pattern", [("act-sparse", "2:4"), ("act-sparse:mitigation=shift,score=fisher", "8:16"),
                                             ("act-sparse:mitigation=median", "0.5"), ("act-sparse:mitigation=variance", "4:8"),
                                             ("act-sparse:score=amber", "2:4"), ("wanda", "2:4"), ("magnitude-prune", "8:16")])
def test_dense_model_bit_identical_after_a_sparsity_variant(windows, variant, pattern):
    model = tiny_model("llama", hidden=32, inter=48)
    stats = calibrate(model, find_input_groups(model), windows, ALL_STATS, CalibSpec(), progress=False)
    with torch.no_grad():
        dense = model(windows).logits
    n_params = sum(p.numel() for p in model.parameters())
    with compressed(model, variant, SparsitySpec.parse(pattern), stats, progress=False) as (m, _):
        with torch.no_grad():
            assert not torch.equal(m(windows).logits, dense)
    with torch.no_grad():
        assert torch.equal(model(windows).logits, dense)
    assert sum(p.numel() for p in model.parameters()) == n_params
    assert not hasattr(model.config, "acbench_compression")


def test_deployed_shift_bias_equals_shifting_the_input():
    """shift deploys W mu as a bias: W s(x - mu) + b + W mu equals W (s(x - mu) + mu) + b."""
    gen = torch.Generator().manual_seed(4)
    lin = torch.nn.Linear(16, 5)
    mu = torch.randn(16, generator=gen)
    res = SparseActivation(pattern=SparsitySpec.parse("2:4"), d_in=16, d_outs=(5,), mitigation="shift", mu=mu)
    sp = sparsifier_for(res, torch.float32, "cpu")
    x = torch.randn(3, 16, generator=gen)
    with torch.no_grad():
        y = SparseInputLinear(lin, sp, owner=True)(x)
        xs, _ = sparsify(x, 2, 4, mitigation="shift", mu=mu)
        assert torch.allclose(y, lin(xs + mu), atol=1e-5)
        med = SparseInputLinear(lin, sparsifier_for(SparseActivation(pattern=SparsitySpec.parse("2:4"), d_in=16,
                                                                      d_outs=(5,), mitigation="median"),
                                                     torch.float32, "cpu"), owner=True)(x)
        xs, eta = sparsify(x, 2, 4, mitigation="median")
        assert torch.allclose(med, lin(xs + eta[:, None]), atol=1e-5)


def test_low_rank_and_sparsity_methods_refuse_the_other_budget():
    g = fake_group({"a": torch.randn(4, 8)})
    with pytest.raises(TypeError, match="sparsity method"):
        methods.build("act-sparse").compress(g, GroupStats(), RankSpec(0.5))
    with pytest.raises(TypeError, match="low-rank method"):
        methods.build("svd").compress(g, GroupStats(), SparsitySpec.parse("2:4"))


def test_variants_parse_split_and_canonicalise():
    assert methods.split_methods(["pca,act-sparse:score=fisher,mitigation=shift", "wanda"]) == [
        "pca", "act-sparse:score=fisher,mitigation=shift", "wanda"]
    assert methods.expand_methods(["act-sparse:score=fisher,mitigation=shift"]) == [
        "act-sparse:mitigation=shift,score=fisher"]
    assert methods.expand_methods(["all"], ["sparsity"]) == ["act-sparse", "cats", "larosa", "magnitude-prune", "r-sparse", "sparsegpt", "teal", "wanda", "wina"]
    assert "act-sparse" not in methods.expand_methods(["all"], ["low-rank"])
    with pytest.raises(ValueError, match="setting=value"):
        methods.parse_variant("act-sparse:fisher")
    with pytest.raises(ValueError, match="unknown"):
        methods.build("act-sparse:score=bogus")


def test_mixed_sweep_one_leaderboard_with_matched_compute(tmp_path, capsys, monkeypatch):
    """pca and fasc-kfac beside act-sparse (two settings) and wanda: a row per variant, ratios in every cell, the
    cross-family table and figure; a rerun computes nothing, and does not tokenize the calibration text."""
    import json

    from acbench.cli import main
    from acbench.cli.smoke import tiny_checkpoint

    out = tmp_path / "res"
    argv = ["run", "--model", str(tiny_checkpoint()), "--methods", "pca", "fasc-kfac", "act-sparse",
            "act-sparse:score=fisher,mitigation=shift", "wanda", "--rank", "0.5", "0.25", "--sparsity", "2:4", "0.5",
            "--tasks", "ppl-token", "--calib-samples", "2", "--calib-seq-len", "32", "--pair-tokens", "32",
            "--ppl-windows", "2", "--ppl-seq-len", "32", "--output", str(out), "--quiet", "--no-latency"]
    assert main(argv) == 0
    cells = [json.loads(p.read_text()) for p in out.rglob("*.json") if p.parent.name != "plots"]
    cells = [c for c in cells if isinstance(c, dict) and "cell" in c]
    # dense + 2 low-rank x 2 ranks + 3 sparse rows x 2 budgets
    assert len(cells) == 1 + 4 + 6
    rows = {(c["cell"]["method"], c["cell"]["budget"]) for c in cells}
    assert ("act-sparse:mitigation=shift,score=fisher", "2:4") in rows and ("act-sparse", "unstructured") in rows
    for c in cells:
        if c["compression"]:
            comp = c["compression"]
            assert {"param_ratio", "compute_ratio", "activation_ratio"} <= set(comp)
            assert all({"param_ratio", "compute_ratio", "activation_ratio"} <= set(g) for g in comp["groups"])
            if c["cell"]["budget"] in ("2:4", "unstructured"):
                assert comp["compute_ratio"] == pytest.approx(0.5) and comp["pattern"] == c["cell"]["budget"]
    md = (out / "LEADERBOARD.md").read_text()
    assert "### N:M 2:4 sparsity (density 0.5)" in md and "### Both families at compute ratio 0.5" in md
    assert "act-sparse:mitigation=shift,score=fisher @ 2:4" in md and "Δ NLL vs pca @ rank" in md
    assert "not a measured speedup" in md
    assert list((out / "plots").glob("*_vs_compute.png"))
    capsys.readouterr()
    import acbench.runner.prepare
    import acbench.runner.worker

    for module in (acbench.runner.prepare, acbench.runner.worker):
        monkeypatch.setattr(module, "calibration_windows", lambda *a: pytest.fail("a rerun tokenized the calibration"))
    assert main(argv) == 0
    assert "0 cell(s) to compute" in capsys.readouterr().out


def test_readme_sparsity_method_example_runs():
    from conftest import readme_example

    cls = readme_example("# my_methods/my_methods/top_weight_norm.py")["RelativeMagnitude"]
    assert cls.family == "sparsity" and cls.capabilities()["activations"]
    g = fake_group({"s": torch.randn(3, 8)})
    res = cls().compress(g, GroupStats(abs_mean=torch.full((8,), 2.0, dtype=torch.float64)), SparsitySpec.parse("2:4"))
    assert isinstance(res, SparseActivation) and torch.allclose(res.scale, torch.full((8,), 0.5))
    assert res.summary()["compute_ratio"] == 0.5


def test_keep_top_equals_the_mask_times_x():
    from acbench.core.sparsity import keep_top

    gen = torch.Generator().manual_seed(5)
    x = torch.randn(3, 5, 32, generator=gen)
    score = x.abs() * torch.rand(32, generator=gen)
    for n, m in ((2, 4), (8, 16), (5, 0)):
        assert torch.equal(keep_top(x, score, n, m), x * topk_mask(score, n, m))


def test_index_bits_by_hand():
    """Mask metadata per token: ceil(log2 C(M, N)) bits per block of M (an integer count), or ceil(log2 C(d, k)) for
    k kept of d; one channel or none needs no bits."""
    from acbench.core.stats import SparsitySpec

    two_four = SparsitySpec.parse("2:4")
    assert two_four.index_bits(12) == 3 * 3 and type(two_four.index_bits(12)) is int  # C(4, 2) = 6: 3 bits a block
    half = SparsitySpec.parse("0.5")
    assert half.index_bits(2) == 1  # C(2, 1) = 2
    assert SparsitySpec.parse("0.25").index_bits(8) == 5  # C(8, 2) = 28
    assert half.index_bits(1) == 0


def test_a_bool_sparsity_is_refused_naming_it():
    from acbench.core.stats import SparsitySpec

    with pytest.raises(ValueError, match=r"^sparsity True is neither an N:M pattern nor a density: pass e.g. 2:4 or 0\.5$"):
        SparsitySpec.parse(True)


def test_sparsity_parse_accepts_the_edges_and_names_each_problem():
    """1, '1' and 1:M are valid (everything kept; one of M); an integer above 1 is YAML's reading of an unquoted
    N:M; each refusal is its own line with the fix."""
    from acbench.core.stats import SparsitySpec

    assert SparsitySpec.parse(1).density == 1.0 and SparsitySpec.parse("1").density == 1.0
    one_of_four = SparsitySpec.parse("1:4")
    assert (one_of_four.n, one_of_four.m, one_of_four.density) == (1, 4, 0.25)
    refusals = {
        2: "sparsity 2 is not a density in (0, 1]: an N:M pattern in a YAML file must be quoted ('2:4')",
        124: "sparsity 124 is not a density in (0, 1]: an N:M pattern in a YAML file must be quoted ('2:4')",
        "4:4": "sparsity 4:4: N:M needs 0 < N < M (keep N of every M channels), e.g. 2:4 or 8:16",
        "0:4": "sparsity 0:4: N:M needs 0 < N < M (keep N of every M channels), e.g. 2:4 or 8:16",
        "half": "sparsity 'half' is neither an N:M pattern nor a density: pass e.g. 2:4, 16:32 or 0.5 (the fraction "
                "of channels kept per token)",
        "1.5": "sparsity density 1.5 is outside (0, 1]: it is the fraction of channels kept per token, e.g. 0.5",
        "0": "sparsity density 0 is outside (0, 1]: it is the fraction of channels kept per token, e.g. 0.5",
    }
    for text, message in refusals.items():
        with pytest.raises(ValueError) as e:
            SparsitySpec.parse(text)
        assert str(e.value) == message


def test_kept_channels_per_token():
    from acbench.core.stats import SparsitySpec

    assert SparsitySpec.parse("2:4").keep(12) == 6 and type(SparsitySpec.parse("2:4").keep(12)) is int
    assert SparsitySpec.parse("0.1").keep(8) == 1  # round(0.8)
    assert SparsitySpec.parse("0.01").keep(8) == 1  # never none
    assert SparsitySpec.parse("0.3").keep(10) == 3


def test_act_sparse_settings_name_every_choice_when_refused():
    from acbench.core.sparsity import MITIGATIONS
    from acbench.methods.act_sparse import SCORES, ActSparseSettings

    with pytest.raises(ValueError) as e:
        ActSparseSettings(score="bogus")
    assert str(e.value) == f"act-sparse score 'bogus' is unknown: use one of {', '.join(SCORES)}"
    with pytest.raises(ValueError) as e:
        ActSparseSettings(mitigation="bogus")
    assert str(e.value) == f"act-sparse mitigation 'bogus' is unknown: use one of {', '.join(MITIGATIONS)}"


def test_act_sparse_deploys_a_mean_only_under_the_shift_mitigation():
    """Statistics shared with another method may carry E[x]; only `shift` deploys it (as the bias W mu)."""
    from acbench.core.stats import GroupStats, SparsitySpec
    from acbench.methods.act_sparse import ActSparse, ActSparseSettings

    stats = GroupStats(mean=torch.ones(8, dtype=torch.float64), abs_mean=torch.ones(8, dtype=torch.float64))
    weights = {"s": torch.randn(4, 8)}
    pattern = SparsitySpec.parse("2:4")
    assert ActSparse(ActSparseSettings()).solve(weights, stats, pattern).mu is None
    shifted = ActSparse(ActSparseSettings(mitigation="shift")).solve(weights, stats, pattern).mu
    assert torch.equal(shifted, torch.ones(8))


@pytest.mark.parametrize("variant,pattern", [("act-sparse:mitigation=shift,score=fisher", "8:16"),
                                             ("act-sparse:mitigation=median", "0.5"), ("teal", "0.5")])
def test_a_saved_sparse_model_loads_back_as_it_ran(windows, tmp_path, variant, pattern):
    """What a checkpoint's loader rebuilds from the layout in its config (the sites, one sparsifier per group read by
    each of its sites, the score scale, mean and threshold buffers) runs as the deployed model did: the same logits
    at prefill (the masked form) and on one token (the gathered form), and the same readers per group."""
    from acbench.model.checkpoint import load_checkpoint, write_checkpoint

    model = tiny_model("llama", hidden=32, inter=48)
    needs = ALL_STATS | methods.build(variant).required_stats()
    stats = calibrate(model, find_input_groups(model), windows, needs, CalibSpec(), progress=False)
    readers = lambda m: {n: mod.n_readers for n, mod in m.named_modules() if isinstance(mod, InputSparsifier)}
    with torch.no_grad(), compressed(model, variant, SparsitySpec.parse(pattern), stats, progress=False) as (m, _):
        want = m(windows[:2]).logits, m(windows[:1, :1]).logits
        want_readers = readers(m)
        write_checkpoint(m, None, tmp_path / "ck", {"method": variant})
    again = load_checkpoint(tmp_path / "ck")
    assert sorted(want_readers.values()) == [1, 1, 1, 1, 2, 2, 3, 3] and readers(again) == want_readers
    sites = {n for n, mod in again.named_modules() if isinstance(mod, SparseInputLinear)}
    assert len(sites) == 2 * 7
    with torch.no_grad():
        got = again(windows[:2]).logits, again(windows[:1, :1]).logits
    for g, w in zip(got, want):
        assert (g - w).abs().max() <= 1e-5 * w.abs().max()
    # loaded in bfloat16, every buffer the loader built holds the model's dtype (a float32 one would shift the scores)
    half = load_checkpoint(tmp_path / "ck", dtype=torch.bfloat16)
    built = [b for mod in half.modules() if isinstance(mod, (InputSparsifier, SparseInputLinear))
             for b in mod.buffers(recurse=False)]
    assert built and {b.dtype for b in built} == {torch.bfloat16}
    # the same class on a config without a layout is the plain model
    plain = compressed_subclass(type(model))(model.config)
    assert not any(isinstance(mod, (SparseInputLinear, InputSparsifier)) for mod in plain.modules())
