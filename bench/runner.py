"""The sweep: model -> calibrate -> compress -> evaluate -> store, one result file per cell."""

from __future__ import annotations

import copy
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

import methods
import tasks as task_registry
from core.stats import GroupStats, RankSpec

from . import __version__
from core.io import atomic_write_bytes, cache_dir
from .calibrate import STATS_VERSION, CalibSpec, calibrate, needed_stats
from core.errors import UserError
from .groups import find_input_groups
from core.linalg import NumericError
from .measure import latency, peak_memory, weight_bytes
from .spec import RunSpec
from .store import (DENSE, cell_path, cell_status, claim_cell, environment, release_cell, settings_hash,
                    write_cell)

RHO_CELL_METHOD = "rho-analysis"


def log(msg: str) -> None:
    tqdm.write(msg)


def build_tasks(spec: RunSpec, names: list[str] | None = None) -> dict[str, task_registry.Task]:
    """Model tasks with the run's sizes; --task-option values override them."""
    sized = {
        "mmlu": {"limit": spec.mmlu_limit or None, "shots": spec.mmlu_shots, "seed": spec.seed,
                 "batch_size": spec.batch_size, "source": spec.mmlu_source},
        "lama": {"per_relation": spec.lama_limit or None, "max_candidates": spec.lama_candidates, "seed": spec.seed,
                 "source": spec.lama_source},
        "ppl-token": {"source": spec.text_source, "seq_len": spec.ppl_seq_len, "max_windows": spec.ppl_windows,
                      "batch_size": min(spec.batch_size, 2), "bos": spec.bos},
        "ppl-word": {"source": spec.text_source, "max_docs": spec.ppl_windows},
    }
    out = {}
    for name in names if names is not None else spec.tasks:
        if name in task_registry.ANALYSIS_TASKS:
            continue
        opts = {**sized.get(name, {}), **spec.task_options.get(name, {})}
        out[name] = task_registry.get_task(name).from_options(opts)
    return out


def task_key(task) -> str:
    return settings_hash(task.name, task.settings.__dict__)


def calib_spec(spec: RunSpec) -> CalibSpec:
    return CalibSpec(samples=spec.calib_samples, seq_len=spec.calib_seq_len, seed=spec.seed,
                     pair_tokens=spec.pair_tokens, source=spec.calib_source, bos=spec.bos)


def method_key(name: str, spec: RunSpec) -> dict:
    cls = methods.get_method(name)
    comp = cls.from_options(spec.method_options.get(name))
    return {"settings": comp.settings.__dict__, "budget": spec.budget, "align": spec.rank_align,
            "calibration": calib_spec(spec).as_dict() if cls.stats else None}


# ---------------------------------------------------------------- calibration statistics (cached on disk)

def _stats_file(fingerprint: dict, cspec: CalibSpec, needed: frozenset[str]) -> Path:
    key = settings_hash(fingerprint, cspec.as_dict(), sorted(needed), __version__, STATS_VERSION)
    return cache_dir() / "stats" / f"{key}.safetensors"


def load_or_calibrate(lm, groups, spec: RunSpec, needed: frozenset[str],
                      windows: torch.Tensor | None = None) -> tuple[dict[str, GroupStats], dict]:
    """Statistics from the cache, or calibrated on `windows` (built from the calibration text when not given)."""
    cspec = calib_spec(spec)
    path = _stats_file(lm.fingerprint, cspec, needed)
    info = {"spec": cspec.as_dict(), "stats": sorted(needed), "cache_file": path.name}
    if path.exists():
        try:
            stored, saved_info = read_stats(path)
            log(f"calibration statistics from cache ({path.name})")
            return _stats_from_stored(stored), {**info, **saved_info, "cached": True}
        except Exception as e:  # a corrupt or foreign cache file is recomputed, never trusted
            log(f"recomputing calibration statistics: cache file {path.name} is unreadable ({type(e).__name__})")
            path.unlink(missing_ok=True)
    if windows is None:
        from tasks.data.text_data import calibration_windows, load_text

        windows = calibration_windows(lm.tokenizer, load_text(spec.calib_source, "calib"), cspec.samples,
                                      cspec.seq_len, cspec.seed, cspec.bos)
    t0 = time.perf_counter()
    stats = calibrate(lm.model, groups, windows, needed, cspec, batch_size=max(1, spec.batch_size // 2),
                      progress=spec.progress)
    info.update(n_tokens=int(windows.numel()), seconds=time.perf_counter() - t0, cached=False)
    _check_stats(stats)
    # The cache stores float32 (half the disk); a fresh run uses the same rounded values, so a resumed sweep
    # and an uninterrupted one compute bit-identical results.
    stored = {k: {f: _to32(v) for f, v in vars(s).items() if f != "memo"} for k, s in stats.items()}
    write_stats(path, stored, info)
    return _stats_from_stored(stored), info


# The statistics cache is safetensors (tensors plus a JSON header): loading it can run no code, unlike a pickle,
# which matters when $ACBENCH_CACHE is a folder shared on a cluster.
_SEP = "::"


def write_stats(path: Path, stored: dict, info: dict) -> None:
    from safetensors.torch import save

    tensors, scalars = {}, {}
    for group, fields in stored.items():
        for f, v in fields.items():
            if isinstance(v, torch.Tensor):
                tensors[f"{group}{_SEP}{f}"] = v.contiguous()
            elif isinstance(v, dict):
                for site, t in v.items():
                    tensors[f"{group}{_SEP}{f}{_SEP}{site}"] = t.contiguous()
            elif v is not None:
                scalars[f"{group}{_SEP}{f}"] = v
    meta = {"info": json.dumps(info, default=str), "scalars": json.dumps(scalars), "groups": json.dumps(list(stored))}
    atomic_write_bytes(path, save(tensors, metadata=meta))


def read_stats(path: Path) -> tuple[dict, dict]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        stored: dict = {g: {} for g in json.loads(meta["groups"])}
        for key in f.keys():
            group, field, *site = key.split(_SEP)
            if site:
                stored[group].setdefault(field, {})[site[0]] = f.get_tensor(key)
            else:
                stored[group][field] = f.get_tensor(key)
    for key, v in json.loads(meta["scalars"]).items():
        group, field = key.split(_SEP)
        stored[group][field] = v
    return stored, json.loads(meta["info"])


def _to32(v):
    return v.float() if isinstance(v, torch.Tensor) and v.dtype == torch.float64 else (
        {k: _to32(x) for k, x in v.items()} if isinstance(v, dict) else v)


def _to64(v):
    return v.double() if isinstance(v, torch.Tensor) else (
        {k: _to64(x) for k, x in v.items()} if isinstance(v, dict) else v)


def _stats_from_stored(stored: dict) -> dict[str, GroupStats]:
    """Moments back to float64 for the solvers; the (x, g) token sample stays float32."""
    return {k: GroupStats(**{f: v if f in ("xs", "gs") else _to64(v) for f, v in d.items()})
            for k, d in stored.items()}


def _check_stats(stats: dict[str, GroupStats]) -> None:
    for name, s in stats.items():
        for f in ("C", "F", "abs_mean", "xs", "gs"):
            t = getattr(s, f)
            if t is not None and not torch.isfinite(t).all():
                raise UserError(f"calibration produced non-finite {f} statistics in group {name}: "
                                "run with --dtype float32 and check the model's outputs on the calibration text")


# ---------------------------------------------------------------- compression

def compress(lm_model, method: str, rank: RankSpec, stats: dict[str, GroupStats], spec: RunSpec,
             only_groups: set[str] | None = None, progress: bool = True):
    """A compressed copy of the model and the per-group results (factors are dropped once deployed)."""
    from .apply import apply_compression

    model = copy.deepcopy(lm_model)
    comp = methods.get_method(method).from_options(spec.method_options.get(method))
    summaries = []
    groups = [g for g in find_input_groups(model) if only_groups is None or g.name in only_groups]
    for g in tqdm(groups, desc=f"compress {method}@{rank.ratio:g}", disable=not progress, leave=False):
        try:
            res = comp.compress(g, stats.get(g.name, GroupStats()), rank)
        except NumericError as e:
            raise UserError(str(e)) from None
        apply_compression(model, g, res)
        summaries.append(res.summary())
        del res
    return model.eval(), summaries


def compression_summary(summaries: list[dict], rank: RankSpec, method: str, spec: RunSpec) -> dict:
    dense = sum(s["params_dense"] for s in summaries)
    deployed = sum(s["params_deployed"] for s in summaries)
    fallbacks = [dict(f, group=s["group"]) for s in summaries for f in s["fallbacks"]]
    comp = methods.get_method(method).from_options(spec.method_options.get(method))
    return {
        "rank_ratio": rank.ratio, "budget": rank.budget, "align": rank.align,
        "params_dense": dense, "params_deployed": deployed, "param_ratio": deployed / dense if dense else None,
        "groups_factorised": sum(s["form"] == "factorised" for s in summaries), "groups": summaries,
        "fallbacks": fallbacks, "n_fallbacks": len(fallbacks), "method_settings": comp.settings.__dict__,
        "capabilities": comp.capabilities(),
    }


# ---------------------------------------------------------------- evaluation of one model variant

@dataclass
class Variant:
    method: str
    rank: float | None
    model: torch.nn.Module
    compression: dict | None
    timings: dict


def evaluate_variant(v: Variant, lm, spec: RunSpec, todo: dict, common: dict, device) -> list[dict]:
    """Evaluate the missing task cells of one variant and write each as soon as it is done."""
    eff = {"weight_bytes": weight_bytes(v.model)}
    if spec.measure_latency:
        t0 = time.perf_counter()
        eff["latency"] = latency(v.model)
        v.timings["latency_s"] = time.perf_counter() - t0
    written = []
    for name, (task, path) in todo.items():
        t0 = time.perf_counter()
        with peak_memory(device) as mem:
            result = task.evaluate(v.model, lm.tokenizer, progress=spec.progress)
        record = {
            **common,
            "cell": {"model": lm.name, "method": v.method, "rank": v.rank, "budget": spec.budget, "task": name},
            "metrics": result.metrics, "stderr": result.stderr, "higher_is_better": task.higher_is_better,
            "primary_metric": task.primary_metric, "details": result.details, "task_config": result.config,
            "compression": v.compression, "memory": {"weight_bytes": eff["weight_bytes"], "peak": dict(mem)},
            "latency": eff.get("latency"), "timings": {**v.timings, "evaluate_s": time.perf_counter() - t0},
            "records": result.records,
        }
        write_cell(path, record)
        written.append(record)
    return written


def _summary_line(records: list[dict]) -> str:
    parts = []
    for r in records:
        m = r.get("primary_metric")
        v = r["metrics"].get(m) if m else None
        parts.append(f"{r['cell']['task']} {m}=" + (f"{v:.4g}" if isinstance(v, (int, float)) and math.isfinite(v)
                                                     else "undefined"))
    c = records[0]["compression"] if records else None
    if c:
        parts.append(f"params {c['param_ratio']:.3f}x, {c['n_fallbacks']} fallbacks")
    return ", ".join(parts)


# ---------------------------------------------------------------- the sweep

def run(spec: RunSpec) -> dict:
    from .models import load_model
    from .spec import validate

    validate(spec)
    out_root = Path(spec.output)
    device = torch.device(spec.device)
    torch.manual_seed(spec.seed)
    t_start = time.perf_counter()
    log(f"acbench {__version__}: model {spec.model}, methods {', '.join(spec.methods)}, ranks "
        f"{', '.join(f'{r:g}' for r in spec.ranks)} ({spec.budget} budget), tasks {', '.join(spec.tasks)}")
    log(f"sizes: calibration {spec.calib_samples} x {spec.calib_seq_len} tokens ({spec.calib_source}, seed {spec.seed}, "
        f"{spec.pair_tokens} (x, g) pairs/group); MMLU {spec.mmlu_shots}-shot, {spec.mmlu_limit or 'all'}/subject; "
        f"LAMA {spec.lama_limit or 'all'} probes/relation, <= {spec.lama_candidates} candidates; "
        f"ppl-token {spec.ppl_windows} x {spec.ppl_seq_len} tokens")
    checked: dict = {}

    def preflight(tokenizer):
        """Data sources opened and checked before the weights load: a bad file costs seconds, not a dense run."""
        from tasks.data.text_data import calibration_windows, load_text, resolve_bos

        asked = spec.bos
        spec.bos = resolve_bos(tokenizer, spec.bos)  # one protocol for calibration windows and ppl-token
        log(f"BOS protocol: {spec.bos}" + (" (the tokenizer's default)" if asked == "auto" else ""))
        checked["tasks"] = build_tasks(spec)
        for task in checked["tasks"].values():
            task.check(tokenizer)
        if "rho" in spec.tasks or any(methods.get_method(m).stats for m in spec.methods):
            # kept for calibration: the text is tokenized once
            checked["calib_windows"] = calibration_windows(tokenizer, load_text(spec.calib_source, "calib"),
                                                           spec.calib_samples, spec.calib_seq_len, spec.seed, spec.bos)

    lm = load_model(spec.model, spec.dtype, spec.device, progress=spec.progress, before_weights=preflight)
    model_tasks = checked["tasks"]
    env = environment(spec.device)
    common = {"model_fingerprint": lm.fingerprint, "seed": spec.seed, "env": env, "bos": spec.bos,
              "calibration": None}

    # Which cells are missing?
    ranks = [RankSpec(r, spec.budget, spec.rank_align) for r in spec.ranks]

    def needs_computing(p: Path) -> bool:
        if spec.overwrite:
            return True
        status = cell_status(p)
        if status not in (None, "missing"):
            log(f"recomputing {p}: {status}")
        return status is not None

    def paths_for(method, rank, key_extra):
        todo = {}
        for name, task in model_tasks.items():
            key = settings_hash(task_key(task), key_extra, lm.fingerprint)
            p = cell_path(out_root, lm.name, method, rank, spec.budget, name, key)
            if needs_computing(p):
                todo[name] = (task, p)
        return todo

    dense_todo = paths_for(DENSE, None, None)
    plan = {}
    for m in spec.methods:
        for r in ranks:
            todo = paths_for(m, r.ratio, method_key(m, spec))
            if todo:
                plan[(m, r)] = todo
    rho_todo = {}
    if "rho" in spec.tasks:
        for r in ranks:
            key = settings_hash("rho", _rho_settings(spec), calib_spec(spec).as_dict(), lm.fingerprint, spec.budget)
            p = cell_path(out_root, lm.name, RHO_CELL_METHOD, r.ratio, spec.budget, "rho", key)
            if needs_computing(p):
                rho_todo[r] = (None, p)
    n_cells = len(dense_todo) + sum(len(t) for t in plan.values()) + len(rho_todo)
    log(f"{n_cells} cell(s) to compute under {out_root}/ (existing cells are kept; --overwrite recomputes)")
    written, elsewhere = 0, []
    claimed: set[Path] = set()

    def unclaim(p: Path) -> None:
        release_cell(p)
        claimed.discard(p)

    def claim(todo: dict) -> dict:
        """The cells of `todo` this process computes: those no live process has claimed and none has finished
        since the plan was made (parallel runs on one results directory split the work)."""
        mine = {}
        for name, item in todo.items():
            p = item[1]
            if not claim_cell(p):
                elsewhere.append(p)
                continue
            claimed.add(p)
            if not spec.overwrite and cell_status(p) is None:  # finished by another run meanwhile
                unclaim(p)
                continue
            mine[name] = item
        return mine

    def release(todo: dict) -> None:
        for _, p in todo.values():
            unclaim(p)

    try:
        dense_todo = claim(dense_todo)
        if dense_todo:
            recs = evaluate_variant(Variant(DENSE, None, lm.model, None, {}), lm, spec, dense_todo, common, device)
            written += len(recs)
            release(dense_todo)
            log(f"[dense] {_summary_line(recs)}")

        needs = needed_stats([methods.get_method(m) for m, _ in plan]) | (
            frozenset({"C", "F", "pairs"}) if rho_todo else frozenset())
        stats, calib_info = ({}, None)
        if needs:
            groups = find_input_groups(lm.model)
            stats, calib_info = load_or_calibrate(lm, groups, spec, needs, checked.get("calib_windows"))
        for (m, r), todo in tqdm(list(plan.items()), desc="cells", disable=not spec.progress):
            todo = claim(todo)
            if not todo:
                continue
            t0 = time.perf_counter()
            model, summaries = compress(lm.model, m, r, stats, spec, progress=spec.progress)
            timings = {"compress_s": time.perf_counter() - t0}
            if calib_info and methods.get_method(m).stats:
                timings["calibrate_s"] = calib_info.get("seconds")
            cell_common = {**common, "calibration": calib_info if methods.get_method(m).stats else None}
            recs = evaluate_variant(Variant(m, r.ratio, model, compression_summary(summaries, r, m, spec), timings),
                                    lm, spec, todo, cell_common, device)
            written += len(recs)
            release(todo)
            log(f"[{m} @ {r.ratio:g}] {_summary_line(recs)}")
            del model
        rho_todo = claim(rho_todo)
        if rho_todo:
            from .rho_analysis import rho_task

            for r, (_, path) in rho_todo.items():
                t0 = time.perf_counter()
                result = rho_task(lm, stats, r, spec)
                write_cell(path, {**common, "calibration": calib_info,
                                  "cell": {"model": lm.name, "method": RHO_CELL_METHOD, "rank": r.ratio,
                                           "budget": spec.budget, "task": "rho"},
                                  "timings": {"rho_s": time.perf_counter() - t0}, **result})
                unclaim(path)
                written += 1
                log(f"[rho @ {r.ratio:g}] " + _rho_line(result))
    finally:
        for p in list(claimed):  # an interrupted run leaves no claim that would block its successor
            unclaim(p)
    if elsewhere:
        log(f"{len(elsewhere)} cell(s) left to another run that is computing them now: "
            + ", ".join(str(p.relative_to(out_root)) for p in elsewhere[:5]) + (" ..." if len(elsewhere) > 5 else ""))
    elapsed = time.perf_counter() - t_start
    log(f"done: {written} cell(s) written in {elapsed:.0f} s")
    return {"written": written, "seconds": elapsed, "output": str(out_root), "elsewhere": [str(p) for p in elsewhere]}


def _rho_settings(spec: RunSpec) -> dict:
    return {k: getattr(spec, k) for k in ("rho_units", "rho_lama_limit", "rho_mmlu_limit", "rho_loss_windows", "rho_per_group",
                                          "lama_candidates", "ppl_seq_len", "text_source", "lama_source",
                                          "mmlu_source", "seed", "bos")}


def _rho_line(result: dict) -> str:
    corr = result["details"]["correlations"]
    c = corr.get("rho_vs_loss_rise_pca", {}).get("spearman")
    return f"mean rho={result['metrics']['rho_mean']:.3f}" + (
        f", Spearman(rho, loss rise under pca)={c['r']:.2f} (p={c['p']:.2g})" if c else "")
