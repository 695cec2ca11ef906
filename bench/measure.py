"""Memory and latency of a deployed model, measured in the process that evaluates it."""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager

import torch


def weight_bytes(model: torch.nn.Module) -> int:
    """Deployed weight bytes, analytic: every unique parameter and buffer once (tied weights count once)."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total


def _proc_status_bytes(field: str) -> int | None:
    """A memory line of /proc/self/status (VmRSS, VmHWM) in bytes; None where there is no procfs."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _reset_rss_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets the peak-RSS high-water mark (Linux)
        return True
    except OSError:
        return False


@contextmanager
def peak_memory(device: torch.device):
    """Peak memory over the block: CUDA peak allocated on GPU, process RSS high-water mark on CPU.

    `working_bytes` is the peak minus what was resident before the block (activations, logits, caches):
    the harness keeps the dense reference model resident too, so the process peak alone would overstate a
    compressed variant. The leaderboard reports weight bytes + working bytes.
    """
    out: dict = {}
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        yield out
        torch.cuda.synchronize(device)
        peak = int(torch.cuda.max_memory_allocated(device))
        out.update(kind="cuda_max_allocated", bytes=peak, working_bytes=peak - before)
    else:
        reset = _reset_rss_hwm()
        before = _proc_status_bytes("VmRSS")
        yield out
        peak = _proc_status_bytes("VmHWM")
        out.update(kind="rss_high_water" if reset else "rss_high_water_since_start", bytes=peak,
                   working_bytes=None if peak is None or before is None else max(0, peak - before))


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def latency(model, prompt_len: int = 32, new_tokens: int = 8, repeats: int = 2, vocab_hi: int | None = None) -> dict:
    """Prefill and greedy-decode time per token (medians over repeats, after one warm-up)."""
    device = next(model.parameters()).device
    vocab_hi = vocab_hi or min(model.config.vocab_size, 1000)
    ids = torch.randint(3, vocab_hi, (1, prompt_len), generator=torch.Generator().manual_seed(0)).to(device)
    prefill, decode = [], []
    for i in range(repeats + 1):
        _sync(device)
        t0 = time.perf_counter()
        model(input_ids=ids, use_cache=False, logits_to_keep=1)
        _sync(device)
        t1 = time.perf_counter()
        # the warm-up round (i = 0, its times dropped) decodes 2 tokens: enough to run the prefill and the cached
        # decode step once each, without paying the full decode (0.1 s per token at Gemma's 262k-word head)
        n = new_tokens if i else min(2, new_tokens)
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                       do_sample=False, pad_token_id=0)
        _sync(device)
        t2 = time.perf_counter()
        if i:  # the first round warms up
            prefill.append((t1 - t0) / prompt_len)
            decode.append(((t2 - t1) - (t1 - t0)) / new_tokens)
    return {"prefill_ms_per_token": 1e3 * statistics.median(prefill),
            "decode_ms_per_token": 1e3 * statistics.median(decode),
            "prompt_len": prompt_len, "new_tokens": new_tokens, "repeats": repeats}
