"""A pass that reads no gradients stops at the output head: the statistics are those of the whole forward, and the
head (on Gemma the largest product of the forward) is never run."""

import torch

from bench.calibration import engine
from bench.calibration.engine import CalibSpec, calibrate
from bench.model.groups import find_input_groups
from core.stats import ACTIVATION_STATS

from conftest import tiny_model


def _head_calls(model) -> list:
    calls: list = []
    model.get_output_embeddings().register_forward_hook(lambda *a: calls.append(1))
    return calls


def test_activation_pass_skips_the_head_and_keeps_every_statistic(arch, windows, monkeypatch):
    model = tiny_model(arch)
    groups = find_input_groups(model)
    calls = _head_calls(model)
    stopped = calibrate(model, groups, windows, ACTIVATION_STATS, CalibSpec(), progress=False)
    assert calls == []
    monkeypatch.setattr(engine, "_stop_at_head", lambda model, groups: None)
    whole = calibrate(model, groups, windows, ACTIVATION_STATS, CalibSpec(), progress=False)
    assert len(calls) == 4  # 8 windows in batches of 2
    for name in whole:
        for field in ACTIVATION_STATS:
            a, b = getattr(stopped[name], field), getattr(whole[name], field)
            assert (a is None) == (b is None) and (a is None or torch.equal(a, b)), (name, field)


def test_gradient_pass_still_runs_the_head(windows):
    model = tiny_model("llama")
    calls = _head_calls(model)
    calibrate(model, find_input_groups(model), windows, frozenset({"C", "F"}), CalibSpec(), progress=False)
    assert len(calls) == 4


def test_no_stop_where_the_head_is_the_input_embedding_or_a_site():
    model = tiny_model("llama")
    groups = find_input_groups(model)
    assert engine._stop_at_head(model, groups) is not None
    model.get_output_embeddings = model.get_input_embeddings
    assert engine._stop_at_head(model, groups) is None
    model.get_output_embeddings = lambda: groups[0].sites[0]
    assert engine._stop_at_head(model, groups) is None
