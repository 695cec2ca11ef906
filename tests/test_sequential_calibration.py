"""Sequential calibration (bench.calibration.sequential): each block's statistics from the outputs of the blocks
before it as compressed. Checked against its definition (calibrate the partly compressed model, compress one
block, repeat), and refused in one line where a model or method cannot be calibrated that way."""

import pytest
import torch
from torch import nn

from conftest import tiny_model
from core.errors import UserError
from core.stats import SparsitySpec, RankSpec
from bench.calibration.engine import CalibSpec, calibrate
from bench.calibration.sequential import BlockChain, block_statistics
from bench.deploy.compression import deploy, deploy_sequential
from bench.model.groups import find_input_groups


def _windows(n=6, seq=20, seed=0):
    return torch.randint(0, 101, (n, seq), generator=torch.Generator().manual_seed(seed))


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def by_definition(model, method, budget, ids, needed):
    """The protocol written out: calibrate the whole (partly compressed) model, compress block i's groups from
    those statistics, keep them, go on to block i + 1."""
    from bench.deploy.compression import Deployment, _deploy_group

    comp = __import__("methods").build(method)
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
    needed = __import__("methods").build(method).required_stats()
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

    from bench.calibration.sequential import sequential_pass

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


def test_a_model_that_runs_a_block_twice_is_refused():
    model = tiny_model("llama", layers=2)
    model.model.layers = nn.ModuleList([model.model.layers[0], model.model.layers[1], model.model.layers[0]])
    model.config.num_hidden_layers = 3
    with pytest.raises(UserError, match="other than once"):
        BlockChain(model, _windows(n=2), batch_size=2)


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
