"""The calibration engine: hooks collect only the statistics the chosen methods need."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import hashlib
import math
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as Fn
from torch import nn
from tqdm.auto import tqdm

from acbench.core.errors import UserError
from acbench.core.stats import GRADIENT_STATS, HIST_BINS, ONE_PASS, GroupStats, magnitude_histogram

from acbench.model.groups import InputGroup, activation_module
from acbench.model.modes import restore_modes, training_modes


# Bumped whenever what calibration computes changes, so cached statistics from older code are never reused.
STATS_VERSION = 5  # 4: each group draws its (x, g) sample from its own seeded generator; 5: files checked by content


@dataclass(frozen=True)
class CalibSpec:
    samples: int = 12  # calibration windows
    seq_len: int = 256
    seed: int = 0
    pair_tokens: int = 512  # bounded (x, g) token sample per group, for coupling statistics
    source: str = "wiki"
    bos: str = "none"  # BOS protocol of the windows (acbench.tasks.data.text_data.BOS_PROTOCOLS)
    mode: str = ONE_PASS

    def as_dict(self) -> dict:
        """The spec as a cell and a cache key store it: the mode only where it is not the default one-pass, so the
        keys of every cell and statistics folder made before modes existed stay as they were."""
        out = asdict(self)
        if self.mode == ONE_PASS:
            del out["mode"]
        return out

    @property
    def windows_key(self) -> tuple:
        """What the calibration windows depend on (two specs with one key read the same tokens)."""
        return (self.samples, self.seq_len, self.seed, self.source, self.bos)


def next_token_loss_sum(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Summed next-token cross-entropy; labels are shifted here, exactly once."""
    return Fn.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(), input_ids[:, 1:].reshape(-1), reduction="sum"
    )


def backward_next_token_loss(logits: torch.Tensor, input_ids: torch.Tensor, rows: int = 256) -> None:
    """Backpropagates `next_token_loss_sum` from its gradient at the logits, taken a block of positions at a time.
    Autograd on the whole loss holds the shifted copy of the logits, their log-softmax and both gradients at once:
    on Gemma's 262k-token vocabulary, a 2 x 2,048 batch went past 23 GB. Each block is the same kernels on the same
    rows (the log-softmax reads one row), so the gradient, and every statistic after it, is unchanged to the bit.
    Each block's gradient overwrites its logits, read just before, where no node of the forward kept the logits for
    its backward: one vocabulary-wide tensor instead of two (4.3 GB less on Gemma at 2 x 2,048)."""
    grad = logits.detach() if logits_unsaved(logits) else torch.zeros_like(logits)
    length = logits.shape[1] - 1  # the last position predicts nothing
    with torch.enable_grad():
        for i in range(logits.shape[0]):
            for start in range(0, length, rows):
                stop = min(start + rows, length)
                block = logits[i, start:stop].detach().requires_grad_(True)
                loss = Fn.cross_entropy(block.float(), input_ids[i, start + 1:stop + 1], reduction="sum")
                grad[i, start:stop] = torch.autograd.grad(loss, block)[0]
    grad[:, length:] = 0
    logits.backward(grad)


def logits_unsaved(logits: torch.Tensor, depth: int = 4) -> bool:
    """Whether the nodes that made the logits (the last `depth` of the forward, views and casts included) kept no
    tensor on the logits' storage for their backward: then the storage may take the gradient. A node that keeps its
    result (a final tanh, say) would otherwise read its gradient as its output; autograd's version check refuses
    that loudly, and this check keeps it from arising."""
    storage = logits.untyped_storage().data_ptr()
    node = logits.grad_fn
    for _ in range(depth):
        if node is None:
            return True
        for name in dir(node):
            if not name.startswith("_saved_"):
                continue
            try:
                value = getattr(node, name)
            except RuntimeError:  # a saved tensor already freed or hooked away: nothing can be told, so keep a copy
                return False
            values = value if isinstance(value, (tuple, list)) else (value,)
            if any(isinstance(v, torch.Tensor) and v.untyped_storage().data_ptr() == storage for v in values):
                return False
        node = next((f for f, _ in node.next_functions if f is not None), None)
    return True


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers in glibc's malloc.h
LARGE_BLOCK = 4 << 20
HEAP_BLOCK = 32 << 20  # the ceiling of glibc's own moving mmap threshold on 64-bit, where a long run's ends up


@functools.cache
def _glibc():
    """The C library, where it is glibc (it has malloc_trim and mallopt); else None."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim.argtypes, libc.mallopt.argtypes = [ctypes.c_size_t], [ctypes.c_int, ctypes.c_int]
    except (OSError, AttributeError):
        return None
    return libc


_ALLOCATOR_TUNED: list[bool] = []  # non-empty within allocator_tuning()


@contextmanager
def allocator_tuning():
    """Within: a gradient calibration maps large blocks on their own and puts a heap threshold back after it (the
    two calls below). glibc's thresholds belong to the process, cannot be read back, and any mallopt call switches
    off glibc's own moving threshold for good: so only an application turns this on (the CLI, a Ray worker it
    starts). A Python call into acbench leaves the caller's allocator as it found it (and a long gradient
    calibration then holds more memory)."""
    _ALLOCATOR_TUNED.append(True)
    try:
        yield
    finally:
        _ALLOCATOR_TUNED.pop()


def map_large_blocks() -> bool:
    """For a gradient calibration: blocks of 4 MiB and more are mapped on their own, so freeing one hands it back.
    A backward pass frees tensors of many sizes, and glibc's moving threshold let them pile up in its heap: SmolLM2's
    gradient calibration (2 x 2,048 tokens a batch, one core) grew from 11.5 to 16.5 GB over six batches, and with
    this and `release_freed_memory` peaked at 10.2 GB, at 65 s a batch against 61 (measured beside another process).
    """
    libc = _glibc() if _ALLOCATOR_TUNED else None
    return bool(libc is not None and libc.mallopt(M_MMAP_THRESHOLD, LARGE_BLOCK))


def heap_large_blocks() -> bool:
    """After a gradient calibration: blocks under 32 MiB come from the heap again. Left at 4 MiB, every later solve
    and evaluation mapped and faulted in each medium temporary afresh: the default run's fasc solves took 197 s
    against 107 before, with 3.8 minutes of system time (a float64 loop of 10 MB products: 5x the page faults)."""
    libc = _glibc() if _ALLOCATOR_TUNED else None
    return bool(libc is not None and libc.mallopt(M_MMAP_THRESHOLD, HEAP_BLOCK)
                and libc.mallopt(M_TRIM_THRESHOLD, 2 * HEAP_BLOCK))


def release_freed_memory() -> None:
    """Hands the heap pages the last batch freed back to the system (glibc's malloc_trim)."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def group_generator(seed: int, group: str) -> torch.Generator:
    """Each group's token sample has its own seeded generator, so calibrating the groups in several passes (a
    memory budget) draws exactly the tokens one pass would."""
    digest = hashlib.sha256(f"{seed}|{group}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))


def _accumulate(total: torch.Tensor, product: torch.Tensor, rows: int = 1024) -> None:
    """total (float64, host) += product (float32, any device), a slab of rows at a time: at d = 14336 a whole
    float64 copy of the product would be 1.6 GB of temporary memory per group and batch."""
    for r in range(0, product.shape[0], rows):
        total[r:r + rows] += product[r:r + rows].double().cpu()


class _GroupCollector:
    def __init__(self, group: InputGroup, needed: frozenset[str], pairs_per_batch: int, gen: torch.Generator,
                 activation: nn.Module | None = None):
        self.group, self.needed = group, needed
        d = group.d_in
        self.n = 0
        self.n_grad = 0  # tokens read by calls a gradient reaches
        self.C = torch.zeros(d, d, dtype=torch.float64) if "C" in needed else None
        self.abs_sum = torch.zeros(d, dtype=torch.float64) if "abs_mean" in needed else None
        self.sum = torch.zeros(d, dtype=torch.float64) if "mean" in needed else None
        self.hist = torch.zeros(HIST_BINS, dtype=torch.float64) if "abs_hist" in needed else None
        # |act(z)| of the activation module feeding the group (CATS); zeros where there is none of the group's width
        self.act_hist = torch.zeros(HIST_BINS, dtype=torch.float64) if "act_hist" in needed else None
        self.act_handle = activation.register_forward_hook(self._act_hook) \
            if activation is not None and self.act_hist is not None else None
        self.F = torch.zeros(d, d, dtype=torch.float64) if "F" in needed else None
        self.xs, self.gs = [], []
        self.pairs_per_batch, self.gen = pairs_per_batch, gen
        self.row_fisher = {n: torch.zeros(s.out_features, dtype=torch.float64)
                           for n, s in zip(group.site_names, group.sites)} if "row_fisher" in needed else None
        self._seen: torch.Tensor | None = None
        self._n_at_backward = 0  # tokens read when the last backward was taken in
        self._graded_sites: set[str] = set()  # sites whose weight gradient this backward delivered
        self._weight_handles: list = []
        self.handle = group.sites[0].register_forward_pre_hook(self._pre_hook)

    def hook_weight_grads(self):
        """Read each site's weight gradient (the row Fisher) as autograd lands it, then drop it. Left on the weights
        to the end of the backward, every site's float32 weight gradient is alive at once: the linear layers' size
        again (0.4 GB for SmolLM2-135M, 28 GB for an 8B model). Autograd sums a weight's gradients from all its uses
        before it lands, so each backward delivers one per site, as .grad held to the end would."""
        if self.row_fisher is None:
            return
        for n, s in zip(self.group.site_names, self.group.sites):
            self._weight_handles.append(s.weight.register_post_accumulate_grad_hook(
                lambda w, n=n: self._weight_grad(n, w)))

    def _weight_grad(self, name: str, weight: torch.Tensor):
        self.row_fisher[name] += (weight.grad.double() ** 2).sum(1).cpu()
        weight.grad = None
        self._graded_sites.add(name)

    def _pre_hook(self, module, args):
        x = args[0]
        flat = x.detach().reshape(-1, x.shape[-1])
        self.n += flat.shape[0]
        # Per-batch products in float32 (on the model's device), summed across batches in float64.
        if self.C is not None:
            xf = flat.float()
            _accumulate(self.C, xf.T @ xf)
        if self.abs_sum is not None:
            self.abs_sum += flat.float().abs().sum(0).double().cpu()
        if self.sum is not None:
            self.sum += flat.float().sum(0).double().cpu()
        if self.hist is not None:
            self.hist += magnitude_histogram(flat).cpu()
        idx = None
        # a recurrent model (HRM) runs its blocks several times per forward, all but the last without gradients:
        # g-statistics average over the calls a gradient reaches, and (x, g) pairs are sampled from those only
        graded = x.requires_grad
        if graded:
            self.n_grad += flat.shape[0]
        sample_x = ("pairs" in self.needed and graded) or ("tokens" in self.needed and "pairs" not in self.needed)
        if sample_x:
            # Position 0 (BOS) is the same token with the same activation in every window: duplicates with
            # outsized norms would dominate the fourth-moment (coupling) statistics, so it is never sampled.
            seq = x.shape[1] if x.dim() == 3 else flat.shape[0]
            pool = torch.arange(flat.shape[0])
            pool = pool[pool % seq != 0]
            m = min(self.pairs_per_batch, len(pool))
            idx = pool[torch.randperm(len(pool), generator=self.gen)[:m]].to(flat.device)
            self.xs.append(flat[idx].float().cpu())
        if (self.F is not None or (idx is not None and "pairs" in self.needed)) and graded:
            x.register_hook(lambda g, idx=idx: self._grad_hook(g, idx))

    def _act_hook(self, module, args, out):
        if isinstance(out, torch.Tensor) and out.shape[-1] == self.group.d_in:
            self.act_hist += magnitude_histogram(out.detach().reshape(-1)).cpu()

    def remove_hooks(self):
        self.handle.remove()
        if self.act_handle is not None:
            self.act_handle.remove()
        for h in self._weight_handles:
            h.remove()
        self._weight_handles = []

    def _grad_hook(self, g, idx):
        flat = g.detach().reshape(-1, g.shape[-1])
        if self.F is not None:
            gf = flat.float()
            _accumulate(self.F, gf.T @ gf)
        if idx is not None and "pairs" in self.needed:
            self.gs.append(flat[idx].float().cpu())

    def after_backward(self):
        if self.row_fisher is not None:
            for n in self.group.site_names:
                if n not in self._graded_sites:
                    if self.n == self._n_at_backward:
                        continue  # it read no token since the last backward (an expert its router did not choose)
                    # it ran, but its output reaches the loss only through a selection (an index, a top-k)
                    raise UserError(f"site {n} got no gradient in calibration: its output does not reach the loss "
                                    "differentiably, so gradient statistics cannot weigh it; leave its group out "
                                    "with --groups or use a method that needs no gradients")
            self._graded_sites.clear()
        self._n_at_backward = self.n

    def finish(self) -> GroupStats:
        self.remove_hooks()
        n = max(self.n, 1)
        # in place: a copy of C and F would double the pass's memory at the very end
        return GroupStats(
            n_tokens=self.n,
            C=None if self.C is None else self.C.div_(n),
            abs_mean=None if self.abs_sum is None else self.abs_sum.div_(n),
            mean=None if self.sum is None else self.sum.div_(n),
            abs_hist=None if self.hist is None else self.hist.div_(max(float(self.hist.sum()), 1.0)),
            act_hist=None if self.act_hist is None else self.act_hist.div_(max(float(self.act_hist.sum()), 1.0)),
            F=None if self.F is None else self.F.div_(max(self.n_grad, 1)),
            xs=torch.cat(self.xs) if self.xs else None,
            gs=torch.cat(self.gs) if self.gs else None,
            row_fisher=self.row_fisher,
        )


class _HeadReached(Exception):
    """Raised as the output head is called, in a pass that reads no gradients: every group has had its input."""


def _stop_at_head(model: nn.Module, groups: list[InputGroup]):
    """A hook that ends a forward at the output head, or None where that is not safe. Activation statistics are all
    read inside the blocks, so the head's product (on Gemma's 262k-token vocabulary, 44 % of a 2 x 2,048 forward
    measured on one core) and its logits (4 GB there) are work thrown away. Not where the head is the input
    embedding itself or one of the groups' sites: the stop would come before a group's input."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    sites = {id(s) for g in groups for s in g.sites}
    if not isinstance(head, nn.Module) or head is model.get_input_embeddings() or id(head) in sites:
        return None

    def stop(module, args):
        raise _HeadReached
    return head.register_forward_pre_hook(stop)


def calibrate(
    model: torch.nn.Module,
    groups: list[InputGroup],
    windows: torch.Tensor,
    needed: frozenset[str],
    spec: CalibSpec,
    batch_size: int = 2,
    progress: bool = True,
    desc: str = "calibrate",
) -> dict[str, GroupStats]:
    """One forward (and, if gradients are needed, one backward) pass per batch of calibration windows.

    g is dL/dx at the group input for L = the summed next-token loss, so it does not depend on batch size.
    """
    if not needed:
        return {g.name: GroupStats() for g in groups}
    device = next(model.parameters()).device
    n_batches = math.ceil(len(windows) / batch_size)
    pairs_per_batch = math.ceil(spec.pair_tokens / n_batches)
    acts = {g.name: (activation_module(model, g) or (None, None))[1] for g in groups} if "act_hist" in needed else {}
    collectors = [_GroupCollector(g, needed, pairs_per_batch, group_generator(spec.seed, g.name), acts.get(g.name))
                  for g in groups]
    want_grad = bool(needed & GRADIENT_STATS)
    if want_grad:
        map_large_blocks()
    modes = training_modes(model)
    model.eval()
    saved_flags = {p: p.requires_grad for p in model.parameters()}
    embed_handle = head_handle = None
    try:
        for p in model.parameters():
            p.requires_grad_(False)
        if "row_fisher" in needed:
            for g in groups:
                for s in g.sites:
                    s.weight.requires_grad_(True)
            for c in collectors:
                c.hook_weight_grads()
        if want_grad:
            # Gradients must flow to every group input even with frozen weights. A copy of the embeddings (not the
            # leaf itself) goes on, since some models add to it in place (GIT, CTRL: embeddings += positions).
            embed_handle = model.get_input_embeddings().register_forward_hook(
                lambda m, a, out: out.requires_grad_(True).clone()
            )
        head_handle = None if want_grad else _stop_at_head(model, groups)
        for b in tqdm(range(n_batches), desc=desc, disable=not progress, leave=False):
            ids = windows[b * batch_size:(b + 1) * batch_size].to(device)
            with torch.set_grad_enabled(want_grad):
                try:
                    logits = model(input_ids=ids, use_cache=False).logits
                except _HeadReached:
                    logits = None
                if want_grad:
                    backward_next_token_loss(logits, ids)
            del logits
            for c in collectors:
                c.after_backward()
            if want_grad:
                release_freed_memory()
    finally:
        if want_grad:
            heap_large_blocks()
        for c in collectors:
            c.remove_hooks()
        for handle in (embed_handle, head_handle):
            if handle is not None:
                handle.remove()
        for p, flag in saved_flags.items():
            p.requires_grad_(flag)
        restore_modes(modes)
    return {c.group.name: c.finish() for c in collectors}


def needed_stats(compressors, extra: frozenset[str] = frozenset()) -> frozenset[str]:
    """The union of what the method instances read (a method's needs may depend on its settings)."""
    out = set(extra)
    for comp in compressors:
        out |= comp.required_stats()
    return frozenset(out)
