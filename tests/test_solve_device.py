"""Solves create every tensor on their inputs' device (issue 24): with the default device set to "meta", a factory
call that forgets `device=` makes a meta tensor, and mixing it with the CPU statistics fails."""

import pytest
import torch

import methods
from bench.allocate import allocate
from bench.calibrate import CalibSpec, calibrate
from bench.groups import find_input_groups
from core.stats import RankSpec, SparsitySpec

from conftest import tiny_model

ALL_STATS = frozenset({"C", "F", "pairs", "abs_mean", "mean", "row_fisher"})


@pytest.fixture(scope="module")
def model_and_stats():
    model = tiny_model("llama", hidden=48, inter=64)
    windows = torch.randint(0, 101, (4, 24), generator=torch.Generator().manual_seed(0))
    stats = calibrate(model, find_input_groups(model), windows, ALL_STATS, CalibSpec(pair_tokens=64), progress=False)
    return model, stats


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
    return SparsitySpec.parse("0.5" if name == "median" else "2:4")


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
