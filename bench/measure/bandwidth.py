"""What bounds a batch-1 decode on this machine: the memory bandwidth it reaches (a STREAM-like copy and triad over
arrays far larger than the last-level cache), the bandwidth a dense batch-1 product of a model's largest site
reaches with its weights cold in cache, and the share of a decode step spent outside the linear products (the
floor no compression of the linear layers removes). Each is measured once per process and shape."""

from __future__ import annotations

import contextlib
import os
import time

import torch

ARRAY_MB = 256  # per STREAM array: far past any last-level cache this runs on (32-260 MB on servers)


def array_bytes() -> int:
    """ARRAY_MB, or ACBENCH_BANDWIDTH_MB where set (the tests shrink the probe): a whole number of MB, at least 1,
    whose three arrays fit in half the memory this machine has. Checked when a command starts (`acbench.cli`), so a
    bad value is one line before any work, not a traceback at the first speed measurement."""
    from acbench.core.errors import UserError

    raw = os.environ.get("ACBENCH_BANDWIDTH_MB")
    if raw is None or raw.strip() == "":
        return ARRAY_MB * 2**20
    try:
        mb = int(raw.strip())
    except ValueError:
        mb = None
    if mb is None or mb < 1:
        raise UserError(f"ACBENCH_BANDWIDTH_MB={raw!r} is not a whole number of MB >= 1: set it to e.g. {ARRAY_MB} "
                        "(the size of each memory-bandwidth array), or unset it")
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if 3 * mb * 2**20 > total // 2:
        raise UserError(f"ACBENCH_BANDWIDTH_MB={mb}: three arrays of {mb} MB do not fit in half of this machine's "
                        f"{total / 2**30:.1f} GiB of memory: set it to at most {total // 2 // 3 // 2**20}, or unset it")
    return mb * 2**20


REPEATS = 5  # STREAM reports the best of its repetitions: the machine's reach, not its noise
_STREAM: dict | None = None
_GEMV: dict[tuple, dict] = {}


def _best(fn, repeats: int = REPEATS) -> float:
    fn()  # first touch: pages faulted in, not timed
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def stream_bandwidth(size: int | None = None) -> dict:
    """Copy (b = a: 2 arrays of traffic) and triad (a = b + s c: 3) in GB/s (10^9 bytes), float32 arrays of `size`
    bytes (default array_bytes()), at torch's thread count; the best of REPEATS."""
    global _STREAM
    size = size or array_bytes()
    if _STREAM is not None and _STREAM["array_mb"] == size // 2**20:
        return dict(_STREAM)
    n = size // 4
    a, b, c = torch.ones(n), torch.ones(n), torch.ones(n)
    copy_s = _best(lambda: b.copy_(a))
    triad_s = _best(lambda: torch.add(b, c, alpha=3.0, out=a))
    _STREAM = {"copy_gb_s": 2 * size / copy_s / 1e9, "triad_gb_s": 3 * size / triad_s / 1e9,
               "array_mb": size // 2**20, "threads": torch.get_num_threads()}
    return dict(_STREAM)


def gemv_bandwidth(d_out: int, d_in: int, dtype: torch.dtype = torch.float32, cold_bytes: int | None = None) -> dict:
    """The weight bytes a dense batch-1 product y = W x streams per second (GB/s), W of (d_out, d_in): copies of W
    enough to exceed `cold_bytes` are cycled, so each product reads its weights from memory, not from cache."""
    cold_bytes = cold_bytes or array_bytes()
    key = (d_out, d_in, str(dtype), cold_bytes)
    if key not in _GEMV:
        per = d_out * d_in * torch.tensor([], dtype=dtype).element_size()
        copies = max(2, -(-cold_bytes // per))
        ws = [torch.randn(d_out, d_in).to(dtype) for _ in range(copies)]
        x = torch.randn(1, d_in).to(dtype)

        def sweep():
            for w in ws:
                torch.nn.functional.linear(x, w)

        seconds = _best(sweep, 3) / copies
        _GEMV[key] = {"shape": [d_out, d_in], "dtype": str(dtype).replace("torch.", ""),
                      "gb_s": per / seconds / 1e9, "cold_mb": cold_bytes // 2**20, "threads": torch.get_num_threads()}
    return dict(_GEMV[key])


def largest_linear(model: torch.nn.Module) -> tuple[int, int, torch.dtype] | None:
    """(out, in, dtype) of the body's largest dense linear layer by weight count (None: no dense linear)."""
    body = model.get_decoder() if hasattr(model, "get_decoder") else model
    best = None
    for m in body.modules():
        if isinstance(m, torch.nn.Linear) and (best is None or m.weight.numel() > best[0] * best[1]):
            best = (m.out_features, m.in_features, m.weight.dtype)
    return best


@contextlib.contextmanager
def linear_products_skipped(module: torch.nn.Module):
    """Every linear layer of `module` returns zeros of its output's shape instead of computing its product: what a
    decode step costs without its linear products (norms, attention over the cache, rotary, residuals, the modules'
    Python). Restored on exit."""
    patched = []
    for m in module.modules():
        if isinstance(m, torch.nn.Linear):
            def skip(x, _out=m.out_features):
                return x.new_zeros(*x.shape[:-1], _out)

            patched.append((m, m.__dict__.get("forward")))  # an instance forward (a hook's) is put back as it was
            m.forward = skip
    try:
        yield len(patched)
    finally:
        for m, own in patched:
            if own is None:
                del m.forward  # the class's forward shows through again
            else:
                m.forward = own

