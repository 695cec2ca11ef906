"""Rank allocation across groups (acbench.deploy.allocation) and group/block selection (acbench.runner.selection)."""

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from acbench.deploy.allocation import allocate
from acbench.calibration.engine import CalibSpec, calibrate
from acbench.deploy.compression import compressed
from acbench.model.groups import find_input_groups
from acbench.runner.selection import Selection, format_blocks, parse_blocks
from acbench.core.errors import UserError
from acbench.core.stats import GroupStats, RankSpec

from conftest import tiny_model


@dataclass
class FakeGroup:
    name: str
    d_in: int
    d_outs: tuple


def psd(d, seed, scale=1.0, decay=0.9):
    gen = torch.Generator().manual_seed(seed)
    Q, _ = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))
    return scale * (Q * decay ** torch.arange(d, dtype=torch.float64)) @ Q.T


def synthetic(shapes, f_scale=None, seed=0):
    groups = [FakeGroup(f"layers.{i}.g", d, outs) for i, (d, outs) in enumerate(shapes)]
    stats = {g.name: GroupStats(C=psd(g.d_in, seed + 2 * i), F=psd(g.d_in, seed + 2 * i + 1,
                                                                   (f_scale or {}).get(i, 1.0)))
             for i, g in enumerate(groups)}
    return groups, stats


@pytest.mark.parametrize("ratio", [0.2, 0.45, 0.7, 0.95])
@pytest.mark.parametrize("rule", ["fisher", "variance"])
def test_budget_met_within_one_direction(rule, ratio):
    groups, stats = synthetic([(48, (48, 16, 16)), (48, (48,)), (96, (48,)), (48, (96, 96))], seed=3)
    a = allocate(rule, groups, stats, RankSpec(ratio, "params"))
    per_dir = max(g.d_in + sum(g.d_outs) for g in groups)
    assert a.allocated_params <= a.budget_params
    assert a.budget_params - a.allocated_params < per_dir
    # the spent parameters are what the chosen ks deploy (factorised, or dense for a group kept whole)
    deployed = sum(min(a.ks[g.name] * (g.d_in + sum(g.d_outs)), g.d_in * sum(g.d_outs)) for g in groups)
    assert deployed == a.allocated_params
    assert all(1 <= a.ks[g.name] <= g.d_in for g in groups)


def test_group_with_100x_fisher_gets_more_rank():
    shapes = [(64, (64,))] * 4
    groups, stats = synthetic(shapes, f_scale={2: 100.0})
    fisher = allocate("fisher", groups, stats, RankSpec(0.4, "params"))
    others = [fisher.ks[g.name] for i, g in enumerate(groups) if i != 2]
    assert fisher.ks["layers.2.g"] > max(others)
    # variance ignores F: the same C spectra get about the same k, and group 2 gets nothing extra
    variance = allocate("variance", groups, stats, RankSpec(0.4, "params"))
    assert max(variance.ks.values()) - min(variance.ks.values()) <= 1


def test_merge_is_taken_when_a_group_carries_the_loss():
    # One group's lambdas dwarf the others: keeping all of it (merged, at dense cost) beats anything else
    groups, stats = synthetic([(32, (32,)), (32, (32,)), (32, (32,))], f_scale={1: 1e6})
    a = allocate("fisher", groups, stats, RankSpec(0.6, "params"))
    assert a.ks["layers.1.g"] == 32


def test_uniform_is_the_rank_spec():
    groups, stats = synthetic([(48, (48, 16, 16)), (96, (48,))])
    r = RankSpec(0.5, "params")
    a = allocate("uniform", groups, stats, r)
    assert a.ks == {g.name: r.k_group(g.d_in, g.d_outs) for g in groups}


def test_allocated_ks_deploy_exactly_the_allocated_parameters(windows):
    model = tiny_model("llama", hidden=32, inter=96, layers=3)
    groups = find_input_groups(model)
    stats = calibrate(model, groups, windows, frozenset({"C", "F"}), CalibSpec(), progress=False)
    for rule in ("fisher", "variance"):
        a = allocate(rule, groups, stats, RankSpec(0.5, "params"))
        for method in ("pca", "fasc-kfac", "whitened-svd"):
            with compressed(model, method, RankSpec(0.5, "params"), stats, ks=a.ks, progress=False) as (_, summaries):
                assert sum(s["params_deployed"] for s in summaries) == a.allocated_params
                assert {s["group"]: s["k"] for s in summaries} == a.ks


def test_selection_parsing_and_scope():
    assert parse_blocks("0-5,12") == (0, 1, 2, 3, 4, 5, 12)
    assert parse_blocks("3, 1-2") == (1, 2, 3)
    assert format_blocks((0, 1, 2, 5, 7, 8)) == "0-2,5,7-8"
    for bad in ("0-x", "5-2", "", "-1"):
        with pytest.raises(UserError, match="--blocks"):
            parse_blocks(bad)
    s = Selection.from_flags(["mlp_out", "attn_in"], "12,0-5").resolve(18)
    assert s.scope == "groups=attn_in,mlp_out;blocks=0-5,12"
    # everything, spelled out, is the default selection: every kind the model has (a Llama's four)
    llama = ("attn_in", "attn_out", "mlp_in", "mlp_out")
    assert Selection.from_flags(list(llama), "0-17").resolve(18, llama).scope == "all"
    assert Selection.from_flags(list(llama), None).resolve(18, ("attn_mlp_in", "attn_out", "mlp_out")).scope == \
        "groups=attn_out,mlp_out"  # a parallel block's shared input group is not among the four
    with pytest.raises(UserError, match="this model has no such groups; its kinds are attn_in, attn_out"):
        Selection.from_flags(["attn_mlp_in"], None).resolve(18, llama)
    with pytest.raises(UserError, match="block 18 does not exist, the model has 18 blocks"):
        Selection.from_flags(None, "0,18").resolve(18)
    with pytest.raises(UserError, match="Did you mean 'mlp_in'"):
        Selection.from_flags(["mlp_inn"], None)


def _run(tmp, out, *extra):
    from acbench.cli import main
    from acbench.cli.smoke import tiny_checkpoint

    argv = ["run", "--model", str(tiny_checkpoint()), "--methods", "pca", "fasc-kfac", "--rank", "0.6",
            "--budget", "params", "--tasks", "ppl-token", "--calib-samples", "4", "--calib-seq-len", "64",
            "--ppl-windows", "2", "--ppl-seq-len", "64", "--output", str(out), "--quiet", "--no-latency", *extra]
    assert main(argv) == 0


def _cells(out: Path) -> dict:
    return {str(p.relative_to(out)): json.loads(p.read_text()) for p in sorted(out.rglob("*.json"))
            if not p.name.startswith(".") and p.name != "LEADERBOARD.json"}


def test_flags_end_to_end(tmp_path, capsys):
    plain, uniform = tmp_path / "plain", tmp_path / "uniform"
    _run(tmp_path, plain, "--no-report")
    _run(tmp_path, uniform, "--no-report", "--allocate", "uniform")
    a, b = _cells(plain), _cells(uniform)
    assert a.keys() == b.keys()  # same cells, same keys: uniform is today's behaviour
    for path in a:
        assert a[path]["metrics"] == b[path]["metrics"], path

    out = tmp_path / "alloc"
    _run(tmp_path, out, "--allocate", "uniform,fisher", "variance", "--groups", "mlp_in,mlp_out", "--blocks", "0")
    cells = _cells(out)
    seen = {(c["cell"]["method"], c["cell"]["allocation"], c["cell"]["scope"]) for c in cells.values()}
    scope = "groups=mlp_in,mlp_out;blocks=0"
    assert seen == {("dense", "uniform", "all")} | {(m, r, scope) for m in ("pca", "fasc-kfac")
                                                    for r in ("uniform", "fisher", "variance")}
    for c in cells.values():
        comp = c["compression"]
        if comp is None:
            continue
        assert {g["group"] for g in comp["groups"]} == {"layers.0.mlp_in", "layers.0.mlp_out"}
        alloc = comp["allocation"]
        if c["cell"]["allocation"] != "uniform":
            assert alloc["rule"] == c["cell"]["allocation"]
            assert alloc["allocated_params"] == comp["params_deployed"] <= alloc["budget_params"]
            assert {g["group"]: g["k"] for g in comp["groups"]} == alloc["k"]
            assert "allocate_s" in c["timings"]
    # the uniform cells of a selection are not today's all-group cells
    assert not set(cells) & {p for p in a if "dense" not in p}
    md = (out / "LEADERBOARD.md").read_text()
    assert "### params ratio 0.6, groups mlp_in, mlp_out; blocks 0" in md
    assert "| fasc-kfac+fisher" in md and "| pca+variance" in md
    assert "k per group, by block:" in md and any((out / "plots").glob("*_k_params_0.6_*.png"))
    # a rerun computes nothing
    before = {p: c["env"]["date"] for p, c in cells.items()}
    capsys.readouterr()
    _run(tmp_path, out, "--allocate", "uniform", "fisher", "variance", "--groups", "mlp_out,mlp_in", "--blocks", "0-0")
    log = capsys.readouterr()
    assert "0 cell(s) to compute" in log.out + log.err
    assert {p: c["env"]["date"] for p, c in _cells(out).items()} == before


# ---------------------------------------------------------------- density allocation (activation sparsity)

def _hist(values):
    from acbench.core.stats import magnitude_histogram

    return magnitude_histogram(torch.as_tensor(values, dtype=torch.float32))


@pytest.mark.parametrize("density", [0.9, 0.5, 0.25, 0.05])
def test_lost_energy_is_the_smallest_values_share_of_the_energy(density):
    """Against the sorted values themselves: the (1 - density) smallest |x| carry this fraction of sum x^2."""
    import numpy as np

    from acbench.deploy.allocation import lost_energy

    x = np.random.default_rng(3).standard_t(3, size=200_000)
    a = np.sort(np.abs(x))
    n_lost = int(round((1 - density) * a.size))
    want = float((a[:n_lost] ** 2).sum() / (a ** 2).sum())
    # the histogram puts a bin's values at its centre: 12 decades in 4096 bins, under 0.4 % of a value apart
    assert lost_energy(_hist(x), density) == pytest.approx(want, rel=0.01, abs=1e-4)


def _density_case(seed=0):
    """Three groups of different widths: Gaussian inputs, heavy-tailed ones (a few large values carry the energy,
    so zeroing small ones loses little), and uniform ones (every value matters alike)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    groups = [FakeGroup("layers.0.gauss", 64, (96,)), FakeGroup("layers.0.heavy", 96, (64, 64)),
              FakeGroup("layers.1.flat", 32, (48,))]
    draws = [rng.standard_normal(50_000), rng.standard_t(1.5, 50_000), rng.uniform(-1, 1, 50_000)]
    return groups, {g.name: GroupStats(abs_hist=_hist(v)) for g, v in zip(groups, draws)}


@pytest.mark.parametrize("target", [0.75, 0.6, 0.5, 0.4, 0.3, 0.2])
def test_greedy_density_meets_the_target_and_matches_brute_force(monkeypatch, target):
    """On a grid of eighths, the greedy's allocation has the least total lost energy among every allocation that
    reads no more weights than it does (a brute force over all 8^3 level triples), and reads the target within one
    step of the largest group."""
    import itertools

    import acbench.deploy.allocation as alloc_mod
    from acbench.deploy.allocation import allocate_density, lost_energy
    from acbench.core.stats import SparsitySpec

    monkeypatch.setattr(alloc_mod, "DENSITY_STEP", 1 / 8)
    groups, stats = _density_case()
    a = allocate_density("greedy", groups, stats, SparsitySpec(density=target))
    params = {g.name: g.d_in * sum(g.d_outs) for g in groups}
    total = sum(params.values())
    reads = sum(a.densities[g] * params[g] for g in params) / total
    assert reads == pytest.approx(a.allocated) and reads <= target + 1e-12
    assert target - reads <= max(params.values()) / 8 / total + 1e-12
    # the greedy as a sort: every group's steps by lost energy per weight read saved (convex curves: each group's
    # steps come in its own order), taken cheapest first until the target is read
    curves = {g: [lost_energy(stats[g].abs_hist, i / 8) for i in range(9)] for g in params}
    moves = sorted(((curves[g][lv - 1] - curves[g][lv]) / params[g], order, -lv, g)
                   for order, g in enumerate(params) for lv in range(8, 1, -1))
    level, read = dict.fromkeys(params, 8), float(total)
    for _, _, minus_lv, g in moves:
        if read <= target * total * (1 + 1e-9):
            break
        assert level[g] == -minus_lv  # convex: never a group's later step before its earlier one
        level[g], read = level[g] - 1, read - params[g] / 8
    assert a.densities == {g: lv / 8 for g, lv in level.items()}
    got = sum(lost_energy(stats[g].abs_hist, a.densities[g]) for g in params)
    best = min(sum(lost_energy(stats[g].abs_hist, lv / 8) for g, lv in zip(params, levels))
               for levels in itertools.product(range(1, 9), repeat=3)
               if sum(lv / 8 * params[g] for g, lv in zip(params, levels)) <= reads * total + 1e-9)
    assert got == pytest.approx(best, abs=1e-12)
    # heavy tails lose least per channel zeroed, so that group ends sparsest and the uniform one densest
    d = a.densities
    assert d["layers.0.heavy"] <= d["layers.0.gauss"] <= d["layers.1.flat"] and d["layers.0.heavy"] < d["layers.1.flat"]


def test_greedy_density_refuses_patterns_and_missing_histograms():
    from acbench.deploy.allocation import allocate_density
    from acbench.core.stats import SparsitySpec

    groups, stats = _density_case()
    with pytest.raises(UserError, match="2:4 keeps one N:M pattern"):
        allocate_density("greedy", groups, stats, SparsitySpec.parse("2:4"))
    stats["layers.1.flat"] = GroupStats()
    with pytest.raises(UserError, match="group layers.1.flat has no"):
        allocate_density("greedy", groups, stats, SparsitySpec(density=0.5))


def test_allocated_densities_deploy_per_group(windows):
    """teal and act-sparse under a greedy allocation: each group's summary carries its allocated density, and
    the parameter-weighted compute ratio is the allocation's density."""
    from acbench.deploy.allocation import allocate_density
    from acbench.core.stats import SparsitySpec

    model = tiny_model("llama", hidden=32, inter=96, layers=2)
    groups = find_input_groups(model)
    stats = calibrate(model, groups, windows, frozenset({"abs_hist"}), CalibSpec(), progress=False)
    a = allocate_density("greedy", groups, stats, SparsitySpec(density=0.5))
    assert len(set(a.densities.values())) > 1  # not uniform on real activations
    for method in ("teal", "act-sparse"):
        with compressed(model, method, SparsitySpec(density=0.5), stats, densities=a.densities,
                        progress=False) as (_, summaries):
            assert {s["group"]: s["density"] for s in summaries} == a.densities


def test_greedy_rule_is_checked_against_the_run(tmp_path):
    from acbench.runner.cells import variants
    from acbench.runner.config import RunConfig
    from acbench.runner.resolve import resolve_run

    def run(**kw):
        return resolve_run(RunConfig(model="m", tasks=["ppl-token"], output=str(tmp_path), **kw), writes=False)

    r = run(methods=["act-sparse", "pca"], sparsity=["0.5", "8:16"], ranks=[0.5], allocate=["uniform", "greedy"])
    got = {(m, b.budget, b.ratio, rule) for m, b, rule in variants(r)}
    # greedy at the density only: an N:M pattern is one pattern everywhere, and pca keeps a rank
    assert got == {("act-sparse", "unstructured", 0.5, "uniform"), ("act-sparse", "unstructured", 0.5, "greedy"),
                   ("act-sparse", "8:16", 0.5, "uniform"), ("pca", "rank", 0.5, "uniform")}
    for kw, match in [(dict(methods=["act-sparse"], sparsity=["8:16"], allocate=["greedy"]), "unstructured density"),
                      (dict(methods=["pca"], ranks=[0.5], allocate=["greedy"]), "keep a rank"),
                      (dict(methods=["act-sparse"], sparsity=["0.5", "2:4"], allocate=["greedy"]),
                       "does not apply to N:M patterns"),
                      (dict(methods=["teal"], sparsity=["0.5"], allocate=["fisher"], budget="params"),
                       "add uniform \\(or greedy")]:
        with pytest.raises(UserError, match=match):
            run(**kw)


def test_greedy_density_stops_at_a_reachable_target_despite_float_drift(monkeypatch):
    """Steps of a tenth: 0.6 of these groups' weights is reachable exactly, and the running sum of reads lands a
    rounding error above it; the greedy stops there instead of taking one more step."""
    import acbench.deploy.allocation as alloc_mod
    from acbench.core.stats import SparsitySpec

    monkeypatch.setattr(alloc_mod, "DENSITY_STEP", 1 / 10)
    groups, stats = _density_case(0)
    a = alloc_mod.allocate_density("greedy", groups, stats, SparsitySpec(density=0.6))
    assert a.allocated == pytest.approx(0.6, abs=1e-9)


def test_allocation_rules_are_refused_in_one_line_each():
    from acbench.deploy.allocation import check_rules

    with pytest.raises(UserError, match=r"^--allocate fishr is unknown\. Did you mean 'fisher'\? Known: fisher, "
                                        r"greedy, uniform, variance\.$"):
        check_rules(["uniform", "fishr"], "params")
    with pytest.raises(UserError, match=r"^--allocate zzz is unknown\. Known: fisher, greedy, uniform, variance\.$"):
        check_rules(["zzz"], "params")
    with pytest.raises(UserError, match=r"^--allocate variance splits one parameter budget across groups: add "
                                        r"--budget params \(--rank is then the deployed/dense parameter ratio of the "
                                        r"selected groups\)$"):
        check_rules(["variance"], "rank")
    check_rules(["uniform", "greedy"], "rank")  # neither splits a parameter budget
    check_rules(["fisher", "variance"], "params")  # aligned to 1 by default
    with pytest.raises(UserError, match=r"^--allocate fisher keeps single directions: it does not combine with "
                                        r"--rank-align 8 \(leave --rank-align out\)$"):
        check_rules(["uniform", "fisher"], "params", 8)
    check_rules(["uniform", "greedy"], "rank", 8)  # the rules that keep whole groups' ratios align as usual


def test_an_allocation_times_its_two_stages():
    groups, stats = synthetic([(32, (32,)), (32, (32,))])
    a = allocate("fisher", groups, stats, RankSpec(0.5, "params"))
    assert set(a.seconds) == {"values_s", "greedy_s"} and all(0 <= v < 60 for v in a.seconds.values())
    assert a.rule == "fisher" and allocate("uniform", groups, stats, RankSpec(0.5)).rule == "uniform"


def test_no_energy_is_lost_at_full_density():
    from acbench.deploy.allocation import lost_energy

    assert lost_energy(_hist([0.1, -2.0, 30.0]), 1.0) == 0.0 and lost_energy(_hist([0.1, -2.0, 30.0]), 0.0) == 1.0


def test_an_allocation_below_every_groups_minimum_is_refused_with_its_rank():
    groups, stats = synthetic([(32, (32,)), (32, (32,))])
    with pytest.raises(UserError, match=r"^--rank 0\.01: a parameter budget of 20 is below the minimum ranks "
                                        r"of the selected groups \(128 parameters at 1 % of each group.s directions\): "
                                        r"raise --rank$"):
        allocate("fisher", groups, stats, RankSpec(0.01, "params"))
