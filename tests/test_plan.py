"""`bench plan` from hand-written configs of the paper's models: exact byte counts, no weights loaded."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from acbench import methods
from acbench.cli import main
from acbench.measure.costs import estimate_costs as make_plan
from acbench.core.stats import RankSpec, SparsitySpec
from acbench.core.units import parse_bytes

CONFIGS = Path(__file__).parent / "fixtures" / "configs"


@pytest.mark.parametrize("name", ["llama-3-8b", "mistral-7b"])
def test_plan_counts_the_8b_statistics_exactly(name):
    plan = make_plan(str(CONFIGS / name), ["fasc-kfac"], [0.5])
    # 32 blocks x (3 groups of d = 4096 + one of d = 14336) x (C and F) x 8 bytes
    assert plan.stats_total["C"] + plan.stats_total["F"] == 32 * (3 * 4096**2 + 14336**2) * 8 * 2 == 130_996_502_528
    assert plan.n_blocks == 32 and [k["kind"] for k in plan.kinds] == ["attn_in", "attn_out", "mlp_in", "mlp_out"]
    assert plan.kinds[0]["d_outs"] == (4096, 1024, 1024)  # grouped-query attention: 8 key-value heads
    vocab = {"llama-3-8b": 128256, "mistral-7b": 32000}[name]
    layer = 4096 * (4096 + 1024 + 1024 + 4096) + 3 * 4096 * 14336 + 2 * 4096
    assert plan.params == 32 * layer + 2 * vocab * 4096 + 4096  # untied embeddings, final norm
    k = plan.methods["fasc-kfac"][0.5]["per_kind"]
    assert k["attn_in"] == {"k": [2048] * 3, "form": "factorised"} and k["mlp_out"]["form"] == "merged"


def test_plan_passes_follow_the_memory_budget():
    plan = make_plan(str(CONFIGS / "llama-3-8b"), ["pca"], [0.5], stats_memory=parse_bytes("16GB"))
    per_block = 3 * 4096**2 * 8 + 14336**2 * 8  # C only
    assert plan.stats_per_block == per_block
    # groups fill each pass in forward order: 7 blocks and the first 3 groups of the 8th (16 GB / 2.05 GB)
    assert plan.pass_bytes <= 16e9 and plan.passes == 5
    assert make_plan(str(CONFIGS / "llama-3-8b"), ["svd"], [0.5]).passes == 0  # data-free: no calibration


def test_plan_cli_is_one_screen_and_refuses_bad_input(capsys):
    assert main(["plan", "--model", str(CONFIGS / "llama-3-8b"), "--methods", "fasc-kfac", "--stats-memory", "2GB",
                 "--rank", "0.5"]) == 2  # one mlp_out group's C and F (3.3 GB) exceed 2 GB
    assert "raise it to at least" in capsys.readouterr().err
    assert main(["plan", "--model", str(CONFIGS / "llama-3-8b"), "--methods", "fasc-kfac", "--stats-memory", "8GB"]) == 0
    out = capsys.readouterr().out
    assert "| total" in out and "65.5 GB" in out and "calibration pass" in out
    assert main(["plan", "--model", str(CONFIGS / "nope")]) == 2
    assert main(["plan", "--model", str(CONFIGS / "llama-3-8b"), "--stats-memory", "lots"]) == 2
    assert main(["plan", "--model", str(CONFIGS / "llama-3-8b"), "--methods", "fsac"]) == 2


def test_a_plan_without_a_shared_calibration_says_so_instead_of_a_zero_peak(capsys):
    """Sequential SparseGPT calibrates on its own: no line may read 'calibration: 0 B (weights + ...)', and the time
    table has no calibration row of 0 s; a plan that calibrates keeps both."""
    model = str(CONFIGS / "llama-3-8b")
    assert main(["plan", "--model", model, "--methods", "sparsegpt", "--sparsity", "0.5",
                 "--calibration-mode", "sequential"]) == 0
    out = capsys.readouterr().out
    assert "shared calibration: none" in out and "peak memory, calibration" not in out, out
    assert "| calibration " not in out and "calibrations of their own" in out, out
    assert main(["plan", "--model", model, "--methods", "wanda", "--sparsity", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "shared calibration: none" not in out and "peak memory, calibration" in out and "| calibration " in out


def test_plan_covers_sparsity_patterns_and_refuses_what_run_refuses(capsys):
    plan = make_plan(str(CONFIGS / "llama-3-8b"), ["act-sparse", "wanda"], [0.5],
                     sparsity=[SparsitySpec.parse("2:4"), SparsitySpec.parse("0.25")])
    assert plan.sparse["act-sparse"]["2:4"]["compute_ratio"] == 0.5
    assert plan.sparse["act-sparse"]["2:4"]["param_ratio"] == 1.0 and plan.sparse["wanda"]["2:4"]["param_ratio"] == 0.5
    # 2:4 index bits per token of one block: ceil(log2 C(4, 2)) = 3 bits per 4 channels of 4096 + 4096 + 4096 + 14336
    assert plan.sparse["act-sparse"]["2:4"]["index_bits_per_token"] == 3 * (3 * 4096 + 14336) // 4
    assert plan.sparse["wanda"]["unstructured 0.25"]["compute_ratio"] == pytest.approx(0.25, abs=1e-3)
    assert main(["plan", "--model", str(CONFIGS / "llama-3-8b"), "--methods", "act-sparse", "--sparsity", "3:7"]) == 2
    assert "cannot split group" in capsys.readouterr().err
    assert main(["plan", "--model", str(CONFIGS / "llama-3-8b"), "--methods", "act-sparse", "--sparsity", "16:32"]) == 0
    assert "sparsity methods" in capsys.readouterr().out


# ---------------------------------------------------------------- time in the plan (issue 24, item 3)

def _speed(**kw):
    from acbench.measure.costs import DeviceSpeed

    base = dict(device="cpu", matmul32=1e11, solve_matmul=4e10, eigh_n=1024, eigh_s=0.2, svd_shape=(1024, 512),
                svd_s=0.1, bandwidth=1e10)
    return DeviceSpeed(**{**base, **kw})


def test_plan_times_scale_by_the_declared_operations():
    from acbench.measure.costs import estimate_times as times_of

    llama = str(CONFIGS / "llama-3-8b")

    def estimate_times(model, names, ranks, speed, calib_tokens=12 * 256):
        return times_of(make_plan(model, names, ranks, calib_samples=calib_tokens, calib_seq_len=1), speed)
    pca = estimate_times(llama, ["pca"], [0.5], _speed())
    # one eigh of C per group, scaled by n^3 from the measured size, plus the projection A_i = W_i U_k
    eighs = 32 * 0.2 * (3 * (4096 / 1024) ** 3 + (14336 / 1024) ** 3)
    assert eighs < pca["methods"]["pca"] < 1.2 * eighs
    assert estimate_times(llama, ["pca"], [0.5], _speed(eigh_s=0.4))["methods"]["pca"] == pytest.approx(
        2 * pca["methods"]["pca"], rel=0.2)
    # in the run's order fasc computes the K-FAC basis and fasc-kfac, after it, pays only for its projection: the
    # basis is memoised per group; given the other way round, fasc-kfac pays for it
    both = estimate_times(llama, ["fasc", "fasc-kfac"], [0.5], _speed())["methods"]
    swapped = estimate_times(llama, ["fasc-kfac", "fasc"], [0.5], _speed())["methods"]
    assert list(swapped) == ["fasc-kfac", "fasc"] and swapped["fasc-kfac"] > both["fasc-kfac"]
    assert swapped["fasc-kfac"] + swapped["fasc"] == pytest.approx(both["fasc-kfac"] + both["fasc"])
    fasc_alone = estimate_times(llama, ["fasc"], [0.5], _speed())["methods"]["fasc"]
    kfac_alone = estimate_times(llama, ["fasc-kfac"], [0.5], _speed())["methods"]["fasc-kfac"]
    assert both["fasc"] == fasc_alone > kfac_alone > 2 * eighs  # two eigen-solves per group and the products
    assert both["fasc-kfac"] < 0.1 * kfac_alone
    # calibration: forward + backward to the inputs (4 FLOPs per weight and token, LM head included; the weights
    # are frozen) and the hooks' products
    # x^T x and g^T g (2 d^2 each per token and group), at the model device's float32 matmul speed
    # once per calibration pass (the model runs whole in each; the hooks' products are each group's once)
    linear = 32 * 4096 * (4096 + 1024 + 1024 + 4096 + 2 * 14336) + 32 * 14336 * 4096
    hooks = 32 * 2 * 2 * (3 * 4096 ** 2 + 14336 ** 2)
    for memory, passes in (("200GB", 1), ("64GB", 3)):  # 131 GB of C and F, 4.1 GB per block
        est = make_plan(llama, ["fasc-kfac"], [0.5], calib_samples=1000, calib_seq_len=1,
                        stats_memory=parse_bytes(memory))
        assert est.passes == passes
        calib = times_of(est, _speed())["calibration"]
        assert calib == pytest.approx(1000 * (passes * 4 * (linear + 128256 * 4096) + hooks) / 1e11)
    assert estimate_times(llama, ["svd"], [0.5], _speed())["calibration"] == 0.0  # data-free


def test_plan_shares_memoised_solves_only_when_the_store_holds_them():
    from acbench.measure.costs import estimate_times

    llama = str(CONFIGS / "llama-3-8b")

    def times(memory):
        est = make_plan(llama, ["fasc", "fasc-kfac"], [0.5], stats_memory=parse_bytes(memory) if memory else None)
        return estimate_times(est, _speed())

    unlimited, roomy, tight = times(None), times("1TB"), times("64GB")
    assert unlimited["memo_shared"] and roomy["memo_shared"] and not tight["memo_shared"]
    assert roomy["methods"] == unlimited["methods"]
    # 131 GB of C and F do not stay in 64 GB: fasc-kfac, after fasc, finds its groups re-read and pays the K-FAC
    # basis again, exactly what it pays alone
    alone = estimate_times(make_plan(llama, ["fasc-kfac"], [0.5]), _speed())["methods"]["fasc-kfac"]
    assert tight["methods"]["fasc-kfac"] == pytest.approx(alone)
    assert tight["methods"]["fasc"] == pytest.approx(unlimited["methods"]["fasc"])
    assert roomy["methods"]["fasc-kfac"] < 0.1 * alone


def test_plan_prints_time_under_the_run_stage_names(capsys, monkeypatch):
    import acbench.measure.costs

    monkeypatch.setattr(acbench.measure.costs, "measure_speed",
                        lambda device="cpu", n=1024, solve_dtype="float64": _speed(device=device, solve_dtype=solve_dtype))
    assert main(["plan", "--model", str(CONFIGS / "llama-3-8b"), "--methods", "pca", "fasc-kfac",
                 "--stats-memory", "64GB"]) == 0
    out = capsys.readouterr().out
    assert "estimated time" in out and "an estimate" in out and "micro-benchmark" in out
    for stage in ("| calibration", "| compress fasc-kfac", "| compress pca", "| total"):
        assert stage in out


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a CUDA device")
def test_plan_with_a_missing_solve_device_is_one_line(capsys):
    assert main(["plan", "--model", str(CONFIGS / "llama-3-8b"), "--methods", "pca", "--solve-device", "cuda"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "no CUDA device" in err[0]


def test_truncated_svd_priced_as_the_path_each_precision_takes():
    """float64 takes the smaller Gram's eigh (Gram product + eigh at the small side), float32 the SVD itself; the
    per-site methods and whitened-svd (m >= d) declare that operation, whitened-svd at m < d an SVD."""
    from acbench.measure.costs import op_seconds
    from acbench.methods.base import factor_svd_ops, site_svd_ops

    op = ("", "truncated_svd", 4096, 1024)
    f64, f32 = _speed(), _speed(solve_dtype="float32")
    assert op_seconds(op, f64) == pytest.approx(2 * 4096 * 1024 ** 2 / 4e10 + 0.2)
    assert op_seconds(op, f32) == pytest.approx(0.1 * 4096 * 1024 ** 2 / (1024 * 512 ** 2))
    assert site_svd_ops(640, (2048, 256)) == [("", "truncated_svd", 2048, 640), ("", "truncated_svd", 256, 640)]
    assert factor_svd_ops(1536, 640, 320) == [("", "truncated_svd", 1536, 640)]
    assert factor_svd_ops(640, 1024, 512) == [("", "svd", 640, 1024)]  # k inside R's row space: the thin SVD
    # k beyond it: V square, the thin SVD and V formed from its reflectors
    assert factor_svd_ops(640, 2048, 1024) == [("", "svd", 640, 2048), ("", "flops", 4 * 2048 * 2048 * 640)]


# ---------------------------------------------------------------- every number of a plan, by hand (issue 51)

TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100, "tie_word_embeddings": False}
# per block: attn_in 64 -> 64 + 32 + 32, attn_out 64 -> 64, mlp_in 64 -> 128 + 128, mlp_out 128 -> 64
LINEAR = 2 * (64 * 128 + 64 * 64 + 64 * 256 + 128 * 64)  # 73,728 multiply-adds per token
# per block: attention (q, k, v, o), MLP (gate, up, down), two norms; then untied embeddings and the final norm
PARAMS = 2 * (64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128 + 2 * 64) + 2 * 100 * 64 + 64
SQUARES = 3 * 64 ** 2 + 128 ** 2  # one block's sum of d_in^2


@pytest.fixture
def tiny(tmp_path):
    import json

    (tmp_path / "config.json").write_text(json.dumps(TINY))
    return str(tmp_path)


def test_stat_bytes_of_each_statistic_by_hand():
    from types import SimpleNamespace

    from acbench.calibration.memory import stat_bytes

    g = SimpleNamespace(d_in=64, d_outs=(64, 32, 32))
    every = frozenset({"C", "F", "abs_mean", "mean", "pairs", "row_fisher", "abs_hist"})
    assert stat_bytes(g, every, 10) == {"C": 64 * 64 * 8, "F": 64 * 64 * 8, "abs_mean": 64 * 8, "mean": 64 * 8,
                                        "pairs": 2 * 10 * 64 * 4, "row_fisher": 128 * 8, "abs_hist": 4096 * 8}
    assert stat_bytes(g, every, 10, width=4) == {"C": 64 * 64 * 4, "F": 64 * 64 * 4, "abs_mean": 64 * 4,
                                                 "mean": 64 * 4, "pairs": 2 * 10 * 64 * 4, "row_fisher": 128 * 4,
                                                 "abs_hist": 4096 * 4}  # the (x, g) sample is float32 either way
    assert stat_bytes(g, frozenset({"C"}), 10) == {"C": 64 * 64 * 8}


def test_a_plan_in_full_on_a_tiny_config(tiny):
    from math import ceil, comb, log2

    plan = make_plan(tiny, ["pca", "fasc-kfac", "act-sparse", "teal", "wanda"], [0.5, 0.25],
                     sparsity=[SparsitySpec.parse("2:4"), SparsitySpec.parse("0.25")])
    params = PARAMS
    assert (plan.params, plan.weight_bytes, plan.n_blocks) == (params, 4 * params, 2)
    assert plan.config == {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
                           "num_hidden_layers": 2, "vocab_size": 100}
    assert plan.needs == {"C", "F", "abs_hist"} and plan.calib_tokens == 12 * 256 and plan.pair_tokens == 512
    hist = 4096 * 8  # teal's histogram: one per group, whatever its width
    assert plan.kinds == [
        {"kind": "attn_in", "count": 2, "d_in": 64, "d_outs": (64, 32, 32),
         "stats": {"C": 2 * 64 * 64 * 8, "F": 2 * 64 * 64 * 8, "abs_hist": 2 * hist}},
        {"kind": "attn_out", "count": 2, "d_in": 64, "d_outs": (64,),
         "stats": {"C": 2 * 64 * 64 * 8, "F": 2 * 64 * 64 * 8, "abs_hist": 2 * hist}},
        {"kind": "mlp_in", "count": 2, "d_in": 64, "d_outs": (128, 128),
         "stats": {"C": 2 * 64 * 64 * 8, "F": 2 * 64 * 64 * 8, "abs_hist": 2 * hist}},
        {"kind": "mlp_out", "count": 2, "d_in": 128, "d_outs": (64,),
         "stats": {"C": 2 * 128 * 128 * 8, "F": 2 * 128 * 128 * 8, "abs_hist": 2 * hist}}]
    assert plan.stats_total == {"C": 2 * SQUARES * 8, "F": 2 * SQUARES * 8, "abs_hist": 8 * hist}
    assert plan.stats_per_block == 2 * SQUARES * 8 + 4 * hist
    assert plan.cache_bytes == 2 * 2 * SQUARES * 4 + 8 * 4096 * 4  # float32 on disk
    # one pass holds everything without --stats-memory
    assert plan.passes == 1 and plan.pass_bytes == sum(plan.stats_total.values()) == 4 * SQUARES * 8 + 8 * hist
    tokens = 2 * 256  # batch 2 x 256 positions, with gradients: 6 hidden + 4 intermediate floats a block, logits x2
    assert plan.activation_bytes == tokens * (6 * 64 + 4 * 128) * 2 * 4 + tokens * 100 * 4  # logits take their gradient
    largest = 2 * 128 * 128 * 8 + hist  # mlp_out's C, F and histogram
    assert plan.calibration_peak == 4 * params + plan.pass_bytes + largest + plan.activation_bytes
    # k = d_in / 2 at 0.5: attn_out (64 * 32 + 32 * 64 > 64 * 64) and mlp_out stay merged; at 0.25 all factorise
    half = {"attn_in": {"k": [32] * 3, "form": "factorised"}, "attn_out": {"k": [32], "form": "merged"},
            "mlp_in": {"k": [32] * 2, "form": "factorised"}, "mlp_out": {"k": [64], "form": "merged"}}
    deployed_half = 2 * ((64 * 32 + 32 * 128) + 64 * 64 + (64 * 32 + 32 * 256) + 128 * 64)
    quarter = {"attn_in": {"k": [16] * 3, "form": "factorised"}, "attn_out": {"k": [16], "form": "factorised"},
               "mlp_in": {"k": [16] * 2, "form": "factorised"}, "mlp_out": {"k": [32], "form": "factorised"}}
    deployed_quarter = 2 * ((64 * 16 + 16 * 128) + (64 * 16 + 16 * 64) + (64 * 16 + 16 * 256) + (128 * 32 + 32 * 64))
    for name in ("pca", "fasc-kfac"):
        assert plan.methods[name] == {
            0.5: {"per_kind": half, "params_deployed": deployed_half, "param_ratio": deployed_half / LINEAR},
            0.25: {"per_kind": quarter, "params_deployed": deployed_quarter, "param_ratio": deployed_quarter / LINEAR}}
    assert plan.evaluation_peak == 4 * params + int(deployed_half / LINEAR * LINEAR * 4) + 2 * 256 * 100 * 4
    bits_24 = 3 * (3 * 64 + 128) // 4  # ceil(log2 C(4, 2)) = 3 bits per 4 channels, one block's four inputs
    bits_q = 3 * ceil(log2(comb(64, 16))) + ceil(log2(comb(128, 32)))
    assert plan.sparse == {
        "act-sparse": {"2:4": {"compute_ratio": 0.5, "param_ratio": 1.0, "index_bits_per_token": bits_24},
                       "unstructured 0.25": {"compute_ratio": 0.25, "param_ratio": 1.0, "index_bits_per_token": bits_q}},
        "teal": {"unstructured 0.25": {"compute_ratio": 0.25, "param_ratio": 1.0, "index_bits_per_token": bits_q}},
        "wanda": {"2:4": {"compute_ratio": 0.5, "param_ratio": 0.5, "index_bits_per_token": None},
                  "unstructured 0.25": {"compute_ratio": 0.25, "param_ratio": 0.25, "index_bits_per_token": None}}}
    data_free = make_plan(tiny, ["svd"], [0.5], dtype="bfloat16")
    assert data_free.needs == frozenset() and data_free.passes == 0 and data_free.pass_bytes == 0
    assert data_free.calibration_peak == 0 and data_free.weight_bytes == 2 * params
    bf16 = make_plan(tiny, ["pca"], [0.5], dtype="bfloat16")
    assert bf16.evaluation_peak == 2 * params + int(deployed_half / LINEAR * LINEAR * 2) + 2 * 256 * 100 * 4
    assert bf16.stats_total == {"C": 2 * SQUARES * 8}  # statistics stay float64 whatever the model's dtype
    pca = make_plan(tiny, ["pca"], [0.5], batch_size=3, calib_seq_len=10, eval_seq_len=7)
    assert pca.activation_bytes == 30 * 100 * 4  # no gradients: the logits alone, once
    assert pca.evaluation_peak == 4 * params + int(deployed_half / LINEAR * LINEAR * 4) + 3 * 7 * 100 * 4


def test_calibration_passes_at_the_budget_boundary(tiny):
    from acbench.core.errors import UserError
    from acbench.core.units import human

    # per group (fasc-kfac and teal: C, F, histogram): three of 3 * 32 KB, mlp_out 2 * 128 KB + 32 KB
    small, big = 3 * 64 * 64 * 8, 2 * 128 * 128 * 8 + 4096 * 8

    def passes(memory):
        p = make_plan(tiny, ["fasc-kfac", "teal"], [0.5], stats_memory=memory, sparsity=[SparsitySpec.parse("0.5")])
        return p.passes, p.pass_bytes

    block = 3 * small + big
    assert passes(block) == (2, block)  # a block fills a pass exactly
    # one byte less: mlp_out of block 0 opens the second pass, which block 1's mlp_in no longer fits
    assert passes(block - 1) == (3, big + 2 * small)
    assert passes(big) == (4, big)  # each mlp_out alone; the three small groups together
    with pytest.raises(UserError) as e:
        passes(big - 1)
    assert str(e.value) == (f"group layers.0.mlp_out's statistics take {human(big)}, more than --stats-memory "
                            f"{human(big - 1)}: raise it to at least {human(big)}")


def test_memoised_solves_fit_the_store_at_the_boundary(tiny):
    from acbench.measure.costs import memo_fits

    comps = {m: methods.build(m) for m in ("pca", "fasc-kfac")}
    # pca's basis, fasc-kfac's whitening factor and Fisher basis: two d x d float64 matrices each, per group
    memo = 3 * 2 * 2 * SQUARES * 8
    need = 4 * SQUARES * 8 + memo  # C and F, then the memos
    assert memo_fits(make_plan(tiny, ["pca", "fasc-kfac"], [0.5], stats_memory=need), comps)
    assert not memo_fits(make_plan(tiny, ["pca", "fasc-kfac"], [0.5], stats_memory=need - 1), comps)
    # in float32 the memos take half
    assert memo_fits(make_plan(tiny, ["pca", "fasc-kfac"], [0.5], stats_memory=need - memo // 2), comps, "float32")
    assert not memo_fits(make_plan(tiny, ["pca", "fasc-kfac"], [0.5], stats_memory=need - memo // 2 - 1), comps,
                         "float32")
    # fasc's direction scores: one pair_tokens x d matrix besides its bases; pairs are statistics too
    fasc = {"fasc": methods.build("fasc")}
    stats = 4 * SQUARES * 8 + 2 * 2 * 10 * (3 * 64 + 128) * 4  # C, F; (x, g) pairs of 10 tokens in float32
    memo = (3 * 2 * 2 * SQUARES + 10 * 2 * (3 * 64 + 128)) * 8
    plan = make_plan(tiny, ["fasc"], [0.5], pair_tokens=10, stats_memory=stats + memo)
    assert sum(plan.stats_total.values()) == stats
    assert memo_fits(plan, fasc)
    assert not memo_fits(make_plan(tiny, ["fasc"], [0.5], pair_tokens=10, stats_memory=stats + memo - 1), fasc)
    assert memo_fits(make_plan(tiny, ["fasc"], [0.5], pair_tokens=10), fasc)  # no budget: everything stays


def test_plan_times_on_the_tiny_config_by_hand(tiny, monkeypatch):
    from acbench.measure.costs import estimate_times

    speed = _speed(eigh_n=64, eigh_s=0.5, solve_matmul=1e9, matmul32=1e10)
    est = make_plan(tiny, ["pca", "fasc-kfac"], [0.5])
    t = estimate_times(est, speed)
    eigh = {64: 0.5, 128: 4.0}  # scaled by n^3 from 64
    # declared per kind: pca (basis eigh, projection flops); fasc-kfac after pca (the basis memoised): whitening
    # flops, Fisher products, Fisher eigh, projection flops
    kinds = [(64, 524288, 174762, 2097152), (64, 262144, 174762, 2097152), (64, 1048576, 174762, 2097152),
             (128, 1048576, 1398101, 16777216)]
    pca = 2 * sum(eigh[d] + proj / 1e9 for d, proj, _, _ in kinds)
    kfac_proj = [524288, 262144, 1048576, 1048576]
    kfac = 2 * sum((white + prods) / 1e9 + eigh[d] + p / 1e9 for (d, _, white, prods), p in zip(kinds, kfac_proj))
    assert t["methods"] == {"pca": pytest.approx(pca, rel=1e-12), "fasc-kfac": pytest.approx(kfac,
                                                                                                       rel=1e-12)}
    assert t["memo_shared"] is True and t["undeclared"] == []
    per_token = 1 * 4 * (LINEAR + 100 * 64) + 2 * SQUARES * 2 * 2  # forward + backward, then x^T x and g^T g
    assert t["calibration"] == pytest.approx(12 * 256 * per_token / 1e10, rel=1e-12)
    assert t["total"] == pytest.approx(t["calibration"] + pca + kfac, rel=1e-12)
    # the model on another device: calibration at its speed, the solves at the solve device's
    slow = _speed(matmul32=1e9)
    assert estimate_times(est, speed, slow)["calibration"] == pytest.approx(10 * t["calibration"], rel=1e-12)
    assert estimate_times(est, speed, slow)["methods"] == t["methods"]
    # row Fisher (act-sparse's fisher score): the weight gradients, 2 per site weight and token
    rf = make_plan(tiny, ["pca"], [0.5])
    rf.needs = frozenset({"row_fisher"})
    assert estimate_times(rf, speed)["calibration"] == pytest.approx(12 * 256 * (4 * (LINEAR + 6400) + 2 * LINEAR)
                                                                     / 1e10, rel=1e-12)
    # C alone (pca): the forward, stopped before the LM head, and x^T x
    pca_only = estimate_times(make_plan(tiny, ["pca"], [0.5]), speed)
    assert pca_only["calibration"] == pytest.approx(12 * 256 * (2 * LINEAR + 2 * SQUARES * 2) / 1e10, rel=1e-12)
    # (x, g) pairs alone take the backward too, and no product
    rf.needs = frozenset({"pairs"})
    assert estimate_times(rf, speed)["calibration"] == pytest.approx(12 * 256 * 4 * (LINEAR + 6400) / 1e10, rel=1e-12)
    rf.needs = frozenset({"F"})  # F alone: the backward, and g^T g
    assert estimate_times(rf, speed)["calibration"] == pytest.approx(
        12 * 256 * (4 * (LINEAR + 6400) + 2 * SQUARES * 2) / 1e10, rel=1e-12)
    sparse = estimate_times(make_plan(tiny, ["act-sparse", "svd", "pca"], [0.5]), speed)
    assert sparse["methods"]["act-sparse"] == 0.0 and sparse["calibration"] > 0
    assert sparse["methods"]["pca"] == pytest.approx(pca) and sparse["methods"]["svd"] > 0  # priced after act-sparse
    # the store holds the memos in float32 only: a float32 solve device shares them, a float64 one does not
    need = 4 * SQUARES * 8 + 3 * 2 * 2 * SQUARES * 8
    tight = make_plan(tiny, ["pca", "fasc-kfac"], [0.5], stats_memory=need - 3 * 2 * 2 * SQUARES * 4)
    assert estimate_times(tight, _speed(solve_dtype="float32"))["memo_shared"] is True
    assert estimate_times(tight, _speed())["memo_shared"] is False
    # a method that declares no solve cost: named, not estimated, left out of the total
    monkeypatch.setattr(type(methods.build("pca")), "solve_ops", lambda *a: None)
    t = estimate_times(make_plan(tiny, ["pca", "fasc-kfac", "pca"], [0.5]), speed)
    assert t["methods"]["pca"] is None and t["undeclared"] == ["pca"]
    assert t["total"] == pytest.approx(t["calibration"] + t["methods"]["fasc-kfac"])


def test_op_seconds_by_hand():
    from acbench.measure.costs import op_seconds

    s = _speed(eigh_n=100, eigh_s=2.0, svd_shape=(100, 50), svd_s=3.0, solve_matmul=1e9, bandwidth=1e9)
    assert op_seconds(("k", "eigh", 200), s) == pytest.approx(16.0)
    assert op_seconds(("", "svd", 100, 200), s) == pytest.approx(3.0 * 200 * 100 * 100 / (100 * 50 * 50))
    assert op_seconds(("", "svd", 200, 100), s) == op_seconds(("", "svd", 100, 200), s)
    assert op_seconds(("", "truncated_svd", 50, 400), s) == pytest.approx(2 * 400 * 50 * 50 / 1e9 + 2.0 / 8)
    assert op_seconds(("", "flops", 3e9), s) == pytest.approx(3.0)
    assert op_seconds(("", "bytes", 4e9), s) == pytest.approx(4.0)
    assert op_seconds(("", "bytes", 4e9), _speed(bandwidth=1e9, solve_dtype="float32")) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="unknown solve operation 'qr'"):
        op_seconds(("", "qr", 3), s)


def test_measure_speed_is_the_median_of_three_timed_runs(monkeypatch):
    import time

    from acbench.measure.costs import measure_speed

    durations = iter([1.0, 3.0, 2.0] * 5)  # each operation's three timed runs: median 2 s
    now = [0.0]
    state = {"start": True}

    def clock():
        if not state["start"]:
            now[0] += next(durations)
        state["start"] = not state["start"]
        return now[0]

    monkeypatch.setattr(time, "perf_counter", clock)
    n = 24  # not the default: the cache must not answer
    s = measure_speed("cpu", n, "float32")
    assert s == type(s)(device="cpu", matmul32=2 * n ** 3 / 2.0, solve_matmul=2 * n ** 3 / 2.0, eigh_n=n, eigh_s=2.0,
                        svd_shape=(n, n // 2), svd_s=2.0, bandwidth=3 * (2 * n) ** 2 * 8 / 2.0, solve_dtype="float32")
    assert measure_speed("cpu", n, "float32") is s  # once per device, size and precision in a process


def test_model_positions_and_config_refusals(tmp_path):
    import json
    from types import SimpleNamespace

    from acbench.measure.costs import load_model_config, model_positions
    from acbench.core.errors import UserError

    assert model_positions(SimpleNamespace(max_position_embeddings=512)) == 512
    assert model_positions(SimpleNamespace(text_config=SimpleNamespace(max_position_embeddings=256))) == 256
    assert model_positions(SimpleNamespace(max_position_embeddings=None,
                                           text_config=SimpleNamespace(max_position_embeddings=128))) == 128
    assert model_positions(SimpleNamespace(max_position_embeddings=True)) is None
    assert model_positions(SimpleNamespace(max_position_embeddings=1e6)) is None and model_positions(object()) is None

    def refusal(model):
        with pytest.raises(UserError) as e:
            load_model_config(str(model))
        return str(e.value)

    assert refusal(tmp_path / "m.gguf") == (f"model file {tmp_path / 'm.gguf'} does not exist: pass a .gguf, a "
                                            "config.json or a checkpoint folder")
    assert refusal(tmp_path) == (f"{tmp_path / 'config.json'} does not exist: pass a checkpoint folder or its "
                                 "config.json")
    (tmp_path / "c.json").write_text(json.dumps({"hidden_size": 8}))
    assert refusal(tmp_path / "c.json") == f"{tmp_path / 'c.json'} has no model_type: pass a transformers config.json"
    (tmp_path / "l.json").write_text("[1, 2]")
    assert refusal(tmp_path / "l.json") == f"{tmp_path / 'l.json'} has no model_type: pass a transformers config.json"
    (tmp_path / "bad.json").write_text("{not json")
    assert refusal(tmp_path / "bad.json") == (
        f"no config for model '{tmp_path / 'bad.json'}' (Expecting property name enclosed in double quotes: line 1 "
        "column 2 (char 1)): pass a local config.json, checkpoint folder or .gguf")
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    cfg = load_model_config(str(tmp_path / "config.json"))
    assert (cfg.model_type, cfg.hidden_size, cfg.num_key_value_heads) == ("llama", 64, 2)
    assert load_model_config(str(tmp_path)).to_dict() == cfg.to_dict()


def test_a_multimodal_config_plans_its_text_model_and_odd_ratios_round_per_group(tmp_path):
    import json

    from transformers import Gemma3Config, Gemma3TextConfig

    text = Gemma3TextConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=16, vocab_size=100)
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
              "image_size": 32, "patch_size": 16}
    (tmp_path / "config.json").write_text(json.dumps(Gemma3Config(text_config=text.to_dict(),
                                                                  vision_config=vision).to_dict()))
    plan = make_plan(str(tmp_path), ["pca"], [0.3])
    assert plan.model == str(tmp_path)
    # the sizes are the text model's, not the (absent) top-level ones
    assert plan.config == {"model_type": "gemma3", "hidden_size": 64, "intermediate_size": 128,
                           "num_hidden_layers": 2, "vocab_size": 100}
    assert [(k["kind"], k["d_in"], k["d_outs"]) for k in plan.kinds] == [
        ("attn_in", 64, (64, 32, 32)), ("attn_out", 64, (64,)), ("mlp_in", 64, (128, 128)), ("mlp_out", 128, (64,))]
    # k = round(0.3 d) with no alignment by default: 19 of 64, 38 of 128
    assert {kind: v["k"] for kind, v in plan.methods["pca"][0.3]["per_kind"].items()} == {
        "attn_in": [19] * 3, "attn_out": [19], "mlp_in": [19] * 2, "mlp_out": [38]}
    aligned = make_plan(str(tmp_path), ["pca"], [0.3], align=8)
    assert aligned.methods["pca"][0.3]["per_kind"]["attn_in"]["k"] == [24] * 3  # 19 rounded up to a multiple of 8
    assert aligned.ranks == [RankSpec(0.3, "rank", 8)] and plan.ranks == [RankSpec(0.3, "rank", 1)]  # for the times


def test_a_config_the_model_check_refuses_is_named_by_the_model_given(monkeypatch):
    """A config that reaches the plan without a config.json (an alias, a .gguf header, the hub) is checked there, and
    the refusal names the model as the user gave it."""
    import acbench.measure.costs as costs
    from acbench.core.errors import UserError
    from transformers import LlamaConfig

    cfg = LlamaConfig(**{k: v for k, v in TINY.items() if k != "model_type"})
    cfg.num_hidden_layers = 0
    monkeypatch.setattr(costs, "load_model_config", lambda model: cfg)
    with pytest.raises(UserError) as e:
        make_plan("org/model", ["pca"], [0.5])
    assert str(e.value) == ("model org/model: config.json's num_hidden_layers is 0, not a positive integer: fix the "
                            "config (or re-save the checkpoint with save_pretrained)")


def test_an_alias_plans_from_its_converted_config_or_else_its_gguf_header(tmp_path, monkeypatch):
    import json

    import acbench.measure.costs as costs
    import acbench.model.sources as models
    import transformers

    (tmp_path / "gemma-3-270m").mkdir()
    (tmp_path / "gemma-3-270m" / "config.json").write_text(json.dumps(TINY))  # what `bench prepare` converted
    monkeypatch.setattr(costs, "_cache_models", lambda: tmp_path)
    assert costs.load_model_config("gemma-3-270m").hidden_size == 64
    # not converted yet: the .gguf header the data package installed (its reader faked: parsing takes seconds)
    (tmp_path / "gemma-3-270m" / "config.json").unlink()
    asked, real = [], transformers.AutoConfig.from_pretrained
    monkeypatch.setattr(models, "_alias_gguf", lambda name: tmp_path / "pkg" / f"{name}.gguf")
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained",
                        lambda path, **kw: asked.append((path, kw)) or real(str(CONFIGS / "llama-3-8b")))
    assert costs.load_model_config("gemma-3-270m").hidden_size == 4096
    assert asked == [(str(tmp_path / "pkg"), {"gguf_file": "gemma-3-270m.gguf"})]


def test_peaks_of_a_sparsity_only_plan_and_of_a_row_fisher_one(tiny):
    params = PARAMS
    sparse = make_plan(tiny, ["act-sparse"], [0.5], sparsity=[SparsitySpec.parse("2:4")])
    # no low-rank factors on top of the dense weights: the weights and the logits of one batch
    assert sparse.evaluation_peak == 4 * params + 2 * 256 * 100 * 4 and sparse.calibration_peak == 0
    fw = make_plan(tiny, ["fwsvd"], [0.5])  # the row Fisher alone needs the backward
    assert fw.needs == {"row_fisher"}
    assert fw.activation_bytes == 512 * (6 * 64 + 4 * 128) * 2 * 4 + 512 * 100 * 4


def test_config_sources_and_their_refusals(tmp_path, monkeypatch):
    """A .gguf file's header, a hub id, and what their loader's errors become: the first line, at most 160
    characters, or the error's type when it says nothing."""
    import json

    import acbench.measure.costs as costs
    import transformers
    from acbench.core.errors import UserError

    asked, real = [], transformers.AutoConfig.from_pretrained
    answer = {"raise": None}

    def fake(path, **kw):
        asked.append((path, kw))
        if answer["raise"]:
            raise answer["raise"]
        return real(str(CONFIGS / "llama-3-8b"))

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", fake)
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    costs.load_model_config(str(tmp_path / "m.gguf"))
    costs.load_model_config("org/model")
    assert asked == [(str(tmp_path), {"gguf_file": "m.gguf"}), ("org/model", {})]
    for error, said in ((OSError(), "OSError"), (ValueError("x" * 200 + "\nmore"), "x" * 160),
                        (KeyError("rope_type"), "'rope_type'")):
        answer["raise"] = error
        with pytest.raises(UserError) as e:
            costs.load_model_config("org/model")
        assert str(e.value) == (f"no config for model 'org/model' ({said}): pass a local config.json, checkpoint "
                                "folder or .gguf")
    bad = dict(TINY, num_hidden_layers=0)
    (tmp_path / "config.json").write_text(json.dumps(bad))
    with pytest.raises(UserError) as e:
        costs.load_model_config(str(tmp_path))
    assert str(e.value) == (f"{tmp_path / 'config.json'}: config.json's num_hidden_layers is 0, not a positive "
                            "integer: fix the config (or re-save the checkpoint with save_pretrained)")


@pytest.mark.parametrize("extra", [["--calib-seq-len", "100000"], ["--rank-align", "1000"], ["--blocks", "0-50"],
                                   ["--blocks", "0-1000000000"], ["--stats-memory", "1KB"]])
def test_plan_refuses_what_run_refuses_in_the_same_words(tmp_path, capsys, extra):
    """A plan once priced terabytes and 10^34 seconds for settings a run refuses, and built a billion block
    indices in memory: both now stop at the same check, with the same line."""
    from acbench.cli import main
    from acbench.cli.smoke import tiny_checkpoint

    lines = {}
    for cmd in ("plan", "run"):
        argv = [cmd, "--model", str(tiny_checkpoint()), "--methods", "pca", "--rank", "0.5", *extra]
        if cmd == "run":
            argv += ["--output", str(tmp_path / "out"), "--no-report", "--quiet", "--tasks", "ppl-token"]
        assert main(argv) == 2
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(err) == 1, err
        lines[cmd] = err[0].split("error: ", 1)[1]
    assert lines["plan"] == lines["run"]
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").rglob("*.json"))


def test_a_resolved_run_is_costed_with_its_own_settings():
    """estimate_run_costs reads every setting from the run bench plan resolved, none from defaults: each changed
    flag changes the estimate as estimate_costs given that value does."""
    from acbench.cli import _parser
    from acbench.cli.plan import plan_config
    from acbench.measure.costs import estimate_run_costs
    from acbench.runner.resolve import resolve_run

    model = str(CONFIGS / "llama-3-8b")
    flags = ["--model", model, "--methods", "pca", "fasc-kfac", "act-sparse", "--rank", "0.5", "0.25",
             "--sparsity", "2:4", "--budget", "params", "--rank-align", "8", "--dtype", "bfloat16",
             "--stats-memory", "16GB", "--calib-samples", "6", "--calib-seq-len", "128", "--batch-size", "8",
             "--pair-tokens", "256"]
    run = resolve_run(plan_config(_parser().parse_args(["plan", *flags])), writes=False)
    got = estimate_run_costs(run)
    want = make_plan(model, ["pca", "fasc-kfac", "act-sparse"], [0.5, 0.25], "params", 8, "bfloat16",
                     parse_bytes("16GB"), 6, 128, 4, 256, sparsity=[SparsitySpec.parse("2:4")])
    def costed(est):  # every field but the meta model's groups (module objects, equal by name and shape only)
        import dataclasses

        return {**dataclasses.asdict(dataclasses.replace(est, groups=[])),
                "groups": [(g.name, g.d_in, g.d_outs) for g in est.groups]}

    assert costed(got) == costed(want)
    assert costed(got) != costed(make_plan(model, ["pca", "fasc-kfac", "act-sparse"], [0.5, 0.25]))


def test_a_plan_of_an_architecture_without_intermediate_size(tmp_path):
    """GPT-J's config names no intermediate_size (its MLP is 4 x hidden): the plan takes 4 x hidden, and finds its
    parallel block's groups (attention and MLP read one input) from the config alone, through a traced twin."""
    import warnings

    from transformers import GPTJConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        GPTJConfig(n_embd=64, n_layer=2, n_head=4, vocab_size=100, rotary_dim=8, n_positions=128,
                   bos_token_id=1, eos_token_id=2).save_pretrained(tmp_path)
    plan = make_plan(str(tmp_path), ["fasc-kfac"], [0.5], calib_seq_len=16, batch_size=2)
    assert plan.config["intermediate_size"] == 256
    assert [k["kind"] for k in plan.kinds] == ["attn_mlp_in", "attn_out", "mlp_out"]
    assert plan.kinds[0]["d_outs"] == (64, 64, 64, 256)  # q, k, v and fc_in read the one normed input
    tokens = 2 * 16  # the activations kept for the backward: 6 hidden and 4 intermediate numbers per token and block
    # and one batch of logits, which take their own gradient
    assert plan.activation_bytes == tokens * (6 * 64 + 4 * 256) * 2 * 4 + tokens * 100 * 4


def test_the_calibrations_of_their_own_by_hand(tiny):
    """Wanda's authors' sequential 262,144 tokens: every block twice (statistics, compressed output) and the
    capture of its first two batches; whitened SVD's one-pass 524,288: the forward, stopped before the LM head (it
    reads no gradient). Each with x^T x per group."""
    from acbench.cli import _parser
    from acbench.cli.plan import plan_config
    from acbench.measure.costs import estimate_run_costs, own_calibration_costs
    from acbench.runner.resolve import resolve_run

    flags = ["--model", tiny, "--methods", "wanda", "whitened-svd", "--sparsity", "0.5", "--rank", "0.8",
             "--budget", "params", "--calibration", "authors"]
    run = resolve_run(plan_config(_parser().parse_args(["plan", *flags])), writes=False)
    costs = {c["method"]: c for c in own_calibration_costs(run, estimate_run_costs(run), _speed(matmul32=1e10))}
    assert costs["wanda"]["mode"] == "sequential" and costs["whitened-svd"]["mode"] == "one-pass"
    squares = 2 * 2 * SQUARES  # two blocks, 2 per x^T x entry
    captured = 2 * max(1, run.config.batch_size // 2) * 2048
    want = (262144 * (4 * LINEAR + squares) + captured * 2 * LINEAR) / 1e10
    assert costs["wanda"]["seconds"] == pytest.approx(want, rel=1e-12)
    assert costs["whitened-svd"]["seconds"] == pytest.approx(524288 * (2 * LINEAR + squares) / 1e10, rel=1e-12)
    # sequential holds the weights, the windows' hidden states and one block's statistics; the capture stops at the
    # LM head, so no batch of logits
    from acbench.calibration.memory import stat_bytes

    est, needs = estimate_run_costs(run), run.compressor("wanda").required_stats()
    block = max(sum(sum(stat_bytes(g, needs, 0).values()) for g in est.groups if g.block == b) for b in range(2))
    assert costs["wanda"]["peak"] == est.weight_bytes + 262144 * est.config["hidden_size"] * 4 + block


def _device_speed(eigh_s: float):
    from acbench.measure.costs import DeviceSpeed

    return DeviceSpeed(device="cpu", matmul32=1e11, solve_matmul=5e10, eigh_n=1024, eigh_s=eigh_s, svd_shape=(1024, 512),
                       svd_s=eigh_s, bandwidth=1e10)


def test_a_solve_of_minutes_is_said_before_any_work():
    """One 8,192-wide group (a tiny deepseek_v4's attention output) solves for minutes on two cores: the line names
    the method, the group, its width, how long and the fixes; narrow groups are never measured, and a fast device
    says nothing."""
    from acbench.measure.costs import LONG_SOLVE_S, long_solve_line
    from acbench.model.groups import InputGroup
    from acbench.core.stats import RankSpec

    wide = InputGroup("layers.0.attn_out", 0, "attn_out", ("o",), (torch.nn.Linear(8192, 64, bias=False),))
    narrow = InputGroup("layers.0.attn_in", 0, "attn_in", ("q",), (torch.nn.Linear(2048, 64, bias=False),))
    ranks = [RankSpec(0.5)]
    # eigh of 1,024 in 0.08 s: 8,192 is 512x that, 41 s for pca's one eigh; at 0.2 s, 102 s
    assert long_solve_line(["pca"], [wide, narrow], ranks, 512, "cpu", "float64", _device_speed(0.08)) is None
    line = long_solve_line(["pca", "wanda"], [wide, narrow], ranks, 512, "cpu", "float64", _device_speed(0.2))
    assert line.startswith("one pca solve of layers.0.attn_out (d_in 8,192) takes about 2 minutes on cpu (float64)")
    assert "--groups (e.g. without attn_out)" in line and "--solve-device cuda" in line
    assert 0.2 * 512 > LONG_SOLVE_S > 0.08 * 512
    assert long_solve_line(["pca"], [narrow], ranks, 512, "cpu", "float64", speed=None) is None  # never measured


def test_the_plan_warns_of_an_8b_solve_on_this_machine(capsys):
    from acbench.measure.costs import measure_speed

    rc = main(["plan", "--model", str(CONFIGS / "llama-3-8b"), "--methods", "pca", "--rank", "0.5"])
    out = capsys.readouterr().out
    speed = measure_speed("cpu")
    if speed.eigh_s * 14 ** 3 > 60:  # this machine: one 14,336-wide eigh past a minute
        assert rc == 0 and "warning: one pca solve of layers.0.mlp_out (d_in 14,336) takes about" in out
