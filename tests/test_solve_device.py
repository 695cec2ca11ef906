"""Solves create every tensor on their inputs' device (issue 24): with the default device set to "meta", a factory
call that forgets `device=` makes a meta tensor, and mixing it with the CPU statistics fails."""

import pytest
import torch

from acbench import methods
from acbench.deploy.allocation import allocate
from acbench.model.groups import find_input_groups
from acbench.core.stats import RankSpec, SparsitySpec

from conftest import calibrated_tiny


@pytest.fixture(scope="module")
def model_and_stats():
    return calibrated_tiny(windows=4, seq_len=24, pair_tokens=64)


@pytest.fixture
def meta_default():
    torch.set_default_device("meta")
    try:
        yield
    finally:
        torch.set_default_device(None)


def _budget(name):
    if methods.get_method(name).family == "low-rank":
        return RankSpec(0.5)
    nm = SparsitySpec.parse("2:4")
    return SparsitySpec.parse("0.5") if name == "median" or methods.get_method(name).pattern_problem(nm) else nm


@pytest.mark.parametrize("name", methods.known_methods())
def test_every_solve_creates_its_tensors_beside_its_inputs(model_and_stats, meta_default, name):
    model, stats = model_and_stats
    comp = methods.build(name)
    for g in find_input_groups(model):
        stats[g.name].memo.clear()  # solve from scratch: the memoised bases are created here too
        res = comp.compress(g, stats[g.name], _budget(name))
        for t in _tensors(res):
            assert t.device.type == "cpu", f"{name}: a {tuple(t.shape)} tensor of the result is on {t.device}"


@pytest.mark.parametrize("rule", ["fisher", "variance"])
def test_rank_allocation_creates_its_tensors_beside_its_inputs(model_and_stats, meta_default, rule):
    model, stats = model_and_stats
    for st in stats.values():
        st.memo.clear()
    alloc = allocate(rule, find_input_groups(model), stats, RankSpec(0.5, budget="params"))
    assert sum(alloc.ks.values()) > 0


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)
    elif hasattr(obj, "__dict__"):
        for v in vars(obj).values():
            yield from _tensors(v)


def test_group_stats_on_a_device_moves_every_tensor_and_shares_the_memo(model_and_stats):
    _, stats = model_and_stats
    st = next(iter(stats.values()))
    assert st.on("cpu") is st  # already there: no copy
    st.memo["probe"] = 1
    moved = st.on("meta")
    assert moved is not st and "probe" not in moved.memo  # a device's solves never meet the host's
    moved.memo["basis"] = 2
    assert st.on("meta").memo == {"basis": 2} and st.memo["probe"] == 1  # kept (inside the host memo) for the next
    for name in ("C", "F", "abs_mean", "mean", "xs", "gs"):
        assert getattr(moved, name).device.type == "meta" and getattr(st, name).device.type == "cpu"
    assert all(t.device.type == "meta" for t in moved.row_fisher.values())
    assert moved.n_tokens == st.n_tokens


def _sweep(tiny, out, *extra):
    from acbench.cli import main

    argv = ["run", "--model", str(tiny), "--methods", "pca", "fasc-kfac", "random", "--rank", "0.5",
            "--tasks", "ppl-token", "--output", str(out), "--calib-samples", "2", "--calib-seq-len", "32",
            "--ppl-windows", "2", "--ppl-seq-len", "32", "--no-report", "--quiet", "--no-latency", *extra]
    assert main(argv) == 0
    import json

    return {p.relative_to(out).as_posix(): json.loads(p.read_text()) for p in sorted(out.rglob("*.json"))}


def test_solve_device_cpu_reproduces_the_default_cells(tmp_path):
    """`--solve-device cpu` (the default's device on this host): the same cell files (keys) with the same numbers,
    and the device recorded in each variant's compression."""
    from acbench.cli.smoke import tiny_checkpoint

    tiny = tiny_checkpoint()
    default, cpu = _sweep(tiny, tmp_path / "a"), _sweep(tiny, tmp_path / "b", "--solve-device", "cpu")
    assert list(default) == list(cpu) and len(default) == 4
    for path, cell in default.items():
        assert cell["metrics"] == cpu[path]["metrics"], path
        if cell["compression"]:
            assert cell["compression"]["solve_device"] == cpu[path]["compression"]["solve_device"] == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
@pytest.mark.parametrize("device,needle", [("cuda", "no CUDA device"), ("cuda:1", "no CUDA device"),
                                           ("gpu", "is not supported")])
def test_solve_device_refusals_are_one_line(tmp_path, capsys, device, needle):
    from acbench.cli import main
    from acbench.cli.smoke import tiny_checkpoint

    rc = main(["run", "--model", str(tiny_checkpoint()), "--methods", "pca", "--tasks", "ppl-token",
               "--output", str(tmp_path / "out"), "--solve-device", device, "--quiet"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc == 2 and len(err) == 1 and needle in err[0] and "--solve-device" in err[0], err
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").rglob("*.json"))
