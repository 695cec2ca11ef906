"""--solve-dtype float32 (issue 24): float32 solves agree with float64 ones where the statistics are well
conditioned, record their fallbacks the way float64 does where they are not, memoise apart, and key their cells
apart; the default float64 leaves every key as it was."""

import json

import pytest
import torch

from acbench import methods
from acbench.model.groups import find_input_groups
from acbench.core.linalg import whitening_factor
from acbench.core.stats import GroupStats, RankSpec

from conftest import calibrated_tiny

LOW_RANK = [m for m in methods.known_methods() if methods.get_method(m).family == "low-rank"]


def _max_angle(B1: torch.Tensor, B2: torch.Tensor) -> float:
    """The largest principal angle (radians) between the row spaces of B1 and B2."""
    q1, q2 = torch.linalg.qr(B1.double().T)[0], torch.linalg.qr(B2.double().T)[0]
    return float(torch.arccos(torch.linalg.svdvals(q1.T @ q2).clamp(max=1)).max())


@pytest.fixture(scope="module")
def model_and_stats():
    return calibrated_tiny(windows=6, seq_len=32, pair_tokens=128)


def _well_conditioned(st: GroupStats) -> GroupStats:
    """The group's statistics with C and F given a clear eigen-gap at every k and condition number ~10: a float32
    solve's round-off (~1e-7) then moves each subspace by far less than the gap."""
    d = st.C.shape[0]
    gen = torch.Generator().manual_seed(d)
    Q = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))[0]
    spectrum = torch.linspace(10, 1, d, dtype=torch.float64)
    C = Q @ torch.diag(spectrum) @ Q.T
    F = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))[0]
    F = F @ torch.diag(spectrum) @ F.T
    return GroupStats(n_tokens=st.n_tokens, C=C, F=F, abs_mean=st.abs_mean.abs() + 1, mean=st.mean,
                      xs=st.xs, gs=st.gs, row_fisher={n: t.abs() + 1 for n, t in st.row_fisher.items()})


@pytest.mark.parametrize("name", LOW_RANK)
def test_float32_solves_agree_with_float64_where_well_conditioned(model_and_stats, name):
    """Every low-rank method: the kept input subspace of each site within 1e-3 rad of float64's, and the deployed
    weights A B within 1e-4 of their norm (fasc's swap choices must agree too: a different swap is a different
    subspace). Both precisions record the same fallbacks (none here)."""
    model, stats = model_and_stats
    comp = methods.build(name)
    for g in find_input_groups(model):
        st = _well_conditioned(stats[g.name])
        r64 = comp.compress(g, st, RankSpec(0.5))
        r32 = comp.compress(g, st, RankSpec(0.5), dtype=torch.float32)
        assert r32.fallbacks == r64.fallbacks
        for site, (A64, B64) in r64.factors.items():
            A32, B32 = r32.factors[site]
            assert _max_angle(B64, B32) < 1e-3, (name, g.name, site)
            W64, W32 = A64.double() @ B64.double(), A32.double() @ B32.double()
            assert float((W64 - W32).norm() / W64.norm()) < 1e-4, (name, g.name, site)


def test_fallbacks_are_recorded_alike_in_both_precisions():
    """Ill-conditioned C: rank-deficient (rank d/2, exactly) is reported with the same rank in both precisions; one
    that Cholesky cannot factor at any damping (negative definite) takes the eigh fallback in both."""
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(24, 48, generator=gen, dtype=torch.float64)
    deficient = X.T @ X / 24
    for C in (deficient, -deficient - torch.eye(48, dtype=torch.float64)):
        kinds = {}
        for dtype in (torch.float64, torch.float32):
            S, Sinv, fallbacks = whitening_factor(C, dtype=dtype)
            assert S.dtype == Sinv.dtype == dtype
            kinds[dtype] = [{k: v for k, v in f.items() if k != "note"} for f in fallbacks]
        assert kinds[torch.float32] == kinds[torch.float64] and kinds[torch.float64], kinds
    assert kinds[torch.float64][-1]["kind"] == "eigh-fallback"


def test_float32_solves_are_memoised_apart_from_float64(model_and_stats):
    model, stats = model_and_stats
    g = find_input_groups(model)[0]
    st = stats[g.name]
    st.memo.clear()
    methods.build("fasc-kfac").compress(g, st, RankSpec(0.5))
    methods.build("fasc-kfac").compress(g, st, RankSpec(0.5), dtype=torch.float32)
    assert st.memo["fisher_basis"]["U"].dtype == torch.float64
    inner = st.memo["on cpu torch.float32"]
    assert inner["fisher_basis"]["U"].dtype == torch.float32
    moved = st.on("cpu", torch.float32)
    assert moved.solve_dtype == torch.float32 and moved.C.dtype == torch.float32 and moved.memo is inner
    assert moved.xs.dtype == st.xs.dtype  # the token sample keeps its float32
    assert st.on("cpu") is st and st.on("cpu", torch.float64) is st


def _sweep(tiny, out, *extra):
    from acbench.cli import main

    argv = ["run", "--model", str(tiny), "--methods", "pca", "fasc", "act-sparse", "--rank", "0.5",
            "--sparsity", "2:4", "--tasks", "ppl-token", "--output", str(out), "--calib-samples", "2",
            "--calib-seq-len", "32", "--ppl-windows", "2", "--ppl-seq-len", "32", "--no-report", "--quiet",
            "--no-latency", *extra]
    assert main(argv) == 0
    return {p.relative_to(out).as_posix(): json.loads(p.read_text()) for p in sorted(out.rglob("*.json"))}


def test_solve_dtype_keys_low_rank_cells_apart_and_float64_keeps_the_default_keys(tmp_path):
    from acbench.cli.smoke import tiny_checkpoint

    tiny = tiny_checkpoint()
    default = _sweep(tiny, tmp_path / "a")
    f64 = _sweep(tiny, tmp_path / "b", "--solve-dtype", "float64")
    f32 = _sweep(tiny, tmp_path / "c", "--solve-dtype", "float32")
    assert list(default) == list(f64)
    assert all(default[p]["metrics"] == f64[p]["metrics"] for p in default)
    low_rank = {p for p, c in default.items() if c["cell"]["method"] in ("pca", "fasc")}
    assert low_rank and low_rank.isdisjoint(f32)  # new keys: a float32 cell never stands in for a float64 one
    same = set(default) - low_rank  # the dense model and the sparsity family: their keys do not move
    assert same and same <= set(f32) and all(default[p]["metrics"] == f32[p]["metrics"] for p in same)
    for c in f32.values():
        if c["cell"]["method"] in ("pca", "fasc"):
            assert c["compression"]["solve_dtype"] == "float32"
            # (how near float64's its numbers are is the well-conditioned test's and the README's business: these
            # 64 calibration tokens leave C rank-deficient)
        elif c["compression"]:
            assert c["compression"]["solve_dtype"] == "float64"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "fp32"])
def test_solve_dtype_refusals_are_one_line(tmp_path, capsys, dtype):
    from acbench.cli import main
    from acbench.cli.smoke import tiny_checkpoint

    rc = main(["run", "--model", str(tiny_checkpoint()), "--methods", "pca", "--tasks", "ppl-token",
               "--output", str(tmp_path / "out"), "--solve-dtype", dtype, "--quiet"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc == 2 and len(err) == 1 and "--solve-dtype" in err[0] and "float32" in err[0], err


def test_rank_allocation_solves_in_the_run_precision_and_memoises_there(model_and_stats):
    """The allocation's eigen-solves run on the solve device in the solve precision (memoised there, so the
    compression after it reuses them); on well-conditioned statistics the split is float64's, up to directions
    whose values tie within float32's round-off (the groups here share one spectrum)."""
    from acbench.deploy.allocation import allocate

    model, stats = model_and_stats
    groups = find_input_groups(model)
    well = {g.name: _well_conditioned(stats[g.name]) for g in groups}
    a64 = allocate("fisher", groups, well, RankSpec(0.5, budget="params"))
    a32 = allocate("fisher", groups, well, RankSpec(0.5, budget="params"), dtype=torch.float32)
    assert a32.ks.keys() == a64.ks.keys()
    assert max(abs(a32.ks[g] - a64.ks[g]) for g in a64.ks) <= 2
    assert abs(a32.allocated_params - a64.allocated_params) <= 2 * max(d + D for d, D in
                                                                       ((g.d_in, sum(g.d_outs)) for g in groups))
    for g in groups:
        assert well[g.name].memo["on cpu torch.float32"]["fisher_basis"]["lam"].dtype == torch.float32
        assert well[g.name].memo["fisher_basis"]["lam"].dtype == torch.float64
