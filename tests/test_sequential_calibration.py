"""Sequential calibration (acbench.calibration.sequential): each block's statistics from the outputs of the blocks
before it as compressed. Checked against its definition (calibrate the partly compressed model, compress one
block, repeat), and refused in one line where a model or method cannot be calibrated that way."""

import importlib
import json

import pytest
import torch
from torch import nn

from conftest import tiny_model
from acbench.core.errors import UserError
from acbench.core.stats import SparsitySpec, RankSpec
from acbench.calibration.engine import CalibSpec, calibrate
from acbench.calibration.sequential import BlockChain, block_statistics
from acbench.deploy.compression import deploy, deploy_sequential
from acbench.model.groups import find_input_groups


def _windows(n=6, seq=20, seed=0):
    return torch.randint(0, 101, (n, seq), generator=torch.Generator().manual_seed(seed))


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def by_definition(model, method, budget, ids, needed):
    """The protocol written out: calibrate the whole (partly compressed) model, compress block i's groups from
    those statistics, keep them, go on to block i + 1."""
    from acbench.deploy.compression import Deployment, _deploy_group

    comp = importlib.import_module("acbench.methods").build(method)
    undo = []
    groups = find_input_groups(model)  # traced once: a deployed site is no longer an nn.Linear to trace
    for block in sorted({g.block for g in groups}):
        mine = [g for g in groups if g.block == block]
        stats = calibrate(model, mine, ids, needed, CalibSpec(), batch_size=2, progress=False)
        for g in mine:
            undo.append(_deploy_group(model, comp, g, stats[g.name], budget, None, [], False, None, "float64")[0])
    return [Deployment(model, [], undo)]


@pytest.mark.parametrize("arch,method,budget", [
    ("llama", "wanda", SparsitySpec.parse("0.5")), ("llama", "sparsegpt", SparsitySpec.parse("2:4")),
    ("gemma3", "pca", RankSpec(0.5)), ("llama", "teal", SparsitySpec.parse("0.5"))])
def test_sequential_equals_its_definition(arch, method, budget):
    model = tiny_model(arch, layers=3) if arch == "llama" else tiny_model(arch, layers=2)
    ids = _windows()
    dense = _logits(model, ids)
    needed = importlib.import_module("acbench.methods").build(method).required_stats()
    deps = by_definition(model, method, budget, ids, needed)
    expected = _logits(model, ids)
    for d in reversed(deps):
        d.restore()
    assert torch.equal(_logits(model, ids), dense)
    dep, counts = deploy_sequential(model, method, budget, ids, CalibSpec(), progress=False, batch_size=2)
    got = _logits(model, ids)
    dep.restore()
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-5), float((got - expected).abs().max())
    assert torch.equal(_logits(model, ids), dense)  # restored bit for bit
    assert counts["n_tokens"] == ids.numel() and counts["blocks"] == len(model.model.layers)
    assert counts["held_bytes"] == ids.numel() * model.config.hidden_size * 4


def test_the_first_block_reads_dense_statistics_and_the_next_ones_do_not():
    """Block 0's statistics are the one-pass ones; block 1's come from block 0 as compressed, so they differ."""
    model = tiny_model("llama", layers=2)
    ids = _windows()
    groups = find_input_groups(model)
    one_pass = calibrate(model, groups, ids, frozenset({"C"}), CalibSpec(), batch_size=2, progress=False)
    seen = {}

    def keep(block_groups, stats):
        seen.update(stats)
        for g in block_groups:
            deps.append(deploy(model, "wanda", SparsitySpec.parse("0.5"), stats, only_groups={g.name},
                               progress=False))

    from acbench.calibration.sequential import sequential_pass

    deps = []
    sequential_pass(model, groups, ids, frozenset({"C"}), CalibSpec(), keep, batch_size=2, progress=False)
    for d in reversed(deps):
        d.restore()
    for g in groups:
        close = torch.allclose(seen[g.name].C, one_pass[g.name].C, rtol=1e-5, atol=1e-7)
        # a block is calibrated whole from its input before any of its groups is compressed: all of block 0 is dense
        assert close == (g.block == 0), g.name


def test_blocks_after_the_last_compressed_one_are_not_run():
    model = tiny_model("llama", layers=3)
    ran = []
    for i, blk in enumerate(model.model.layers):
        blk.register_forward_pre_hook(lambda m, a, i=i: ran.append(i))
    groups = [g for g in find_input_groups(model) if g.block == 0]
    ids = _windows(n=2)
    dep, counts = deploy_sequential(model, "wanda", SparsitySpec.parse("0.5"), ids, CalibSpec(),
                                    only_groups={g.name for g in groups}, progress=False, batch_size=2)
    dep.restore()
    every = [0, 1, 2]  # the trace that finds the groups, the forward that captures every block's call, the replay check
    assert ran == every * 3 + [0]  # then block 0 once more for its statistics, and nothing after it
    assert counts["blocks"] == 1


@pytest.mark.parametrize("method,words", [("fasc-kfac", "gradient"), ("fwsvd", "gradient"),
                                          ("svd-llm-v2", "allocates its ranks")])
def test_a_method_sequential_cannot_serve_is_one_line(method, words):
    model = tiny_model("llama")
    with pytest.raises(UserError, match=words) as e:
        deploy_sequential(model, method, RankSpec(0.5), _windows(n=2), CalibSpec(), progress=False)
    assert "\n" not in str(e.value) and "one-pass" in str(e.value)


def test_a_model_whose_blocks_share_state_is_refused():
    """A block that reads something besides its hidden states and arguments (here, the embeddings of the last
    batch the model saw) cannot be replayed: the replay check finds it."""
    model = tiny_model("llama")
    held = {}
    model.model.embed_tokens.register_forward_hook(lambda m, a, out: held.__setitem__("e", out.detach()))
    model.model.layers[1].register_forward_pre_hook(lambda m, args: (args[0] + held["e"],) + args[1:])
    with pytest.raises(UserError, match="differs from its own forward"):
        BlockChain(model, _windows(n=4), batch_size=2)


@pytest.mark.parametrize("how", ["a block listed twice", "the blocks looped twice"])
def test_a_model_that_runs_a_block_twice_is_refused(how):
    model = tiny_model("llama", layers=2)
    if how == "a block listed twice":
        model.model.layers = nn.ModuleList([model.model.layers[0], model.model.layers[1], model.model.layers[0]])
        model.config.num_hidden_layers = 3
    else:  # a recurrent model: every block again after the last one (counted on the first batch's whole forward)
        once = model.model.forward
        model.model.forward = lambda *a, **kw: (once(*a, **kw), once(*a, **kw))[1]
    with pytest.raises(UserError) as e:
        BlockChain(model, _windows(n=4), batch_size=2)
    assert str(e.value) == ("sequential calibration: this model runs its decoder blocks other than once each per "
                            "forward (a recurrent or skipping model), so they cannot be replayed in order: use "
                            "--calibration-mode one-pass")


def test_block_statistics_take_the_held_hidden_states():
    """Statistics of block 0 from a chain equal a one-pass calibration's (the same tokens, no compression)."""
    model = tiny_model("llama")
    ids = _windows()
    groups = [g for g in find_input_groups(model) if g.block == 0]
    chain = BlockChain(model, ids, batch_size=2)
    got = block_statistics(chain, 0, groups, frozenset({"C", "abs_hist"}), CalibSpec())
    ref = calibrate(model, groups, ids, frozenset({"C", "abs_hist"}), CalibSpec(), batch_size=2, progress=False)
    for g in groups:
        assert got[g.name].n_tokens == ref[g.name].n_tokens == ids.numel()
        assert torch.allclose(got[g.name].C, ref[g.name].C, rtol=1e-6, atol=1e-8)
        assert torch.allclose(got[g.name].abs_hist, ref[g.name].abs_hist)


# ---------------------------------------------------------------- a calibration too small for its solve

def test_a_calibration_shorter_than_a_groups_width_is_named_for_the_methods_it_fails():
    """Tiny Llama widths: attention input 32, MLP input 32, MLP output 48; 40 tokens cover 32, not 48. The methods
    whose solve inverts or eigen-decomposes C or F are short there; Wanda (diagonal) and TEAL (histogram) are not."""
    from acbench import methods
    from acbench.calibration.support import after_line, short_groups, support_line, support_record

    model = tiny_model("llama", hidden=32, inter=48)
    groups = find_input_groups(model)
    widths = {g.name: g.d_in for g in groups}
    for name in ("pca", "whitened-svd", "fasc-kfac", "sparsegpt", "larosa"):
        short = short_groups(methods.build(name), groups, 40)
        assert [g.name for g in short] == [g for g, d in widths.items() if d > 40], name
        assert short_groups(methods.build(name), groups, 48) == []  # as many tokens as the widest: covered
    for name in ("wanda", "teal", "asvd", "cats", "svd"):
        assert short_groups(methods.build(name), groups, 1) == [], name
    comp = methods.build("sparsegpt")
    rec = support_record(comp, groups, 40)
    assert rec == {"groups": 2, "of": len(groups), "tokens": 40, "tokens_needed": 48, "stats": ["C"]}
    assert support_record(comp, groups, 48) is None
    line = support_line(["sparsegpt", "pca"], comp, groups, 40, 16)
    assert line.startswith("sparsegpt, pca: 40 calibration tokens are fewer than the input width of 2 of 8 groups "
                           "(up to 48, layers.0.mlp_out)") and "their solve" in line
    assert line.endswith("calibrate at least 48 tokens (e.g. --calib-samples 3 at --calib-seq-len 16)")
    assert "its solve" in support_line(["sparsegpt"], comp, groups, 40, 16)
    assert support_line(["sparsegpt"], comp, groups, 48, 16) is None
    assert " 0 numeric fallback(s)" in after_line("x", rec, {"n_fallbacks": 0}) and \
        " 0 numeric fallback(s)" in after_line("x", rec, {})
    after = after_line("sparsegpt @ 0.5", rec, {"n_fallbacks": 3})
    assert after == ("[sparsegpt @ 0.5] calibrated on 40 tokens, fewer than the width of 2 of 8 groups: 3 numeric "
                     "fallback(s) recorded; its numbers measure the calibration's size as much as the method (at "
                     "least 48 tokens would cover every group)")


def test_the_run_says_it_once_per_calibration_and_the_cell_records_it(tmp_path, capsys):
    from acbench.runner.config import RunConfig
    from acbench.runner.resolve import resolve_run
    from acbench.core.log import console_lines
    from acbench.runner.worker import cell_calibration
    from acbench.runner.prepare import warn_short_calibrations

    model = tiny_model("llama", hidden=32, inter=48)
    groups = find_input_groups(model)
    run = resolve_run(RunConfig(methods=["pca", "whitened-svd", "wanda", "sparsegpt"], ranks=[0.5], sparsity=["0.5"],
                                calib_samples=2, calib_seq_len=20, tasks=["ppl-token"], output=str(tmp_path)))
    with console_lines():  # as the CLI writes them
        lines = warn_short_calibrations(run, groups)
    # pca, whitened-svd and sparsegpt share the run's 40 tokens and the same short groups: one line names them
    assert lines == [l for l in lines if l.startswith("pca, whitened-svd, sparsegpt: 40 calibration tokens")]
    assert len(lines) == 1 and "warning: " + lines[0] in capsys.readouterr().out
    spec = {"samples": 2, "seq_len": 20}
    from acbench import methods

    rec = cell_calibration({"spec": spec}, methods.build("sparsegpt"), groups)
    assert rec["short"]["tokens_needed"] == 48 and rec["authors"]["samples"] == 128
    assert "short" not in cell_calibration({"spec": spec}, methods.build("wanda"), groups)
    assert cell_calibration(None, methods.build("wanda"), groups) is None


def test_arguments_equal_across_batches_are_held_once():
    """Gemma-3 materialises its attention masks: equal-length windows share one mask and one rotary table, held
    once however many batches there are; an argument that differs stays its own."""
    from acbench.calibration.sequential import _shared

    model = tiny_model("gemma3", layers=2)
    chain = BlockChain(model, _windows(n=6), batch_size=2)
    for i in range(2):
        first, later = chain.calls[0][i][1], chain.calls[2][i][1]
        tensors = [k for k, v in first.items() if isinstance(v, (torch.Tensor, tuple))]
        assert tensors and all(later[k] is first[k] for k in tensors), i
    a, b = torch.zeros(3), torch.ones(3)
    assert _shared(torch.zeros(3), a) is a and _shared(b, a) is b and _shared(torch.zeros(4), a).shape == (4,)
    assert _shared((torch.zeros(3), b.clone()), (a, b)) == (a, b) and _shared((b, a), (a, b))[0] is b
    assert _shared(torch.zeros(3, dtype=torch.int64), a).dtype == torch.int64 and _shared(None, a) is None


def _calls_of_block_0(model, salt_at=()):
    """Block 0's calls, counted; at the calls in `salt_at` it gets one more keyword argument, a per-batch value."""
    seen = []

    def salt(module, args, kwargs):
        if args[0].shape[1] != 20:
            return None  # the layout probe's short input, not a calibration batch
        seen.append(1)
        return (args, {**kwargs, "salt": torch.full((1,), float(len(seen)))}) if len(seen) in salt_at else None
    model.model.layers[0].register_forward_pre_hook(salt, with_kwargs=True)


def test_later_batches_stop_at_block_0_and_change_nothing(arch, monkeypatch):
    """Once batch 1's blocks get batch 0's arguments, a later batch of the same shape runs only up to block 0 (its
    embeddings are all it adds): the chain, the statistics and the deployed model are those of a dense forward of
    every batch."""
    from acbench.calibration import sequential

    ids = _windows(n=8)
    model = tiny_model(arch, layers=2)
    dense = _logits(model, ids)
    chain = BlockChain(model, ids, batch_size=2)
    assert chain.full_forwards == 2
    dep, _ = deploy_sequential(model, "wanda", SparsitySpec.parse("0.5"), ids, CalibSpec(), progress=False,
                               batch_size=2)
    fast = _logits(model, ids)
    dep.restore()
    monkeypatch.setattr(sequential, "_same_call", lambda a, b: False)
    slow_chain = BlockChain(model, ids, batch_size=2)
    assert slow_chain.full_forwards == 4
    assert all(torch.equal(a, b) for a, b in zip(chain.hidden, slow_chain.hidden))
    for i in range(2):
        st, slow = (block_statistics(c, i, [g for g in find_input_groups(model) if g.block == i], frozenset({"C"}),
                                     CalibSpec()) for c in (chain, slow_chain))
        assert all(torch.equal(st[k].C, slow[k].C) for k in st)
    dep, _ = deploy_sequential(model, "wanda", SparsitySpec.parse("0.5"), ids, CalibSpec(), progress=False,
                               batch_size=2)
    assert torch.equal(_logits(model, ids), fast) and not torch.equal(fast, dense)
    dep.restore()


@pytest.mark.parametrize("salt_at,n,forwards", [((2,), 8, 4), ((4,), 8, 3), ((), 7, 3)])
def test_a_batch_whose_arguments_or_shape_differ_runs_its_whole_forward(salt_at, n, forwards):
    """Batch 1 with an argument of its own: every batch runs whole. A later batch whose block 0 gets an argument
    of its own, or a last batch with fewer windows (its masks have another shape): that batch runs whole."""
    model = tiny_model("llama", layers=2)
    _calls_of_block_0(model, salt_at)
    assert BlockChain(model, _windows(n=n), batch_size=2).full_forwards == forwards


# ---------------------------------------------------------------- the engine's pieces, each against its contract

def test_a_blocks_hidden_states_are_read_positional_or_by_keyword_and_anything_else_is_one_line():
    from acbench.calibration.sequential import _hidden_of, _output_of

    h = torch.ones(2, 3)
    assert _hidden_of((h, 5), {"mask": 1}) == (h, None)
    assert _hidden_of((), {"hidden_states": h, "mask": 1}) == (h, "hidden_states")
    assert _hidden_of((5,), {"hidden_states": h}) == (h, "hidden_states")  # a non-tensor first argument
    for args, kwargs in (((), {}), ((5,), {}), ((), {"hidden_states": 5})):
        with pytest.raises(UserError) as e:
            _hidden_of(args, kwargs)
        assert str(e.value) == ("sequential calibration: a decoder block was called without its hidden states as a "
                                "tensor (positional or hidden_states=): use --calibration-mode one-pass for this model")
    assert _output_of(h) is h and _output_of((h, None)) is h and _output_of([h]) is h
    for out in ((), (None, h), {"h": h}, None):
        with pytest.raises(UserError, match=f"returned {type(out).__name__}, not its hidden states"):
            _output_of(out)


def test_a_block_captured_by_keyword_is_replayed_by_keyword():
    """Where a model passes a block its hidden states as hidden_states= (transformers' Llama passes them
    positionally), the replay passes them under the same keyword, with the other arguments as captured."""
    model = tiny_model("llama", layers=2)
    chain = BlockChain(model, _windows(n=2), batch_size=2)
    args, kwargs, key = chain.calls[0][0]
    assert key is None and args == () and "position_embeddings" in kwargs
    h = chain.hidden[0]
    positional = chain.run_block(0, 0, h)
    chain.calls[0][0] = ((), dict(kwargs), "hidden_states")
    with torch.no_grad():
        direct = model.model.layers[0](hidden_states=h, **kwargs)
    direct = direct[0] if isinstance(direct, tuple) else direct
    assert torch.equal(chain.run_block(0, 0, h), direct) and torch.equal(direct, positional)


@pytest.mark.parametrize("needed", [frozenset({"C", "abs_mean", "mean", "abs_hist"}), frozenset({"act_hist"})])
def test_block_statistics_equal_one_pass_ones_for_every_activation_statistic(needed):
    model = tiny_model("llama")
    ids = _windows()
    groups = [g for g in find_input_groups(model) if g.block == 0]
    chain = BlockChain(model, ids, batch_size=2)
    got = block_statistics(chain, 0, groups, needed, CalibSpec())
    ref = calibrate(model, groups, ids, needed, CalibSpec(), batch_size=2, progress=False)
    for g in groups:
        for name in needed:
            a, b = getattr(got[g.name], name), getattr(ref[g.name], name)
            assert a is not None and torch.allclose(a, b, rtol=1e-6, atol=1e-9), (g.name, name)
        assert got[g.name].n_tokens == ids.numel()
    if "act_hist" in needed:  # only the group reading the MLP's activation has one
        assert float(got[groups[-1].name].act_hist.sum()) == pytest.approx(1.0)
    # no hook is left on the model
    assert all(not s._forward_pre_hooks for g in groups for s in g.sites)


def test_the_pass_hands_each_block_its_statistics_checks_them_and_times_only_the_calibration():
    import time

    from acbench.calibration.sequential import sequential_pass

    model = tiny_model("llama", layers=3)
    groups = [g for g in find_input_groups(model) if g.block in (0, 2)]
    seen, checked = [], []

    def compress(block_groups, stats):
        seen.append(([g.block for g in block_groups], sorted(stats)))
        time.sleep(0.3)

    t0 = time.perf_counter()
    counts = sequential_pass(model, groups, _windows(n=4), frozenset({"C"}), CalibSpec(), compress, batch_size=2,
                             progress=False, check=checked.append)
    total = time.perf_counter() - t0
    assert [b for b, _ in seen] == [[0] * 4, [2] * 4]  # block 1 has no group here: moved past, not compressed
    assert seen[0][1] == sorted(g.name for g in groups if g.block == 0)
    assert [sorted(s) for s in checked] == [names for _, names in seen]
    assert 0 < counts["seconds"] <= total - 0.6 + 1e-3  # the two callbacks' 0.6 s are not calibration
    assert counts == {**counts, "n_tokens": 4 * 20, "blocks": 3, "held_bytes": 4 * 20 * 32 * 4}


def test_the_gradient_refusal_names_the_statistics_and_the_fix():
    from acbench.calibration.sequential import gradient_problem

    assert gradient_problem(frozenset({"C", "abs_hist"}), "pca") is None
    assert gradient_problem(frozenset({"C", "F", "pairs"}), "fasc") == (
        "fasc reads gradient statistics (F, pairs) of the loss through the whole model, and sequential calibration "
        "replays one block at a time with no loss to differentiate: run it with --calibration-mode one-pass")


def test_the_replay_check_accepts_rounding_and_refuses_a_difference_above_its_tolerance():
    from acbench.calibration.sequential import REPLAY_TOLERANCE

    model = tiny_model("llama")
    chain = BlockChain(model, _windows(n=2), batch_size=2)
    assert REPLAY_TOLERANCE == 1e-3
    ref = chain.dense_out.clone()
    chain.dense_out = ref * (1 + 0.5e-3)  # a relative difference of 5e-4: within the tolerance
    chain._check_replay()
    chain.dense_out = ref * (1 + 2e-3)
    with pytest.raises(UserError) as e:
        chain._check_replay()
    assert str(e.value) == ("sequential calibration: replaying this model's decoder blocks one at a time differs "
                            "from its own forward (relative error 0.002), so its blocks pass more than hidden states "
                            "between them: use --calibration-mode one-pass")
    chain.dense_out = ref * float("nan")
    with pytest.raises(UserError, match="relative error nan"):
        chain._check_replay()


def test_a_pass_over_no_group_runs_no_block_and_compresses_nothing():
    from acbench.calibration.sequential import sequential_pass

    called = []
    counts = sequential_pass(tiny_model("llama"), [], _windows(n=2), frozenset({"C"}), CalibSpec(),
                             lambda *a: called.append(a), progress=False)
    assert called == [] and counts["blocks"] == 0 and counts["n_tokens"] == 40


def test_a_calibration_computed_records_its_peak_memory_and_one_read_from_the_cache_none(tmp_path,
                                                                                         private_stats_cache):
    """A cell says what its calibration cost in memory where the run computed it (one-pass: the shared pass;
    sequential: the variant's calibration with its solves); a rerun that reads the statistics from the cache
    calibrated nothing and records no peak, as it records the first run's seconds."""
    from acbench.cli import main
    from acbench.cli.smoke import tiny_checkpoint

    base = ["run", "--model", str(tiny_checkpoint()), "--tasks", "ppl-token", "--calib-samples", "2",
            "--calib-seq-len", "32", "--ppl-windows", "1", "--ppl-seq-len", "32", "--no-report", "--quiet",
            "--no-latency"]
    runs = {"fresh": ["--methods", "pca", "--rank", "0.5"], "cached": ["--methods", "pca", "--rank", "0.5"],
            "sequential": ["--methods", "wanda", "--sparsity", "0.5", "--calibration-mode", "sequential"]}
    cal = {}
    for name, args in runs.items():
        assert main(base + args + ["--output", str(tmp_path / name)]) == 0
        (path,) = [p for p in (tmp_path / name).rglob("*.json") if "dense" not in p.parts and
                   not p.name.startswith(".")]
        cal[name] = json.loads(path.read_text())["calibration"]
    for name in ("fresh", "sequential"):
        peak = cal[name]["peak"]
        assert peak["kind"].startswith("rss_high_water") and type(peak["bytes"]) is int and peak["bytes"] > 10 << 20
    assert cal["cached"]["cached"] is True and "peak" not in cal["cached"]


@pytest.mark.parametrize("named", [True, False])
def test_the_capture_stops_at_the_lm_head_where_the_model_names_one(named):
    """The first batch's capture runs on to the LM head and not through it: Gemma's 262k-word head made 4.3 GB of
    logits per 2 x 2,048 batch that nothing read. A model that names no output embeddings runs its whole forward;
    either way the chain holds every batch's block-0 input."""
    model = tiny_model("llama", layers=2)
    computed = []
    model.lm_head.register_forward_hook(lambda m, a, out: computed.append(tuple(out.shape)))
    if not named:
        model.get_output_embeddings = lambda: None
    chain = BlockChain(model, _windows(n=4), batch_size=2)
    assert computed == ([] if named else [(2, 20, 101)])
    assert len(chain.hidden) == 2 and chain.full_forwards == 2


def test_two_captured_calls_are_the_same_when_they_hold_the_same_objects():
    """_same_call compares positional and keyword arguments by identity (what _shared leaves of equal values)."""
    from acbench.calibration.sequential import _same_call

    t, u = torch.zeros(2), torch.zeros(2)
    call = ((t, u), {"mask": t}, None)
    assert _same_call(call, ((t, u), {"mask": t}, None))
    assert not _same_call(call, ((t, t), {"mask": t}, None))  # an equal value that is another object
    assert not _same_call(call, ((u, u), {"mask": t}, None))
    assert not _same_call(call, ((t,), {"mask": t}, None)) and not _same_call(call, ((t, u), {"mask": u}, None))
    assert not _same_call(call, ((t, u), {"mask": t}, "hidden_states"))
    assert not _same_call(call, ((t, u), {"other": t}, None))


def test_a_tuple_against_no_first_value_stays_itself():
    from acbench.calibration.sequential import _shared

    pair = (torch.zeros(2), torch.ones(2))
    assert _shared(pair, None) is pair and _shared(pair, torch.zeros(2)) is pair
    assert _shared(pair, (torch.zeros(2),)) is pair  # a tuple of another length


_AFTER_HIDDEN = ["attention_mask", "position_ids", "cache", "use_cache", "position_embeddings"]


def _positional(module, args, kwargs):
    """The Llama block called as older decoders call theirs: every argument after the hidden states positional."""
    if len(args) > 1:
        return None  # already positional (the replay)
    return (args[0], *(kwargs.get(n) for n in _AFTER_HIDDEN)), {k: v for k, v in kwargs.items()
                                                                if k not in _AFTER_HIDDEN}


def _by_keyword(module, args, kwargs):
    return None if not args else ((), {**kwargs, "hidden_states": args[0]})


@pytest.mark.parametrize("form", [_positional, _by_keyword])
def test_a_block_called_positionally_or_by_keyword_is_captured_and_replayed_as_called(form):
    """Blocks given their other arguments positionally, or their hidden states by keyword: the chain keeps the
    call as made, and replaying it moves the hidden states exactly as the keyword-argument calls do."""
    model = tiny_model("llama", layers=2)
    ids = _windows(n=4)
    plain = BlockChain(model, ids, batch_size=2)
    for blk in model.model.layers:
        blk.register_forward_pre_hook(form, with_kwargs=True)
    chain = BlockChain(model, ids, batch_size=2)
    args, kwargs, key = chain.calls[0][1]
    assert (len(args), key) == ((5, None) if form is _positional else (0, "hidden_states"))
    assert args[-1] is not None if form is _positional else torch.is_tensor(kwargs["position_embeddings"][0])
    for i in range(2):
        plain.advance(i)
        chain.advance(i)
    assert all(torch.equal(a, b) for a, b in zip(chain.hidden, plain.hidden))


def test_a_repeating_batch_runs_no_block_past_block_0():
    """The shortcut stops a repeating batch at block 0: block 1 runs for batches 0 and 1 and once in the replay check."""
    model = tiny_model("llama", layers=2)
    runs = []
    model.model.layers[1].register_forward_pre_hook(lambda m, a: runs.append(1) if a[0].shape[1] == 20 else None)
    chain = BlockChain(model, _windows(n=8), batch_size=2)
    assert chain.full_forwards == 2 and len(chain.hidden) == 4 and len(runs) == 3
