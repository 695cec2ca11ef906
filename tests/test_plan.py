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
