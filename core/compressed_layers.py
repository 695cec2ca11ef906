"""The modules a compressed model runs, and how to build them from the layout its config records.

This file imports torch, `.experts` and `.sparsity` only (and triton, where the CUDA decode kernel runs): a checkpoint written by `bench compress` carries a copy of both as
its custom code (transformers loads them through the config's `auto_map`), so the code a sweep evaluates is the
code a saved model runs, with or without acbench installed.

A layout is `{site name: spec}`, stored in the config under LAYOUT_KEY. Specs by form:
- factorised: {k, d_in, d_out, bias, owner}: y = A (B x) + bias; sites naming one owner share its B;
- sparse-activation: {keep, block, mitigation, scale, mu, threshold, d_in, d_out, owner, and rotation where the
  input is rotated before its top-k, rank where the dropped channels go through low-rank factors}: the group input
  sparsified once
  (keep `keep` of every `block` channels per token; block 0 = of the whole row), read by every site, whose
  weight is stored input-major (`weight_t`, the layout the decode path's gathered product reads);
- activation-threshold (keyed by the activation module's name, not a site's): {d_in}: the MLP's activation wrapped
  so that every |act(z)_i| <= threshold becomes 0 (CATS), the threshold a buffer;
- merged and masked-weights: dense-shaped weights, nothing to build.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch
import torch.nn.functional as Fn
from torch import nn

from .experts import split_experts
from .sparsity import sparse_input, sparsify

LAYOUT_KEY = "acbench_compression"
RUNTIME_FORMS = ("factorised", "sparse-activation", "activation-threshold")  # the forms whose modules a loader must build


class _Memo:
    """ReadOnce's mutable state, a plain object: an nn.Module's own attribute writes cost microseconds each (its
    __setattr__ checks for parameters and submodules), and decode writes these twice per site and token."""

    __slots__ = ("entry", "hits", "computed")

    def __init__(self):
        self.entry: tuple | None = None  # (x, x's version, value)
        self.hits = 0
        self.computed = 0


class ReadOnce:
    """What the sites of one group share: a function of their input x computed once per input tensor and handed to
    each of the `n_readers` sites. The cache holds x itself, so its identity cannot be reused by another tensor
    while cached; once every reader has the value it is freed."""

    def __init__(self):
        self._memo = _Memo()
        self.n_readers = 1  # sites reading the shared value (set on the owner)

    @property
    def n_computed(self) -> int:
        """Values actually computed (not served from the cache)."""
        return self._memo.computed

    def shared(self, x: torch.Tensor, compute):
        memo = self._memo
        entry = memo.entry
        if entry is not None and entry[0] is x and entry[1] == x._version:
            out = entry[2]
            memo.hits += 1
        else:
            out = compute(x)
            memo.computed += 1
            memo.entry, memo.hits = (x, x._version, out), 1
        if memo.hits >= self.n_readers:
            memo.entry = None
        return out


def _apply(lin: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """lin(x), as the bare product where nothing hooks the module: at decode a module call's own cost is a fifth of
    a small factor's time. A hooked module (accelerate's device and offload hooks, forward hooks) is called."""
    if lin._forward_pre_hooks or lin._forward_hooks or "_hf_hook" in lin.__dict__:
        return lin(x)
    return Fn.linear(x, lin.weight, lin.bias)


class LowRankLinear(ReadOnce, nn.Module):
    """y = A (B x) + bias. Sites of one group share the owner's B, and z = B x is computed once per input."""

    def __init__(self, in_features: int, out_features: int, k: int, bias: bool, owner: "LowRankLinear | None" = None,
                 dtype=None, device=None):
        nn.Module.__init__(self)
        ReadOnce.__init__(self)
        self.in_features, self.out_features, self.k = in_features, out_features, k
        self.A = nn.Linear(k, out_features, bias=bias, dtype=dtype, device=device)
        if owner is None:
            self.B = nn.Linear(in_features, k, bias=False, dtype=dtype, device=device)
            owner = self
        # A plain attribute, not a submodule: the shared B is stored once, under the owner.
        object.__setattr__(self, "_owner", owner)

    def project(self, x: torch.Tensor) -> torch.Tensor:
        if self.n_readers == 1:  # nothing to share: no cache bookkeeping at decode
            return _apply(self.B, x)
        return self.shared(x, lambda t: _apply(self.B, t))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _apply(self.A, self._owner.project(x))

    def extra_repr(self) -> str:
        return f"in={self.in_features}, k={self.k}, out={self.out_features}, shared_B={self._owner is not self}"


# A gathered product of at least this many weight entries (kept channels x outputs) is split into one bag per CPU
# thread, summed after: embedding_bag runs its bags in parallel but one bag on one core, so a single bag reads
# memory at one core's speed (1.3-1.6x faster split in two on 2 cores at Gemma's and SmolLM2's shapes; below
# this size the extra sum costs more than it gains).
SPLIT_MIN_PRODUCT = 1 << 17
_OFFSETS: dict = {}


def bag_offsets(rows: int, per_row: int, parts: int, device) -> tuple[torch.Tensor, int]:
    """Where each bag starts in the flat indices of `rows` rows of `per_row` kept channels each, every row cut
    into (at most) `parts` bags; and the number of bags per row. Kept per shape: decode asks for the same few."""
    key = (rows, per_row, parts, str(device))
    if key not in _OFFSETS:
        step = max(1, -(-per_row // parts))
        starts = list(range(0, per_row, step)) or [0]
        offsets = [r * per_row + s for r in range(rows) for s in starts]
        _OFFSETS[key] = (torch.tensor(offsets, dtype=torch.long, device=device), len(starts))
    return _OFFSETS[key]


# At most this many input rows (tokens) take the gathered product: each row reads its own kept weight rows, so
# at density 0.5 two rows already read as many weight bytes as one dense product, which wins from there on.
GATHER_MAX_ROWS = 1


# The gathered product's kernel. On CPU: embedding_bag. On CUDA: a Triton kernel where triton imports (TEAL's
# sparse GEMV: every program reads a tile of the kept channels' weight rows, contiguous along the outputs), else
# embedding_bag. ACBENCH_DECODE_KERNEL (auto, embedding_bag, triton) chooses, read once per device type; triton on
# CPU runs only under triton's interpreter (TRITON_INTERPRET=1), which is how the CPU tests check the kernel.
DECODE_KERNELS = ("auto", "embedding_bag", "triton")
_CHOSEN: dict[str, str] = {}


def triton_importable() -> bool:
    return importlib.util.find_spec("triton") is not None


def requested_decode_kernel(requested: str | None = None) -> str:
    """`requested`, else ACBENCH_DECODE_KERNEL, else auto; ValueError naming the fix for a name that is not a
    kernel (whether it can run on a device is `choose_decode_kernel`'s to say)."""
    requested = requested or os.environ.get("ACBENCH_DECODE_KERNEL") or "auto"
    if requested not in DECODE_KERNELS:
        raise ValueError(f"ACBENCH_DECODE_KERNEL={requested!r} is not a decode kernel: set it to one of "
                         f"{', '.join(DECODE_KERNELS)}, or unset it")
    return requested


def choose_decode_kernel(device_type: str, requested: str | None = None) -> str:
    """The kernel the gathered product runs on `device_type` ("cpu", "cuda"): `requested`, else
    ACBENCH_DECODE_KERNEL, else auto (triton on CUDA where it imports, embedding_bag elsewhere). One line naming
    the fix where the request cannot be met."""
    requested = requested_decode_kernel(requested)
    if requested == "embedding_bag":
        return requested
    if requested == "triton":
        if not triton_importable():
            raise ValueError("ACBENCH_DECODE_KERNEL=triton, but triton does not import: install it (a CUDA build "
                             "of torch brings it) or set ACBENCH_DECODE_KERNEL=embedding_bag")
        if device_type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(f"ACBENCH_DECODE_KERNEL=triton needs a CUDA device (this model is on {device_type}), "
                             "or TRITON_INTERPRET=1 to run it in triton's interpreter (slow; for tests)")
        return requested
    return "triton" if device_type == "cuda" and triton_importable() else "embedding_bag"


def decode_kernel(device_type: str) -> str:
    if device_type not in _CHOSEN:
        _CHOSEN[device_type] = choose_decode_kernel(device_type)
    return _CHOSEN[device_type]


# The Triton kernel's tiles, and how many programs per streaming multiprocessor it aims for (splitting the kept
# channels when the outputs alone give too few programs: a 4096-wide output is 32 tiles of 128, and an H200 has
# 132 SMs). Not tuned on a GPU yet: benchmarks/gpu_check.sh measures it against embedding_bag.
TRITON_BLOCK_N, TRITON_BLOCK_K, TRITON_PROGRAMS_PER_SM = 128, 32, 4


@functools.cache
def _triton_kernel():
    """The kernel, defined on first use, so triton is imported only where it runs. (Triton's interpreter needs
    TRITON_INTERPRET=1 before triton is first imported: the CPU tests' conftest sets it.)"""
    import triton
    import triton.language as tl

    @triton.jit
    def gathered_rows(idx_ptr, val_ptr, w_ptr, part_ptr, per_row, d_out, w_stride, per_split,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        # program (row, output tile, split): sum over this split's kept channels j of val_j * W^T[idx_j, tile]
        row, tile, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        cols = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < d_out
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for k0 in range(0, per_split, BLOCK_K):
            pos = split * per_split + k0 + tl.arange(0, BLOCK_K)
            ok = pos < per_row  # per_split is whole tiles: only the last split runs past the kept channels
            chan = tl.load(idx_ptr + row * per_row + pos, mask=ok, other=0)
            val = tl.load(val_ptr + row * per_row + pos, mask=ok, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + chan[:, None] * w_stride + cols[None, :], mask=ok[:, None] & col_ok[None, :],
                        other=0.0)
            acc += tl.sum(w.to(tl.float32) * val[:, None], axis=0)
        tl.store(part_ptr + (split * tl.num_programs(0) + row) * d_out + cols, acc, mask=col_ok)

    return gathered_rows


def triton_splits(programs: int, per_row: int, sms: int) -> tuple[int, int]:
    """How the kept channels are cut: (parts, channels per part). Enough parts for TRITON_PROGRAMS_PER_SM programs
    per SM, each a whole number of TRITON_BLOCK_K-channel tiles, so only the last may be short and none is
    empty."""
    want = -(-TRITON_PROGRAMS_PER_SM * sms // max(programs, 1))
    parts = max(1, min(want, -(-per_row // TRITON_BLOCK_K)))
    per_part = -(-per_row // parts)
    per_part = -(-per_part // TRITON_BLOCK_K) * TRITON_BLOCK_K
    return max(1, -(-per_row // per_part)), per_part


def _sm_count(device: torch.device) -> int:
    # the interpreter on CPU: a small GPU's count, so the CPU tests cut the kept channels too
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def triton_gathered_product(idx: torch.Tensor, vals: torch.Tensor, weight_t: torch.Tensor, rows: int,
                            per_row: int) -> torch.Tensor:
    """rows x d_out: row r is sum_j vals[r, j] W^T[idx[r, j]] (flat idx and vals, per_row of them per row),
    accumulated in float32, each split's partial sums added after (no atomics: the same bits every run)."""
    d_out = weight_t.shape[1]
    if per_row == 0:
        return torch.zeros(rows, d_out, dtype=weight_t.dtype, device=weight_t.device)
    kernel = _triton_kernel()
    tiles = -(-d_out // TRITON_BLOCK_N)
    splits, per_split = triton_splits(rows * tiles, per_row, _sm_count(weight_t.device))
    part = torch.empty(splits, rows, d_out, dtype=torch.float32, device=weight_t.device)
    if weight_t.stride(1) != 1:  # the kernel reads each kept row's outputs as one contiguous run
        weight_t = weight_t.contiguous()
    kernel[(rows, tiles, splits)](idx.contiguous(), vals.contiguous(), weight_t, part, per_row, d_out,
                                  weight_t.stride(0), per_split, BLOCK_N=TRITON_BLOCK_N, BLOCK_K=TRITON_BLOCK_K)
    return (part[0] if splits == 1 else part.sum(0)).to(weight_t.dtype)


class InputSparsifier(ReadOnce, nn.Module):
    """The sparse x of one input group, computed once per input tensor and read by every site of the group (as an
    accelerator reads the sparse activation once). scale, mu: per-channel score factors and calibrated mean.

    Its value is ("gathered", indices, values, eta, rows, per_row) for an input of at most GATHER_MAX_ROWS tokens
    (decode; flat indices and values, per_row of them for each row: a top-k's fixed count, or the single row's
    count above a threshold) and ("masked", x_sparse, eta) otherwise (prefill, evaluation)."""

    def __init__(self, n: int, m: int, mitigation: str, scale: torch.Tensor | None, mu: torch.Tensor | None,
                 dtype=None, device=None, threshold: float | None = None, rotation: torch.Tensor | None = None,
                 dense_prefix: float = 0.0):
        nn.Module.__init__(self)
        ReadOnce.__init__(self)
        self.n, self.m, self.mitigation = n, m, mitigation
        self.gather = True  # False: every input takes the masked dense product (the reference form)
        as_buffer = lambda t: None if t is None else t.to(dtype=dtype, device=device)
        self.register_buffer("scale", as_buffer(scale))
        self.register_buffer("mu", as_buffer(mu))
        # a static magnitude threshold (TEAL) replaces the top-k: keep |x_j| * scale_j > threshold (scale_j = 1 when
        # None); no mitigation applies to it (SparseActivation refuses the combination)
        self.register_buffer("threshold", None if threshold is None else
                             torch.tensor(float(threshold), dtype=dtype, device=device))
        # LaRoSa: the top-k is taken on z = x Q, and every reading site holds W Q
        self.register_buffer("rotation", as_buffer(rotation))
        # TEAL's evaluation: the first dense_prefix of each sequence a forward sees (its prompt half, at 0.5) is left
        # dense and only the rest sparsified; decode steps are always sparsified
        self.dense_prefix = float(dense_prefix)
        self.reset_counts()

    def reset_counts(self) -> None:
        """The numbers kept and seen since the last reset (thresholds only: their density varies per token)."""
        self.kept, self.seen = 0, 0

    def _sparsify(self, x: torch.Tensor):
        if self.rotation is not None:
            x = x @ self.rotation
        decode = self.gather and x.numel() <= GATHER_MAX_ROWS * x.shape[-1]
        if self.threshold is not None:
            keep = (x.abs() if self.scale is None else x.abs() * self.scale) > self.threshold
            if self.dense_prefix and not decode and x.dim() >= 3:
                keep[..., : int(x.shape[-2] * self.dense_prefix), :] = True
            if decode:  # one bag of however many channels pass: 1-d indices with one offset
                idx = keep.reshape(-1).nonzero().squeeze(1)
                return "gathered", idx, x.reshape(-1)[idx], None, 1, idx.numel()
            # counted on the evaluation's inputs (many tokens at a time), not on the decode steps latency times
            self.kept, self.seen = self.kept + keep.sum(), self.seen + keep.numel()
            return "masked", torch.where(keep, x, torch.zeros((), dtype=x.dtype, device=x.device)), None
        if decode:
            idx, vals, eta = sparse_input(x.reshape(-1, x.shape[-1]), self.n, self.m, self.scale, self.mitigation,
                                          self.mu)
            # flat indices with explicit offsets: a 2-d input makes embedding_bag build its offsets on every
            # call, a third of a small site's time
            return "gathered", idx.reshape(-1), vals.reshape(-1), eta, idx.shape[0], idx.shape[-1]
        return ("masked", *sparsify(x, self.n, self.m, self.scale, self.mitigation, self.mu))

    def forward(self, x: torch.Tensor):
        return self.shared(x, self._sparsify)

    def extra_repr(self) -> str:
        if self.threshold is not None:
            score = "|x|" if self.scale is None else "|x| * scale"
            prefix = f", first {self.dense_prefix:g} of each sequence dense" if self.dense_prefix else ""
            return f"keep {score} > {float(self.threshold):.4g}{prefix}, readers={self.n_readers}"
        turn = ", rotated" if self.rotation is not None else ""
        return f"keep {self.n} of {self.m or 'all'}, mitigation={self.mitigation}{turn}, readers={self.n_readers}"


class SparseInputLinear(nn.Module):
    """y = W s(x) + b' : a site reading the group's sparse x. b' = b + W mu for the shift mitigation; a per-token
    median eta comes back as eta * (W 1).

    The weight is held once, input-major (`weight_t` = W^T, d_in x d_out, contiguous), the layout both products
    read: at decode the kept channels' rows are read and summed in one fused gather-multiply (embedding_bag with
    the kept values as per-sample weights, mode sum; on CUDA a Triton kernel reading the same rows, where triton
    imports), so the zeroed channels' weights are never touched; with more
    rows the masked x goes through one dense product with W^T's transpose view (no copy)."""

    def __init__(self, dense: nn.Linear, sparsifier: InputSparsifier, owner: bool):
        super().__init__()
        self.in_features, self.out_features = dense.in_features, dense.out_features
        object.__setattr__(self, "_sparsifier", sparsifier)  # read by every site of the group
        if owner:
            self.sparsifier = sparsifier  # and stored (its buffers) once, under the group's first site
        W = dense.weight.detach()
        with torch.no_grad():
            if sparsifier.rotation is not None:  # W Q: the site reads z = x Q
                W = (W.double() @ sparsifier.rotation.double()).to(W.dtype)
            self.weight_t = nn.Parameter(W.t().contiguous(), requires_grad=False)
            bias = dense.bias.detach().clone() if dense.bias is not None else None
            if sparsifier.mitigation == "shift":
                shift = (W.double() @ sparsifier.mu.double()).to(W.dtype)
                bias = shift if bias is None else bias + shift
            self.register_buffer("bias", bias)
            self.register_buffer("row_sum", W.sum(1) if sparsifier.mitigation == "median" else None)
        # R-Sparse: the dropped channels through low-rank factors, y += A (B (x - kept x)); None: no branch
        self.register_buffer("res_A", None)
        self.register_buffer("res_B", None)
        self._plans: dict = {}  # (rows, per_row, threads, device) -> this site's bag offsets (see _bags)

    def set_residual(self, A: torch.Tensor, B: torch.Tensor) -> None:
        """The low-rank branch of the dropped channels (A: d_out x r, B: r x d_in), in the site's dtype and device."""
        like = self.weight_t
        self.res_A = A.detach().to(dtype=like.dtype, device=like.device).contiguous()
        self.res_B = B.detach().to(dtype=like.dtype, device=like.device).contiguous()

    def _bags(self, rows: int, per_row: int, device) -> tuple[torch.Tensor, int]:
        """bag_offsets for this site's product of `rows` rows of `per_row` kept channels: split into one bag per
        CPU thread where the product is large enough to gain from it. Kept on the site per (rows, per_row,
        threads, device): decode asks for the same few, and the global lookup was most of a small site's
        overhead."""
        threads = torch.get_num_threads()
        key = (rows, per_row, threads, device)
        bags = self._plans.get(key)
        if bags is None:
            parts = threads if device.type == "cpu" and per_row * self.out_features >= SPLIT_MIN_PRODUCT else 1
            bags = self._plans[key] = bag_offsets(rows, per_row, parts, device)
        return bags

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sp = self._sparsifier
        # the sparsifier's forward called directly unless hooked: a module call is a tenth of a small site's time
        value = sp(x) if sp._forward_pre_hooks or sp._forward_hooks else sp.forward(x)
        bias = self.bias
        if value[0] == "gathered":
            _, idx, vals, eta, rows, per_row = value
            weight_t = self.weight_t
            if decode_kernel(weight_t.device.type) == "triton":
                y = triton_gathered_product(idx, vals, weight_t, rows, per_row)
            else:
                offsets, per = self._bags(rows, per_row, weight_t.device)
                # the op F.embedding_bag wraps, called directly: its argument checks cost as much as a small
                # site's product (mode 0 = sum; the kept values are the per-sample weights)
                y = torch.embedding_bag(weight_t, idx, offsets, False, 0, False, vals, False)[0]
                if per > 1:
                    y = y.view(rows, per, self.out_features).sum(1)
            if bias is not None:
                y = y + bias
            y = y.reshape(*x.shape[:-1], self.out_features)
            eta = None if eta is None else eta.reshape(x.shape[:-1])
            if self.res_A is not None:  # the dropped channels: x with the kept ones zeroed
                dropped = x.reshape(rows, -1).clone()
                dropped.scatter_(1, idx.view(rows, per_row), 0)
                y = y + Fn.linear(Fn.linear(dropped, self.res_B), self.res_A).reshape(y.shape)
        else:
            _, xs, eta = value
            y = Fn.linear(xs, self.weight_t.t(), bias)
            if self.res_A is not None:
                y = y + Fn.linear(Fn.linear(x - xs, self.res_B), self.res_A)
        return y if eta is None else y + eta.unsqueeze(-1) * self.row_sum

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, input-major weight"


class ThresholdedActivation(nn.Module):
    """CATS: a = act(z), with every |a_i| <= threshold set to 0 per token. In a gated MLP the product a * up(x) is
    then 0 there, so down_proj's column i and up_proj's row i need not be read (the masked dense form here computes
    them; its output is the same). Counts what it keeps on evaluation inputs, as a threshold sparsifier does."""

    def __init__(self, act: nn.Module, threshold: float, device=None):
        super().__init__()
        self.act = act
        # float32 whatever the model's dtype: a 0-d tensor compares with any activation dtype without casting it
        self.register_buffer("threshold", torch.tensor(float(threshold), dtype=torch.float32, device=device))
        self.reset_counts()

    def reset_counts(self) -> None:
        self.kept, self.seen = 0, 0

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        a = self.act(z)
        keep = a.abs() > self.threshold
        if a.numel() > a.shape[-1]:  # evaluation inputs, not a decode step (as InputSparsifier counts)
            self.kept, self.seen = self.kept + keep.sum(), self.seen + keep.numel()
        return torch.where(keep, a, torch.zeros((), dtype=a.dtype, device=a.device))

    def extra_repr(self) -> str:
        return f"keep |act| > {float(self.threshold):.4g}"


def set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent), child, module)


def _owners_first(layout: dict, form: str) -> list[tuple[str, dict]]:
    # a saved config may list sites in any order
    return sorted(((s, spec) for s, spec in layout.items() if spec.get("form") == form),
                  key=lambda item: item[1]["owner"] != item[0])


def build_factorised(model: nn.Module, layout: dict) -> dict[str, LowRankLinear]:
    """Empty low-rank modules in place of the layout's factorised sites, on each site's device and dtype."""
    built: dict[str, LowRankLinear] = {}
    for site, spec in _owners_first(layout, "factorised"):
        owner = built[spec["owner"]] if spec["owner"] != site else None
        ref = model.get_submodule(site).weight  # the site's own device (several with a device map) and dtype
        built[site] = LowRankLinear(spec["d_in"], spec["d_out"], spec["k"], spec["bias"], owner=owner,
                                    dtype=ref.dtype, device=ref.device)
    for mod in built.values():
        if mod._owner is not mod:
            mod._owner.n_readers += 1
    for site, mod in built.items():
        set_module(model, site, mod)
    return built


def build_sparse(model: nn.Module, layout: dict) -> dict[str, SparseInputLinear]:
    """The layout's sparse-activation sites wrapped around the model's own dense modules, with buffers of the
    recorded shapes (their values come from the checkpoint)."""
    sparsifiers: dict[str, InputSparsifier] = {}
    built: dict[str, SparseInputLinear] = {}
    for site, spec in _owners_first(layout, "sparse-activation"):
        dense = model.get_submodule(site)
        ref = dense.weight
        if spec["owner"] == site:
            empty = lambda wanted: torch.zeros(spec["d_in"], dtype=ref.dtype, device=ref.device) if wanted else None
            turn = (torch.zeros(spec["d_in"], spec["d_in"], dtype=ref.dtype, device=ref.device)
                    if spec.get("rotation") else None)
            sparsifiers[site] = InputSparsifier(spec["keep"], spec["block"], spec["mitigation"], empty(spec["scale"]),
                                                empty(spec["mu"]), ref.dtype, ref.device,
                                                0.0 if spec.get("threshold") else None, turn,
                                                spec.get("dense_prefix", 0.0))
            sparsifiers[site].n_readers = 0
        sparsifier = sparsifiers[spec["owner"]]
        sparsifier.n_readers += 1
        built[site] = SparseInputLinear(dense, sparsifier, owner=spec["owner"] == site)
        if spec.get("rank"):  # R-Sparse's low-rank branch, its values from the checkpoint
            built[site].set_residual(torch.zeros(spec["d_out"], spec["rank"]), torch.zeros(spec["rank"], spec["d_in"]))
    for site, mod in built.items():
        set_module(model, site, mod)
    return built


def build_thresholded(model: nn.Module, layout: dict) -> dict[str, ThresholdedActivation]:
    """The layout's activation modules wrapped with a threshold buffer (its value from the checkpoint), on the device
    of their MLP's weights."""
    built = {}
    for name, spec in layout.items():
        if spec.get("form") == "activation-threshold":
            act = model.get_submodule(name)
            parent = model.get_submodule(name.rpartition(".")[0])
            ref = next(parent.parameters(), None)
            built[name] = ThresholdedActivation(act, 0.0, None if ref is None else ref.device)
    for name, mod in built.items():
        set_module(model, name, mod)
    return built


def deploy_layout(model: nn.Module, layout: dict | None) -> dict[str, nn.Module]:
    """Build the modules a layout names, in place; their tensors are filled by loading the checkpoint."""
    layout = layout or {}
    # a built module inside fused experts replaces one of their per-expert views; dense-shaped forms (merged, masked
    # weights) are saved in the fused layout and need no split
    split_experts(model, [name for name, spec in layout.items() if spec.get("form") in RUNTIME_FORMS])
    return {**build_factorised(model, layout), **build_sparse(model, layout), **build_thresholded(model, layout)}


def compressed_subclass(base: type) -> type:
    """`base` (a transformers model class) building the modules its config's layout names after its own: the
    class a saved checkpoint's modeling file declares, and the one acbench loads checkpoints with."""

    class Compressed(base):
        def __init__(self, config, *args, **kwargs):
            super().__init__(config, *args, **kwargs)
            deploy_layout(self, getattr(config, LAYOUT_KEY, None))

    Compressed.__name__ = Compressed.__qualname__ = f"Compressed{base.__name__}"
    _inherit_key_renames(base, Compressed)
    return Compressed


def _inherit_key_renames(base: type, sub: type) -> None:
    """transformers renames some checkpoint keys by class name (GPT-NeoX saves its head as `embed_out`) or by model
    type (Gemma 3's multimodal head): the subclass, which transformers takes for custom code, must rename as its
    base does, or a saved head would not load back."""
    try:
        from transformers.conversion_mapping import (get_checkpoint_conversion_mapping,
                                                     register_checkpoint_conversion_mapping)
    except ImportError:  # a transformers without class-keyed renames
        return
    mapping = get_checkpoint_conversion_mapping(base.__name__)
    model_type = getattr(getattr(base, "config_class", None), "model_type", None)
    if not mapping and model_type:  # keyed by model type (Gemma 3 saves its language model's head under its prefix)
        mapping = get_checkpoint_conversion_mapping(model_type)
    if mapping:
        register_checkpoint_conversion_mapping(sub.__name__, mapping, overwrite=True)
