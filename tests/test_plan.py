"""`bench plan` from hand-written configs of the paper's models: exact byte counts, no weights loaded."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.cli import main
from bench.costs import estimate_costs as make_plan
from core.stats import SparsitySpec
from core.units import parse_bytes

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
    from bench.costs import DeviceSpeed

    base = dict(device="cpu", matmul32=1e11, solve_matmul=4e10, eigh_n=1024, eigh_s=0.2, svd_shape=(1024, 512),
                svd_s=0.1, bandwidth=1e10)
    return DeviceSpeed(**{**base, **kw})


def test_plan_times_scale_by_the_declared_operations():
    from bench.costs import estimate_times as times_of

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
    from bench.costs import estimate_times

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
    import bench.costs

    monkeypatch.setattr(bench.costs, "measure_speed",
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
    from bench.costs import op_seconds
    from methods.base import factor_svd_ops, site_svd_ops

    op = ("", "truncated_svd", 4096, 1024)
    f64, f32 = _speed(), _speed(solve_dtype="float32")
    assert op_seconds(op, f64) == pytest.approx(2 * 4096 * 1024 ** 2 / 4e10 + 0.2)
    assert op_seconds(op, f32) == pytest.approx(0.1 * 4096 * 1024 ** 2 / (1024 * 512 ** 2))
    assert site_svd_ops(640, (2048, 256)) == [("", "truncated_svd", 2048, 640), ("", "truncated_svd", 256, 640)]
    assert factor_svd_ops(1536, 640, 320) == [("", "truncated_svd", 1536, 640)]
    assert factor_svd_ops(640, 1024, 512) == [("", "svd", 640, 1024)]  # k inside R's row space: the thin SVD
    # k beyond it: V square, the thin SVD and V formed from its reflectors
    assert factor_svd_ops(640, 2048, 1024) == [("", "svd", 640, 2048), ("", "flops", 4 * 2048 * 2048 * 640)]
