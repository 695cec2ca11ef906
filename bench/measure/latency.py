"""Memory and latency of a deployed model, measured in the process that evaluates it."""

from __future__ import annotations

import copy
import inspect
import math
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from scipy.stats import t as scipy_t

from acbench.core.compressed_layers import LAYOUT_KEY, SparseInputLinear, decode_kernel
from acbench.core.stats import SparsitySpec

import acbench.deploy.semi_structured as semi_structured
from acbench.measure.bandwidth import gemv_bandwidth, largest_linear, linear_products_skipped, stream_bandwidth

LATENCY_VERSION = 2  # 2: interleaved with dense, body apart from the head, speedups with intervals


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
        with open("/proc/self/status") as status:  # closed at once: it is read once per cell
            for line in status:
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


def with_calibration_peak(device: str, load):
    """`load()`'s Calibration, its record given the peak memory of computing it (`peak`, as a cell's memory.peak)
    where it was computed now; one read from the cache cost no calibration and records none (as its seconds are
    the first run's)."""
    with peak_memory(torch.device(device)) as mem:
        calibration = load()
    if calibration.record.get("cached") is False:
        calibration.record["peak"] = dict(mem)
    return calibration


def threshold_sparsifiers(model) -> list:
    """The modules whose kept fraction varies per token: threshold sparsifiers (TEAL) and thresholded activations
    (CATS)."""
    from acbench.core.compressed_layers import InputSparsifier, ThresholdedActivation

    return [m for m in model.modules() if isinstance(m, ThresholdedActivation) or
            (isinstance(m, InputSparsifier) and m.threshold is not None)]


def measured_density(model) -> float | None:
    """The fraction of the threshold sparsifiers' input numbers kept since their counts were reset (their density
    varies per token, unlike a top-k's); None without thresholds or inputs."""
    sps = threshold_sparsifiers(model)
    seen = sum(int(s.seen) for s in sps)
    return sum(float(s.kept) for s in sps) / seen if seen else None


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class LatencySpec:
    """How latency is measured. Decode: batch 1 with the KV cache of a `prompt_len`-token prompt, `new_tokens`
    steps per round, fed the text's next tokens (teacher-forced: a step's cost does not depend on which token
    comes next, so the 262k-word head need not run to choose it; real text, because a threshold's density, and so
    its speed, depends on the activations). Prefill: `prefill_len`-token prompts at the evaluation batch, no cache.
    Dense and the variant alternate decode step by step and prefill once each per round (the order flipped every
    step and every round, so a drift of the machine loads both alike); rounds go on until the body decode speedup's
    95 % interval is within +-`halfwidth` (at least `min_rounds`), or until the cap: `seconds`, or `cap_rounds`
    times the median round where that is longer (a model whose round takes 2 s still gets its rounds)."""

    prompt_len: int = 128
    new_tokens: int = 16
    prefill_len: int = 32
    batch: int = 4
    halfwidth: float = 0.03
    min_rounds: int = 8
    seconds: float = 8.0
    cap_rounds: int = 16

    def conditions(self) -> dict:
        return {"prompt_len": self.prompt_len, "new_tokens": self.new_tokens, "prefill_len": self.prefill_len,
                "prefill_batch": self.batch, "target_halfwidth": self.halfwidth, "min_rounds": self.min_rounds,
                "cap_seconds": self.seconds, "cap_rounds": self.cap_rounds, "threads": torch.get_num_threads(),
                # both eager: torch.compile of the decoder body on CPU ran the gathered variant 2-3x slower than
                # eager (graph breaks in the KV cache's and the sites' Python) while speeding dense (docs/speed.md)
                "compiled": False}

    def cap(self, round_seconds: float) -> float:
        """The seconds a comparison may spend: `seconds`, or `cap_rounds` rounds of `round_seconds` where longer."""
        return max(self.seconds, self.cap_rounds * round_seconds)


class _Probe:
    """One model's decode and prefill timed in parts: the decoder body (the layers, what compression changes)
    apart from the embedding and the head (what it leaves alone)."""

    def __init__(self, model, spec: LatencySpec, text: torch.Tensor | None = None):
        self.model, self.spec = model, spec
        self.device = next(model.parameters()).device
        self.body, self.embed, self.head = model.get_decoder(), model.get_input_embeddings(), model.get_output_embeddings()
        need = spec.prompt_len + spec.new_tokens
        if text is not None and text.shape[-1] >= max(need, spec.prefill_len) and text.shape[0] > spec.batch:
            # the prompt and the decoded tokens from the first window, the prefill batch from the next ones
            self.fed = "text"
            self.prompt = text[:1, :spec.prompt_len]
            self.steps = text[0, spec.prompt_len:need].reshape(-1, 1, 1)
            self.batch = text[1:1 + spec.batch, :spec.prefill_len]
        else:
            self.fed = "random ids"
            gen = torch.Generator().manual_seed(0)
            draw = lambda *shape: torch.randint(3, min(model.config.vocab_size, 1000), shape, generator=gen)
            self.prompt, self.steps, self.batch = draw(1, spec.prompt_len), draw(spec.new_tokens, 1, 1), draw(
                spec.batch, spec.prefill_len)
        self.prompt, self.steps, self.batch = (t.to(self.device) for t in (self.prompt, self.steps, self.batch))
        self.cache = None
        # transformers 5 names the KV cache argument `cache`, 4.x `past_key_values`
        self.cache_arg = "cache" if "cache" in inspect.signature(self.body.forward).parameters else "past_key_values"

    def prefill_cache(self):
        """The prompt's KV cache, made once (by whichever model runs first) and copied for every round: its values
        do not change the cost of a step."""
        out = self.body(inputs_embeds=self.embed(self.prompt), use_cache=True)
        self.cache = getattr(out, self.cache_arg)

    def _timed(self, fn) -> tuple[float, object]:
        """(seconds, value) of fn(), the device synchronised on both sides."""
        _sync(self.device)
        t0 = time.perf_counter()
        value = fn()
        _sync(self.device)
        return time.perf_counter() - t0, value

    @torch.no_grad()
    def decode(self, use_dense=None) -> dict:
        """`new_tokens` cached decode steps of the body, then the embedding and the head once. With `use_dense`,
        dense and the variant alternate step by step (each with its own copy of the cache, the order flipped every
        step), so both see the same moments of the machine: {True: dense's times, False: the variant's}."""
        if self.cache is None:
            self.prefill_cache()
        states = (None,) if use_dense is None else (True, False)
        caches = {st: copy.deepcopy(self.cache) for st in states}
        body = dict.fromkeys(states, 0.0)
        h = None
        for i, ids in enumerate(self.steps):
            e = self.embed(ids)
            for st in (states if i % 2 == 0 else states[::-1]):
                if st is not None:
                    use_dense(st)
                seconds, out = self._timed(
                    lambda: self.body(inputs_embeds=e, use_cache=True, **{self.cache_arg: caches[st]}))
                body[st] += seconds
                h = out.last_hidden_state
        out = {}
        for st in (states if len(self.steps) % 2 == 0 else states[::-1]):
            if st is not None:
                use_dense(st)
            # the embedding and the head: the same modules in dense and every variant, timed once per round
            outside, _ = self._timed(lambda: (self.embed(self.steps[0]), self.head(h[:, -1:])))
            n = len(self.steps)
            out[st] = {"decode_body_ms_per_token": 1e3 * body[st] / n, "decode_outside_ms_per_token": 1e3 * outside,
                       "decode_ms_per_token": 1e3 * (body[st] / n + outside)}
        return out[None] if use_dense is None else out

    @torch.no_grad()
    def prefill(self) -> dict:
        seconds, _ = self._timed(lambda: self.body(input_ids=self.batch, use_cache=False))
        return {"prefill_body_tokens_per_s": self.batch.numel() / seconds}

    def round(self) -> dict:
        return {**self.decode(), **self.prefill()}

    def paired_round(self, use_dense, dense_first: bool) -> tuple[dict, dict]:
        """(dense's, the variant's) times of one round: decode interleaved step by step, then each prefills once."""
        dec = self.decode(use_dense)
        pre = {}
        for st in (True, False) if dense_first else (False, True):
            use_dense(st)
            pre[st] = self.prefill()
        return {**dec[True], **pre[True]}, {**dec[False], **pre[False]}


# speedup name -> (the per-round time it divides, True where the value is a rate: speedup = variant / dense)
SPEEDUPS = {"decode_body": ("decode_body_ms_per_token", False), "decode": ("decode_ms_per_token", False),
            "prefill_body": ("prefill_body_tokens_per_s", True)}


def ratio_interval(ratios: list[float]) -> dict:
    """The geometric mean of per-round ratios and its 95 % t interval (on the logs); n < 2: no interval."""
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return {"ratio": math.exp(mean), "ci95": None, "n": len(logs)}
    half = float(scipy_t.ppf(0.975, len(logs) - 1)) * statistics.stdev(logs) / math.sqrt(len(logs))
    return {"ratio": math.exp(mean), "ci95": [math.exp(mean - half), math.exp(mean + half)], "n": len(logs)}


def _medians(rounds: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}


def masked_weight_kernel(model) -> str | None:
    """What the variant's masked-weight sites (wanda, magnitude-prune) run, as semi_structured.describe says it
    (the distinct descriptions, joined); None where it has none."""
    layout = getattr(model.config, LAYOUT_KEY, None) or {}
    seen = []
    for site, spec in layout.items():
        if spec.get("form") == "masked-weights":
            pattern = SparsitySpec.parse(spec["pattern"]) if ":" in str(spec["pattern"]) else SparsitySpec()
            text = semi_structured.describe(model.get_submodule(site).weight, pattern.n, pattern.m)
            if text not in seen:
                seen.append(text)
    return "; ".join(seen) or None


FLOOR_ROUNDS = 3  # decode rounds with and without the linear products, alternating, for the overhead floor


def what_bounds(model, probe: _Probe) -> dict:
    """With the dense modules in place: the body's decode time with and without its linear products (medians of
    FLOOR_ROUNDS alternating rounds; the difference is what compressing the linear layers can shrink), and the
    machine's memory bandwidth and the dense batch-1 product bandwidth of the largest site."""
    with_products, without = [], []
    for _ in range(FLOOR_ROUNDS):
        with_products.append(probe.decode()["decode_body_ms_per_token"])
        with linear_products_skipped(probe.body):
            without.append(probe.decode()["decode_body_ms_per_token"])
    dense_ms, floor_ms = statistics.median(with_products), statistics.median(without)
    site = largest_linear(model)
    machine = {"memory_bandwidth": stream_bandwidth()}
    if site is not None and probe.device.type == "cpu":
        machine["dense_product"] = gemv_bandwidth(*site)
    return {"body_overhead": {"dense_body_ms": dense_ms, "floor_ms": floor_ms,
                              "linear_share": max(0.0, 1 - floor_ms / dense_ms) if dense_ms > 0 else None,
                              "rounds": FLOOR_ROUNDS},
            "machine": machine}


@torch.no_grad()
def compare_latency(model, use_dense, spec: LatencySpec = LatencySpec(), text: torch.Tensor | None = None) -> dict:
    """Dense against the variant in one process, interleaved: `use_dense(True)` puts the dense modules in place,
    `use_dense(False)` the variant's (by reference, nothing rebuilt). Per round the two decode alternately step
    by step and each prefills once; the speedups are per-round ratios (dense time / variant time), summarised with
    their intervals. `text`: token windows (batch + 1 of them, prompt_len + new_tokens long) the model decodes and
    prefills; without them, random ids (recorded in the conditions)."""
    probe = _Probe(model, spec, text)
    t_start = time.perf_counter()
    probe.paired_round(use_dense, True)  # warm-up: both models once, times dropped (and not in the cap)
    rounds: list[tuple[dict, dict]] = []
    durations: list[float] = []
    converged = False
    try:
        while True:
            t_round = time.perf_counter()
            rounds.append(probe.paired_round(use_dense, dense_first=len(rounds) % 2 == 0))
            durations.append(time.perf_counter() - t_round)
            cap = spec.cap(statistics.median(durations))  # a first call's slowness moves no cap
            speed = ratio_interval([d["decode_body_ms_per_token"] / v["decode_body_ms_per_token"] for d, v in rounds])
            if speed["ci95"] and len(rounds) >= spec.min_rounds:
                converged = speed["ci95"][1] / speed["ratio"] - 1 <= spec.halfwidth and \
                    1 - speed["ci95"][0] / speed["ratio"] <= spec.halfwidth
                if converged or time.perf_counter() - t_start > cap:
                    break
        use_dense(True)
        bounds = what_bounds(model, probe)  # dense's overhead floor and the machine's bandwidths
    finally:
        use_dense(False)
    # which kernel the variant's gathered decode products ran (none: no sparse-activation site), and its masked
    # weights' products
    kernel = decode_kernel(probe.device.type) if any(isinstance(m, SparseInputLinear) for m in model.modules()) \
        else None
    # the embedding and the head are the same modules in both: their time is pooled over both models' rounds, so
    # the end-to-end ratio carries the body's difference and not the head's single-step noise
    outside = statistics.median(r["decode_outside_ms_per_token"] for pair in rounds for r in pair)
    for d, v in rounds:
        for r in (d, v):
            r["decode_ms_per_token"] = r["decode_body_ms_per_token"] + outside
    speedups = {}
    for name, (key, rate) in SPEEDUPS.items():
        speedups[name] = ratio_interval([(v[key] / d[key]) if rate else (d[key] / v[key]) for d, v in rounds])
    variant = _medians([v for _, v in rounds])
    return {"protocol": "interleaved", "version": LATENCY_VERSION, "rounds": len(rounds), "converged": converged,
            "seconds": time.perf_counter() - t_start,
            "conditions": {**spec.conditions(), "fed_tokens": probe.fed, "decode_kernel": kernel,
                           "weight_kernel": masked_weight_kernel(model), "cap_seconds_used": cap,
                           **bounds["machine"]},
            "body_overhead": bounds["body_overhead"],
            "dense": _medians([d for d, _ in rounds]), "variant": variant, "speedup": speedups,
            # the older cells' two numbers, the variant's own
            "prefill_ms_per_token": 1e3 / variant["prefill_body_tokens_per_s"],
            "decode_ms_per_token": variant["decode_ms_per_token"]}


@torch.no_grad()
def latency(model, spec: LatencySpec = LatencySpec(), text: torch.Tensor | None = None) -> dict:
    """The model alone (the dense row's own numbers): medians over `spec.min_rounds` rounds after a warm-up."""
    probe = _Probe(model, spec, text)
    t_start = time.perf_counter()
    probe.round()
    got = [probe.round() for _ in range(spec.min_rounds)]
    med = _medians(got)
    bounds = what_bounds(model, probe)
    return {"protocol": "alone", "version": LATENCY_VERSION, "rounds": len(got),
            "seconds": time.perf_counter() - t_start,
            "conditions": {**spec.conditions(), "fed_tokens": probe.fed, **bounds["machine"]},
            "body_overhead": bounds["body_overhead"],
            "variant": med,
            "prefill_ms_per_token": 1e3 / med["prefill_body_tokens_per_s"],
            "decode_ms_per_token": med["decode_ms_per_token"]}
