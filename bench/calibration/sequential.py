"""Sequential calibration: the decoder blocks calibrated and compressed in order, each block's statistics taken
from the outputs of the blocks before it as already compressed, so a block's solve sees (and can correct) what the
ones before it lost. This is the protocol of SparseGPT's and Wanda's reference scripts and of llm-compressor's
sequential pipeline; the one-pass mode (the default) calibrates every block once on the dense model.

Granularity: a whole block at a time (all of a block's groups calibrated from the block's input, then compressed
together, as the reference scripts do by default). Memory: the hidden states entering the current block, for every
calibration window, held once (updated in place, batch by batch) and one block's statistics at a time; never the
whole model's statistics. Cost: a dense forward of the first two batches that captures each block's call (a later
batch whose blocks get the same other arguments stops at block 0: its hidden states are all it adds), then two
passes of each block (statistics, then its compressed output)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch
from tqdm.auto import tqdm

from acbench.core.errors import UserError
from acbench.core.stats import GRADIENT_STATS, GroupStats

from acbench.calibration.engine import CalibSpec, _GroupCollector, group_generator
from acbench.model.groups import activation_module, model_layout
# a replay of the dense blocks must give the model's own forward back to this relative error (float32 sums in
# another order differ by ~1e-6)
REPLAY_TOLERANCE = 1e-3


class _Stop(Exception):
    """Raised after the last block has run: the head is not needed."""


class _Repeats(Exception):
    """Raised at block 0 of a batch whose blocks' other arguments are batch 0's: only its hidden states are new."""


def _same_call(a: tuple, b: tuple) -> bool:
    """Two captured calls (other arguments, keyword arguments, hidden keyword) hold the same objects: what
    _shared makes of arguments equal to batch 0's."""
    return (a[2] == b[2] and len(a[0]) == len(b[0]) and all(x is y for x, y in zip(a[0], b[0]))
            and a[1].keys() == b[1].keys() and all(a[1][k] is b[1][k] for k in a[1]))


def gradient_problem(needed: frozenset[str], method: str) -> str | None:
    """Why a method reading `needed` cannot be calibrated sequentially (one line naming the fix), or None."""
    grads = sorted(needed & GRADIENT_STATS)
    if not grads:
        return None
    return (f"{method} reads gradient statistics ({', '.join(grads)}) of the loss through the whole model, and "
            "sequential calibration replays one block at a time with no loss to differentiate: run it with "
            "--calibration-mode one-pass")


def _hidden_of(args: tuple, kwargs: dict) -> tuple[torch.Tensor, str | None]:
    """A block's hidden-state input and where it came: positional (None) or the keyword it was passed under."""
    if args and isinstance(args[0], torch.Tensor):
        return args[0], None
    if isinstance(kwargs.get("hidden_states"), torch.Tensor):
        return kwargs["hidden_states"], "hidden_states"
    raise UserError("sequential calibration: a decoder block was called without its hidden states as a tensor "
                    "(positional or hidden_states=): use --calibration-mode one-pass for this model")


def _shared(value, first):
    """`first` where `value` equals it (a tensor, or a tuple of them, of the same shape and values), else `value`:
    the windows' masks and rotary tables are the same for every batch of equal-length windows."""
    if isinstance(value, torch.Tensor) and isinstance(first, torch.Tensor):
        return first if value.shape == first.shape and value.dtype == first.dtype and torch.equal(value, first) \
            else value
    if isinstance(value, tuple) and isinstance(first, tuple) and len(value) == len(first):
        shared = tuple(_shared(v, f) for v, f in zip(value, first))
        return first if all(a is b for a, b in zip(shared, first)) else shared
    return value


def _output_of(out) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    raise UserError(f"sequential calibration: a decoder block returned {type(out).__name__}, not its hidden "
                    "states: use --calibration-mode one-pass for this model")


class BlockChain:
    """The calibration windows' hidden states at the input of one block, and every block's call (its other
    arguments, kept by reference) captured from one dense forward per batch, so that block i can be run alone on
    what the blocks before it produced."""

    def __init__(self, model, windows: torch.Tensor, batch_size: int, progress: bool = False):
        self.model = model.eval()  # dropout off, as in every calibration
        self.blocks = model.get_submodule(model_layout(model).blocks)
        device = next(model.parameters()).device
        self.hidden: list[torch.Tensor] = []
        self.calls: list[list[tuple]] = []  # per batch, per block: (other args, kwargs, hidden keyword)
        self.dense_out: torch.Tensor | None = None  # the last block's output on batch 0, for the replay check
        self.full_forwards = 0
        # the dense forward of every window is the pass's first long stage (minutes at 128 x 2048 on a CPU): once
        # batch 1 has shown every block's other arguments to be batch 0's, a later batch of the same shape stops at
        # block 0 whenever block 0's arguments are batch 0's again (its hidden states are all it adds)
        repeat = False
        for b in tqdm(range(math.ceil(len(windows) / batch_size)), desc="capturing block inputs", disable=not progress,
                      leave=False):
            ids = windows[b * batch_size:(b + 1) * batch_size].to(device)
            self._capture(ids, first=b == 0, shortcut=repeat and ids.shape == windows[:batch_size].shape)
            if b == 1:
                repeat = all(_same_call(a, c) for a, c in zip(self.calls[1], self.calls[0]))
        self._check_replay()

    def _capture(self, ids: torch.Tensor, first: bool, shortcut: bool = False) -> None:
        calls: list[tuple | None] = [None] * len(self.blocks)
        runs = [0] * len(self.blocks)

        def pre(i):
            def hook(module, args, kwargs):
                runs[i] += 1
                hidden, key = _hidden_of(args, kwargs)
                if i == 0:
                    self.hidden.append(hidden.detach().clone())
                calls[i] = (args[1:] if key is None else args, {k: v for k, v in kwargs.items() if k != key}, key)
                if i == 0 and shortcut and _same_call(self._as_shared(calls[0], 0), self.calls[0][0]):
                    raise _Repeats
            return hook

        def last(module, args, out):
            # the first batch runs on to the LM head, so that a block run again after the last one (a recurrent
            # model looping over its blocks) is counted; the later ones stop here
            if not first:
                raise _Stop
            if self.dense_out is None:
                self.dense_out = _output_of(out).detach().clone()

        def head(module, args):
            raise _Stop  # every block has run before the head: its vocabulary-wide logits are never needed

        handles = [blk.register_forward_pre_hook(pre(i), with_kwargs=True) for i, blk in enumerate(self.blocks)]
        handles.append(self.blocks[-1].register_forward_hook(last))
        out_embeddings = self.model.get_output_embeddings() if first else None
        if out_embeddings is not None:  # (Gemma's 262k-word head: 4.3 GB of logits for a 2 x 2,048 batch)
            handles.append(out_embeddings.register_forward_pre_hook(head))
        try:
            with torch.no_grad():
                self.model(input_ids=ids, use_cache=False)
            self.full_forwards += 1
        except _Stop:
            self.full_forwards += 1
        except _Repeats:
            self.calls.append(list(self.calls[0]))
            return
        finally:
            for h in handles:
                h.remove()
        if any(n != 1 for n in runs):
            raise UserError("sequential calibration: this model runs its decoder blocks other than once each per "
                            "forward (a recurrent or skipping model), so they cannot be replayed in order: use "
                            "--calibration-mode one-pass")
        if self.calls:  # an argument equal to the first batch's (a mask, rotary tables) is held once, not per batch
            calls = [self._as_shared(call, i) for i, call in enumerate(calls)]
        self.calls.append(calls)

    def _as_shared(self, call: tuple, i: int) -> tuple:
        """Block i's captured call with each argument equal to batch 0's replaced by batch 0's own object."""
        (args, kw, key), (first_args, first_kw, _) = call, self.calls[0][i]
        return _shared(args, first_args), {k: _shared(v, first_kw.get(k)) for k, v in kw.items()}, key

    def run_block(self, i: int, b: int, hidden: torch.Tensor) -> torch.Tensor:
        args, kwargs, key = self.calls[b][i]
        with torch.no_grad():
            out = self.blocks[i](hidden, *args, **kwargs) if key is None else \
                self.blocks[i](*args, **{**kwargs, key: hidden})
        return _output_of(out)

    def _check_replay(self) -> None:
        """The dense blocks replayed one at a time from block 0's input give the model's own last-block output
        (batch 0), or the model is refused: a block that reads more than its hidden states and captured arguments
        (a state passed between blocks) would be calibrated on something the model never computes."""
        h = self.hidden[0]
        for i in range(len(self.blocks)):
            h = self.run_block(i, 0, h)
        ref = self.dense_out
        err = float((h.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30))
        if not math.isfinite(err) or err > REPLAY_TOLERANCE:
            raise UserError(f"sequential calibration: replaying this model's decoder blocks one at a time differs from "
                            f"its own forward (relative error {err:.2g}), so its blocks pass more than hidden states "
                            "between them: use --calibration-mode one-pass")

    @property
    def held_bytes(self) -> int:
        return sum(h.numel() * h.element_size() for h in self.hidden)

    def advance(self, i: int) -> None:
        """Each batch's hidden states moved past block i (as it is now: compressed or not)."""
        for b, h in enumerate(self.hidden):
            self.hidden[b] = self.run_block(i, b, h)


def block_statistics(chain: BlockChain, i: int, groups, needed: frozenset[str], spec: CalibSpec
                     ) -> dict[str, GroupStats]:
    """Block i's groups' statistics from the hidden states entering it now (no gradients)."""
    model = chain.model
    acts = {g.name: (activation_module(model, g) or (None, None))[1] for g in groups} if "act_hist" in needed else {}
    collectors = [_GroupCollector(g, needed, 0, group_generator(spec.seed, g.name), acts.get(g.name))
                  for g in groups]
    try:
        for b, h in enumerate(chain.hidden):
            chain.run_block(i, b, h)
    finally:
        for c in collectors:
            c.remove_hooks()
    return {c.group.name: c.finish() for c in collectors}


def sequential_pass(model, groups, windows: torch.Tensor, needed: frozenset[str], spec: CalibSpec,
                    compress_block: Callable[[list, dict], None], batch_size: int = 2, progress: bool = True,
                    check: Callable[[dict], None] | None = None) -> dict:
    """Calibrate and compress `groups` block by block: block i's statistics from the outputs of blocks 0..i-1 as
    compressed, then `compress_block(its groups, their statistics)` deploys them in place, then the windows move
    past the compressed block. Blocks after the last one with a group are not run. `check(stats)` vets each
    block's statistics (finite). Returns the calibration record's counts: tokens, blocks, held bytes, and the
    seconds spent calibrating (the compress callbacks' time excluded)."""
    t0 = time.perf_counter()
    chain = BlockChain(model, windows, batch_size, progress)
    by_block: dict[int, list] = {}
    for g in groups:
        by_block.setdefault(g.block, []).append(g)
    last = max(by_block, default=-1)
    solving = 0.0
    for i in tqdm(range(last + 1), desc="sequential calibration", disable=not progress, leave=False):
        mine = by_block.get(i, [])
        if mine:
            stats = block_statistics(chain, i, mine, needed, spec)
            if check is not None:
                check(stats)
            s0 = time.perf_counter()
            compress_block(mine, stats)
            solving += time.perf_counter() - s0
            del stats
        if i < last:
            chain.advance(i)
    return {"n_tokens": int(windows.numel()), "seconds": time.perf_counter() - t0 - solving,
            "blocks": last + 1, "held_bytes": chain.held_bytes}
