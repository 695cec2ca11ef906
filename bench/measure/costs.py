"""What a run will cost, from the model's config alone (weights never load: a meta-device model);
`bench plan` prints it.

Per input-group kind and in total: shapes, k and deployed form per method, bytes of every statistic the chosen
methods need, calibration passes under a statistics-memory budget, the statistics cache on disk, weight bytes,
and estimated peak memory for calibration and for evaluation.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from acbench import methods
from acbench.methods.base import factorised_params
from acbench.core.errors import UserError
from acbench.core.stats import GRADIENT_STATS, SEQUENTIAL, RankSpec, SparsitySpec, check_pattern_widths, solve_torch_dtype

from acbench.calibration.memory import calibration_chunks, stat_bytes
from acbench.model.groups import InputGroup, find_input_groups, meta_model

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
def deployed(comp, group: InputGroup, rank: RankSpec) -> tuple[list[int], str, int]:
    """(k per site, form, deployed parameters) exactly as `Compressor.compress` decides them."""
    k = comp.rank_for(group, rank)
    ks = [k[n] for n in group.site_names] if isinstance(k, dict) else [k] * len(group.sites)
    factorised = factorised_params(group.d_in, group.d_outs, ks, shared=not comp.site_wise)
    dense = group.d_in * sum(group.d_outs)
    return ks, ("factorised" if factorised < dense else "merged"), min(factorised, dense)


def model_positions(config) -> int | None:
    """The positions a model's config declares (a multimodal config's text part's), or None."""
    limit = getattr(config, "max_position_embeddings", None) or getattr(
        getattr(config, "text_config", None), "max_position_embeddings", None)
    return limit if isinstance(limit, int) and not isinstance(limit, bool) else None


def load_model_config(model: str):
    """The model's transformers config from a config.json (file or folder), a .gguf header, an alias, or a hub id."""
    from transformers import AutoConfig

    from huggingface_hub.errors import StrictDataclassError

    from acbench.model.sources import ALIASES, _alias_gguf, check_model_config

    path = Path(model).expanduser()
    try:
        if model in ALIASES:
            converted = Path(_cache_models()) / model
            if (converted / "config.json").exists():
                return AutoConfig.from_pretrained(converted)
            gguf = _alias_gguf(model)
            return AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        if path.suffix == ".gguf":
            if not path.is_file():
                raise UserError(f"model file {path} does not exist: pass a .gguf, a config.json or a checkpoint folder")
            return AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
        if path.name.endswith(".json") or path.is_dir():
            cfg_file = path if path.name.endswith(".json") else path / "config.json"
            if not cfg_file.is_file():
                raise UserError(f"{cfg_file} does not exist: pass a checkpoint folder or its config.json")
            data = json.loads(cfg_file.read_text(encoding="utf-8"))
            if not isinstance(data, dict) or "model_type" not in data:
                raise UserError(f"{cfg_file} has no model_type: pass a transformers config.json")
            check_model_config(data, str(cfg_file))
            return AutoConfig.for_model(**data)
        return AutoConfig.from_pretrained(model)
    except UserError:
        raise
    except (OSError, ValueError, KeyError, TypeError, StrictDataclassError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise UserError(f"no config for model '{model}' ({first}): pass a local config.json, checkpoint folder or "
                        ".gguf") from None


def _cache_models() -> Path:
    from acbench.core.io import cache_dir

    return cache_dir() / "models"


@dataclass
class CostEstimate:
    model: str
    config: dict
    n_blocks: int
    params: int
    weight_bytes: int
    kinds: list[dict] = field(default_factory=list)  # per group kind
    methods: dict = field(default_factory=dict)  # method -> rank -> {params, param_ratio, per kind k/form}
    sparse: dict = field(default_factory=dict)  # sparsity method -> pattern -> {param_ratio, compute_ratio, ...}
    stats_total: dict[str, int] = field(default_factory=dict)  # statistic -> bytes in memory (float64)
    stats_per_block: int = 0
    cache_bytes: int = 0
    passes: int = 1
    pass_bytes: int = 0  # statistics of the largest pass
    calibration_peak: int = 0
    evaluation_peak: int = 0
    activation_bytes: int = 0
    # what the time estimate reads (acbench.measure.costs.estimate_times), so the config is read and the groups found once
    groups: list = field(default_factory=list, repr=False)
    needs: frozenset = frozenset()
    method_names: list[str] = field(default_factory=list)
    ranks: list[RankSpec] = field(default_factory=list)
    calib_tokens: int = 0
    pair_tokens: int = 0
    stats_budget: int | None = None  # --stats-memory (None: every group's statistics held at once)


def _sparse_costs(comp, groups, sparsity: list[SparsitySpec], dense_linear: int) -> dict:
    """{pattern label: ratios} of one sparsity method over the model's groups, each group priced by the method
    (`group_cost`: its own pattern per kind, a rotation, a low-rank branch, a mask per matrix)."""
    out = {}
    for p in sparsity:
        check_pattern_widths([p], groups)  # the run's own refusal, from the config alone
        if comp.pattern_problem(p):
            continue  # a pattern the method keeps none of (teal at 2:4): no cell either
        costs = [(x, comp.group_cost(x, p)) for x in groups]
        out[p.label] = {
            "compute_ratio": sum(c[0] for _, c in costs) / dense_linear,
            "param_ratio": sum(c[1] for _, c in costs) / dense_linear,
            # per token, the masks of one block's group inputs (a weight mask is static: none per token)
            "index_bits_per_token": None if comp.masks_weights else
            sum(c[2] for x, c in costs if x.block == groups[0].block)}
    return out


def estimate_costs(model: str, method_names: list[str], ranks: list[float], budget: str = "rank", align: int = 1,
                   dtype: str = "float32", stats_memory: int | None = None, calib_samples: int = 12,
                   calib_seq_len: int = 256, batch_size: int = 2, pair_tokens: int = 512,
                   eval_seq_len: int = 256, sparsity: list[SparsitySpec] | None = None,
                   shared: set[str] | None = None) -> CostEstimate:
    from acbench.model.sources import check_model_config

    config = load_model_config(model)
    check_model_config(config, f"model {model}")
    meta = meta_model(config)
    groups = find_input_groups(meta)
    comps = {m: methods.build(m) for m in method_names}
    # the shared calibration's statistics: those of the methods that read it (`shared`; default all of them)
    needs = frozenset().union(*(c.required_stats() for m, c in comps.items() if shared is None or m in shared))
    width = DTYPE_BYTES[dtype]
    params = sum(p.numel() for p in meta.parameters())
    n_blocks = len({g.block for g in groups})
    text = getattr(config, "get_text_config", lambda: config)()
    hidden, inter, vocab = text.hidden_size, getattr(text, "intermediate_size", 4 * text.hidden_size), text.vocab_size
    est = CostEstimate(model=model, n_blocks=n_blocks, params=params, weight_bytes=params * width,
                config={"model_type": config.model_type, "hidden_size": hidden, "intermediate_size": inter,
                        "num_hidden_layers": n_blocks, "vocab_size": vocab},
                groups=groups, needs=needs, method_names=list(method_names),
                ranks=[RankSpec(r, budget, align) for r in ranks], calib_tokens=calib_samples * calib_seq_len,
                pair_tokens=pair_tokens, stats_budget=stats_memory)
    for kind in dict.fromkeys(g.kind for g in groups):
        g = next(x for x in groups if x.kind == kind)
        count = sum(x.kind == kind for x in groups)
        per = stat_bytes(g, needs, pair_tokens)
        est.kinds.append({"kind": kind, "count": count, "d_in": g.d_in, "d_outs": g.d_outs,
                           "stats": {k: v * count for k, v in per.items()}})
        for k, v in per.items():
            est.stats_total[k] = est.stats_total.get(k, 0) + v * count
    block_groups = [x for x in groups if x.block == groups[0].block]
    est.stats_per_block = sum(sum(stat_bytes(x, needs, pair_tokens).values()) for x in block_groups)
    est.cache_bytes = sum(sum(stat_bytes(x, needs, pair_tokens, width=4).values()) for x in groups)
    dense_linear = sum(x.d_in * sum(x.d_outs) for x in groups)
    for name, comp in comps.items():
        if comp.family != methods.LOW_RANK_FAMILY:
            est.sparse[name] = _sparse_costs(comp, groups, sparsity or [], dense_linear)
            continue
        est.methods[name] = {}
        for r in ranks:
            rank = RankSpec(r, budget, align)
            per_kind, total = {}, 0
            for x in groups:
                ks, form, p = deployed(comp, x, rank)
                per_kind.setdefault(x.kind, {"k": ks, "form": form})
                total += p
            est.methods[name][r] = {"per_kind": per_kind, "params_deployed": total,
                                     "param_ratio": total / dense_linear}
    # Memory: statistics of one pass (the runner's own split of the groups into passes), plus the calibration
    # batch's activations kept for the backward pass (about 6 hidden + 4 intermediate numbers per token and block
    # in float32) and its logits, which take their own gradient (one batch x vocabulary tensor, with or without).
    chunks = calibration_chunks(groups, needs, pair_tokens, stats_memory or sum(est.stats_total.values())) \
        if needs else []
    est.passes = len(chunks)
    pass_stats = max((sum(sum(stat_bytes(g, needs, pair_tokens).values()) for g in c) for c in chunks), default=0)
    est.pass_bytes = pass_stats
    tokens = batch_size * calib_seq_len
    grads = bool(needs & GRADIENT_STATS)
    est.activation_bytes = tokens * ((6 * hidden + 4 * inter) * n_blocks * 4 if grads else 0) + \
        tokens * vocab * 4
    # + the largest group's worth again: its float32 per-batch products and the float32 copy written to the cache
    largest = max((sum(stat_bytes(g, needs, pair_tokens).values()) for g in groups), default=0)
    est.calibration_peak = est.weight_bytes + pass_stats + largest + est.activation_bytes if needs else 0
    largest_ratio = max((v["param_ratio"] for per in est.methods.values() for v in per.values()), default=0)
    # in place: the dense weights stay (by reference) and the deployed factors come on top, one variant at a time
    est.evaluation_peak = est.weight_bytes + int(largest_ratio * dense_linear * width) + \
        batch_size * eval_seq_len * vocab * 4
    return est


def estimate_run_costs(run) -> CostEstimate:
    """The costs of a resolved run (`acbench.runner.config.Run`, as `resolve_run` returns it): its model, methods,
    budgets, precision, statistics memory and calibration sizes, at the batch its calibration passes use (half of
    --batch-size)."""
    c = run.config
    return estimate_costs(c.model, list(run.methods), [r.ratio for r in run.ranks], c.budget, c.rank_align, c.dtype,
                          run.stats_memory, c.calib_samples, c.calib_seq_len, max(1, c.batch_size // 2),
                          c.pair_tokens, sparsity=list(run.patterns),
                          shared={m for m in run.methods if run.calibration_of(m).spec == run.calibration})


def own_calibration_costs(run, est: CostEstimate, calib_speed) -> list[dict]:
    """What each method with a calibration of its own costs beside the shared one (`bench plan`): a one-pass one
    (its authors' sizes) once, cached; a sequential one once per budget (its statistics depend on the blocks
    compressed before), each a capture forward of its first two batches (the later ones stop at block 0), then
    every block twice (statistics, then its compressed output), with the windows' hidden states held once; a pass
    without gradients stops before the LM head. {method, mode, tokens, runs, seconds, peak}"""
    groups = est.groups
    linear = sum(g.d_in * sum(g.d_outs) for g in groups)
    head = est.config["vocab_size"] * est.config["hidden_size"]
    width = est.weight_bytes // max(est.params, 1)
    out = []
    for m, spec in run.own_calibrations().items():
        comp = run.compressor(m)
        needs = comp.required_stats()
        tokens = spec.samples * spec.seq_len
        products = sum(2 * g.d_in ** 2 for g in groups) if "C" in needs else 0
        stats = [sum(stat_bytes(g, needs, spec.pair_tokens).values()) for g in groups]
        batch = max(1, run.config.batch_size // 2) * spec.seq_len
        if spec.mode == SEQUENTIAL:
            runs = len(run.patterns) if comp.family != methods.LOW_RANK_FAMILY else len(run.ranks)
            per_token = 2 * 2 * linear + products + 2 * linear * min(tokens, 2 * batch) / tokens
            block = max(sum(s for g, s in zip(groups, stats) if g.block == b) for b in {g.block for g in groups})
            peak = est.weight_bytes + tokens * est.config["hidden_size"] * width + block  # the capture stops at the head
        else:
            runs = 1
            per_token = 2 * (linear + (head if needs & GRADIENT_STATS else 0)) + products
            peak = est.weight_bytes + min(sum(stats), run.stats_memory or sum(stats)) + max(stats, default=0) + \
                batch * est.config["vocab_size"] * 4
        out.append({"method": m, "mode": spec.mode, "tokens": tokens, "windows": f"{spec.samples} x {spec.seq_len}",
                    "runs": runs, "seconds": runs * tokens * per_token / calib_speed.matmul32, "peak": peak})
    return out


# ------------------------------------------------------------------------------------- time, from a micro-benchmark

@dataclass(frozen=True)
class DeviceSpeed:
    """What a few small measured operations say about a device: the plan scales them by the known costs."""

    device: str
    matmul32: float  # float32 matmul, FLOP/s (calibration and evaluation run in the model's dtype)
    solve_matmul: float  # matmul in the solve precision (float64 unless --solve-dtype float32), FLOP/s
    eigh_n: int
    eigh_s: float  # seconds of an eigh at eigh_n, in the solve precision
    svd_shape: tuple[int, int]
    svd_s: float  # seconds of a thin SVD at svd_shape, in the solve precision
    bandwidth: float  # bytes/s of a float64 elementwise pass
    solve_dtype: str = "float64"


@functools.lru_cache(maxsize=None)  # once per device and process (a few seconds each)
def measure_speed(device: str = "cpu", n: int = 1024, solve_dtype: str = "float64") -> DeviceSpeed:
    """Median of 3 timed runs (after one warm-up) of each operation at about size n, on `device`, the solves' in
    `solve_dtype` (a few seconds on 2 CPU cores; small sizes would run below the throughput the solves reach at
    d = 2048 and beyond)."""
    import statistics
    import time

    dev = torch.device(device)

    def timed(fn):
        fn()
        out = []
        for _ in range(3):
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            fn()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            out.append(time.perf_counter() - t0)
        return statistics.median(out)

    g = torch.Generator().manual_seed(0)
    a32 = torch.randn(n, n, generator=g).to(dev)
    dtype = solve_torch_dtype(solve_dtype)
    square = torch.randn(n, n, generator=g, dtype=torch.float64).to(dev, dtype)
    sym = square @ square.T
    tall = torch.randn(n, n // 2, generator=g, dtype=torch.float64).to(dev, dtype)
    big = torch.randn(2 * n, 2 * n, generator=g, dtype=torch.float64).to(dev)
    return DeviceSpeed(
        device=str(dev), matmul32=2 * n ** 3 / timed(lambda: a32 @ a32),
        solve_matmul=2 * n ** 3 / timed(lambda: square @ square), eigh_n=n, eigh_s=timed(lambda: torch.linalg.eigh(sym)),
        svd_shape=(n, n // 2), svd_s=timed(lambda: torch.linalg.svd(tall, full_matrices=False)),
        bandwidth=3 * big.numel() * 8 / timed(lambda: big + big), solve_dtype=solve_dtype)


def op_seconds(op: tuple, speed: DeviceSpeed) -> float:
    """One declared solve operation's time: eigh and SVD scaled from the measured size by n^3 (m n^2)."""
    kind, sizes = op[1], op[2:]
    if kind == "eigh":
        return speed.eigh_s * (sizes[0] / speed.eigh_n) ** 3
    if kind == "svd":
        m, n = max(sizes), min(sizes)
        m0, n0 = speed.svd_shape
        return speed.svd_s * (m * n * n) / (m0 * n0 * n0)
    if kind == "truncated_svd":  # the top singular pairs of an m x n matrix: the smaller Gram's eigh in float64
        m, n = max(sizes), min(sizes)  # (acbench.methods.svd.truncated_factors, whitened-svd's m >= d), the SVD in float32
        if speed.solve_dtype == "float32":
            return op_seconds(("", "svd", m, n), speed)
        return 2 * m * n * n / speed.solve_matmul + op_seconds(("", "eigh", n), speed)
    if kind == "flops":
        return sizes[0] / speed.solve_matmul
    if kind == "bytes":  # declared for float64 numbers; float32 moves half the bytes
        return sizes[0] * (0.5 if speed.solve_dtype == "float32" else 1.0) / speed.bandwidth
    raise ValueError(f"unknown solve operation {kind!r}")


def _declared_ops(comp, group, rank, pair_tokens):
    return comp.solve_ops(group.d_in, group.d_outs, comp.rank_for(group, rank), pair_tokens)


LONG_SOLVE_S = 60.0  # one group's solve past this on the solve device is said before any work
WIDE_GROUP = 4096  # below this input width no solve reaches LONG_SOLVE_S on a CPU core (eigh: n^3): not measured


def largest_solve(method_names, groups, ranks, pair_tokens: int, speed: DeviceSpeed):
    """(seconds, method, group) of the longest single group solve among the low-rank methods at `ranks`, from
    their declared operations at the measured `speed`; None where no method declares one."""
    worst = None
    for name in method_names:
        comp = methods.build(name)
        if comp.family != methods.LOW_RANK_FAMILY:
            continue
        for rank in ranks:
            for g in groups:
                ops = _declared_ops(comp, g, rank, pair_tokens)
                seconds = sum(op_seconds(op, speed) for op in ops or [])
                if ops and (worst is None or seconds > worst[0]):
                    worst = (seconds, name, g)
    return worst


def long_solve_line(method_names, groups, ranks, pair_tokens: int, device: str, solve_dtype: str,
                    speed: DeviceSpeed | None = None) -> str | None:
    """One warning line where a single group's solve takes longer than LONG_SOLVE_S on this machine's solve device
    (a tiny model of a wide architecture, e.g. an 8,192-wide attention output, solves for minutes on two cores);
    None otherwise. Nothing is measured unless some group is at least WIDE_GROUP wide."""
    if not any(g.d_in >= WIDE_GROUP for g in groups):
        return None
    worst = largest_solve(method_names, groups, ranks, pair_tokens, speed or measure_speed(device,
                                                                                          solve_dtype=solve_dtype))
    if worst is None or worst[0] <= LONG_SOLVE_S:
        return None
    seconds, name, g = worst
    n = sum(g2.d_in >= g.d_in for g2 in groups)
    return (f"one {name} solve of {g.name} (d_in {g.d_in:,}) takes about {seconds / 60:.0f} minutes on {device} "
            f"({solve_dtype}), and {n} group(s) are that wide: leave them out with --groups (e.g. without "
            f"{g.kind}), solve on a GPU (--solve-device cuda), or use --solve-dtype float32")


def memo_fits(est: CostEstimate, comps: dict, solve_dtype: str = "float64") -> bool:
    """Whether the statistics store can hold every group's statistics and the solves they memoise (two d x d
    matrices each: a basis and its inverse, a whitening factor and its inverse; fasc's N x d scores) within
    --stats-memory. Only then does a memoised solve serve the later cells of a sweep; otherwise each cell finds its
    groups re-read from disk and solves them afresh (the TinyLlama-shaped run under 6 GB: pca, whitened-svd and
    fasc-kfac each paid C's eigen-solves)."""
    if est.stats_budget is None:
        return True
    width = solve_torch_dtype(solve_dtype).itemsize
    memo = 0
    for g in est.groups:
        keys = {op[0].split()[0] for comp in comps.values() if comp.family == methods.LOW_RANK_FAMILY
                for rank in est.ranks for op in _declared_ops(comp, g, rank, est.pair_tokens) or [] if op[0]}
        # fasc's direction scores are one N x d matrix; the bases and whitening factors two d x d each
        memo += sum(est.pair_tokens * g.d_in if key == "fisher_scores" else 2 * g.d_in ** 2 for key in keys) * width
    return sum(est.stats_total.values()) + memo <= est.stats_budget


def estimate_times(est: CostEstimate, speed: DeviceSpeed, calib_speed: DeviceSpeed | None = None) -> dict:
    """Seconds of calibration (at `calib_speed`, the model's device; default `speed`) and of each method's solves
    (at `speed`, the solve device) for the run `est` was made for, in run order: methods sharing a memoised solve of
    a group, as fasc and fasc-kfac share the K-FAC basis, pay for it once, the first in the run's order."""
    calib_speed = calib_speed or speed
    groups, needs = est.groups, est.needs
    comps = {m: methods.build(m) for m in est.method_names}
    linear = sum(g.d_in * sum(g.d_outs) for g in groups)
    grads = bool(needs & GRADIENT_STATS)
    # forward (2 per weight) and, with gradients, the backward to the inputs (2 more: the weights are frozen)
    # through the blocks once per calibration pass (each pass hooks only its groups, but runs the whole model), and
    # through the LM head where gradients are read (a pass without them stops before it); the weight gradients of
    # the row Fisher (2 per site weight) and the hooks' float32 products x^T x (and g^T g) once per group. (The TinyLlama-shaped run: 4 per weight measured 155 s a pass, this says 166.)
    head = est.config["vocab_size"] * est.config["hidden_size"]
    per_token = est.passes * (2 + (2 if grads else 0)) * (linear + (head if grads else 0)) + \
        (2 * linear if "row_fisher" in needs else 0) + \
        sum(2 * g.d_in ** 2 * ((needs >= {"C"}) + (needs >= {"F"})) for g in groups)
    out = {"calibration": est.calib_tokens * per_token / calib_speed.matmul32 if needs else 0.0, "methods": {},
           "undeclared": []}
    shared = memo_fits(est, comps, speed.solve_dtype)
    out["memo_shared"] = shared
    done: set = set()
    for name in comps:  # the run's order: the methods as given (`--methods all`: the registry's order)
        comp = comps[name]
        if comp.family != methods.LOW_RANK_FAMILY:  # scores and masks: elementwise, negligible beside evaluation
            out["methods"][name] = 0.0
            continue
        seconds = 0.0
        for rank in est.ranks:
            if not shared:  # the statistics store drops each group (and its memo) before the next cell reaches it
                done = set()
            for g in groups:
                ops = _declared_ops(comp, g, rank, est.pair_tokens)
                if ops is None:
                    out["undeclared"].append(name)
                    ops = []
                for op in ops:
                    key = (g.name, op[0]) if op[0] else None
                    if key in done:
                        continue
                    if key:
                        done.add(key)
                    seconds += op_seconds(op, speed)
        out["methods"][name] = None if name in out["undeclared"] else seconds
    out["total"] = out["calibration"] + sum(v for v in out["methods"].values() if v is not None)
    out["undeclared"] = sorted(set(out["undeclared"]))
    return out
