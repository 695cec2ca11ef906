"""A pass that reads no gradients stops at the output head: the statistics are those of the whole forward, and the
head (on Gemma the largest product of the forward) is never run. A pass that reads gradients takes the loss's
gradient at the logits a block of positions at a time: the same statistics to the bit, without the whole loss's
vocabulary-wide intermediates."""

import functools

import pytest
import torch

from acbench.calibration import engine
from acbench.calibration.engine import CalibSpec, calibrate, next_token_loss_sum
from acbench.model.groups import find_input_groups
from acbench.core.stats import ACTIVATION_STATS
from acbench.testing import STAT_FIELDS

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
        for field in {f for stat in ACTIVATION_STATS for f in STAT_FIELDS[stat]}:
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


def test_blockwise_loss_gradient_gives_the_whole_loss_statistics_to_the_bit(arch, windows, monkeypatch):
    model = tiny_model(arch)
    groups = find_input_groups(model)
    needed = frozenset({"C", "F", "pairs", "row_fisher"})
    # blocks of 5 positions: each 24-token window is cut into five blocks, the last one short
    monkeypatch.setattr(engine, "backward_next_token_loss", functools.partial(engine.backward_next_token_loss, rows=5))
    blocks = calibrate(model, groups, windows, needed, CalibSpec(), progress=False)
    monkeypatch.setattr(engine, "backward_next_token_loss", lambda logits, ids: next_token_loss_sum(logits, ids).backward())
    whole = calibrate(model, groups, windows, needed, CalibSpec(), progress=False)
    for name in whole:
        for field in ("C", "F", "xs", "gs", "row_fisher"):
            a, b = getattr(blocks[name], field), getattr(whole[name], field)
            if isinstance(a, dict):
                assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), (name, field)
            else:
                assert (a is None) == (b is None) and (a is None or torch.equal(a, b)), (name, field)


def test_gradient_pass_never_holds_a_vocabulary_wide_tensor_for_more_than_a_block_of_positions():
    model = tiny_model("llama")
    vocab = model.config.vocab_size
    long_windows = torch.randint(0, vocab, (2, 600), generator=torch.Generator().manual_seed(0))
    widest = []

    def pack(t):
        if t.dim() and t.shape[-1] == vocab:
            widest.append(t.numel() // vocab)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        calibrate(model, find_input_groups(model), long_windows, frozenset({"C", "F"}), CalibSpec(), progress=False)
    # the whole loss saves the log-softmax of all 2 x 599 positions for its backward
    assert widest and max(widest) <= 256, max(widest)


def test_a_gradient_pass_hands_freed_memory_back_after_every_batch(windows, monkeypatch):
    """Without it, glibc let a backward's freed tensors pile up: SmolLM2's calibration grew by about 1 GB a batch."""
    released = []
    monkeypatch.setattr(engine, "release_freed_memory", lambda: released.append(1))
    model = tiny_model("llama")
    calibrate(model, find_input_groups(model), windows, frozenset({"C", "F"}), CalibSpec(), progress=False)
    assert len(released) == 4  # 8 windows in batches of 2
    released.clear()
    calibrate(model, find_input_groups(model), windows, frozenset({"C"}), CalibSpec(), progress=False)
    assert released == []  # no backward, nothing of its size freed


def test_large_blocks_are_mapped_where_the_c_library_is_glibc():
    import platform

    engine.release_freed_memory()  # callable everywhere: a no-op where the library is not glibc
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        with engine.allocator_tuning():
            assert engine.map_large_blocks() is True


def test_large_blocks_are_mapped_for_a_gradient_calibration_only(windows, monkeypatch):
    """The 4 MiB mmap threshold holds a backward's memory down; left on after it, every later solve faulted its
    temporaries in afresh (the default run's fasc solves 1.8x slower). It is set as a gradient calibration starts
    and undone when it ends, raising or not; a calibration without gradients touches neither, and neither does one
    outside allocator_tuning (a Python call: the caller's allocator is left as found)."""
    calls = []

    class FakeLibc:
        def mallopt(self, param, value):
            calls.append((param, value))
            return 1

        def malloc_trim(self, pad):
            return 1

    monkeypatch.setattr(engine, "_glibc", lambda: FakeLibc())
    model = tiny_model("llama")
    calibrate(model, find_input_groups(model), windows, frozenset({"C", "F"}), CalibSpec(), progress=False)
    assert calls == []  # not the application: glibc untouched
    with engine.allocator_tuning():
        calibrate(model, find_input_groups(model), windows, frozenset({"C", "F"}), CalibSpec(), progress=False)
        mmap, trim = engine.M_MMAP_THRESHOLD, engine.M_TRIM_THRESHOLD
        assert calls == [(mmap, 4 << 20), (mmap, 32 << 20), (trim, 64 << 20)]
        calls.clear()
        calibrate(model, find_input_groups(model), windows, frozenset({"C"}), CalibSpec(), progress=False)
        assert calls == []
        monkeypatch.setattr(engine, "backward_next_token_loss",
                            lambda *a: (_ for _ in ()).throw(RuntimeError("boom")))
        with pytest.raises(RuntimeError, match="boom"):
            calibrate(model, find_input_groups(model), windows, frozenset({"F"}), CalibSpec(), progress=False)
        assert calls[-2:] == [(mmap, 32 << 20), (trim, 64 << 20)]
    assert engine._ALLOCATOR_TUNED == []


def test_the_gradient_at_the_logits_takes_their_own_storage_and_no_second_vocabulary_wide_tensor(arch):
    """Each block's gradient overwrites the logits it was read from: a 2 x 2,048 batch on Gemma's 262k-word head
    holds 4.3 GB of logits, and a gradient buffer beside them held as much again."""
    from torch.utils._python_dispatch import TorchDispatchMode

    model = tiny_model(arch)
    ids = torch.randint(0, model.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))
    logits = model(input_ids=ids, use_cache=False).logits
    storage, size = logits.untyped_storage().data_ptr(), logits.numel()
    wide = []

    class Allocations(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor) and t.numel() >= size and t.untyped_storage().data_ptr() != storage:
                    wide.append(str(func))
            return out

    with Allocations():
        engine.backward_next_token_loss(logits, ids, rows=7)
    assert wide == []


HEAD_ENDINGS = {"a tanh": torch.tanh, "a tanh, then a view": lambda out: torch.tanh(out).view(out.shape)}


@pytest.mark.parametrize("ending", HEAD_ENDINGS)
def test_logits_a_node_kept_for_its_backward_get_a_gradient_buffer_and_the_same_statistics(ending, windows,
                                                                                        monkeypatch):
    """A head whose last operations keep their result (a tanh, as a soft cap could be written, seen through a view
    too) must not have its logits overwritten: the gradient goes to a buffer of its own, and the statistics are the
    whole loss's."""
    model = tiny_model("llama")
    model.get_output_embeddings().register_forward_hook(lambda m, a, out: HEAD_ENDINGS[ending](out))
    groups = find_input_groups(model)
    needed = frozenset({"C", "F"})
    ids = windows[:2]
    assert engine.logits_unsaved(model(input_ids=ids, use_cache=False).logits) is False
    blocks = calibrate(model, groups, windows, needed, CalibSpec(), progress=False)
    with monkeypatch.context() as m:
        m.setattr(engine, "backward_next_token_loss", lambda logits, i: next_token_loss_sum(logits, i).backward())
        whole = calibrate(model, groups, windows, needed, CalibSpec(), progress=False)
    assert all(torch.equal(blocks[n].F, whole[n].F) and torch.equal(blocks[n].C, whole[n].C) for n in whole)
    monkeypatch.setattr(engine, "logits_unsaved", lambda logits: True)  # overwriting them anyway: autograd refuses
    with pytest.raises(RuntimeError, match="inplace"):
        calibrate(model, groups, windows, needed, CalibSpec(), progress=False)
    assert engine.logits_unsaved(tiny_model("llama")(input_ids=ids, use_cache=False).logits) is True
