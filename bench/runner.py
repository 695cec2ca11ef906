"""The sweep: model -> calibrate -> compress -> evaluate -> store, one result file per cell."""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

import methods
import tasks as task_registry
from core.errors import UserError
from core.io import atomic_write_json, cache_dir
from core.record import UNIFORM, CellId, CellRecord, describe_scope, variant_name
from core.stats import SPARSITY_FAMILY, GroupStats, RankSpec, SparsitySpec, check_pattern_widths

from . import __version__
from .allocate import RULES, allocate, check_budget
from .calibrate import STATS_VERSION, CalibSpec, calibrate, needed_stats
from .compress import compressed, compression_summary
from .groups import find_input_groups
from .selection import ALL, Selection
from .measure import latency, peak_memory, weight_bytes
from .spec import RunSpec
from .stats_store import (StatsStore, default_stats_memory, from_stored, group_file, readable, to_stored,
                          write_group)
from .store import (DENSE, cell_path, cell_status, claim_cell, environment, release_cell, settings_hash,
                    write_cell)



def analysis_method(name: str) -> str:
    """The `method` of an analysis cell ("rho-analysis"): analyses sit beside methods in the results tree."""
    return f"{name}-analysis"


def available_cpus() -> int:
    """The CPUs this process may run on (a container's or a scheduler's share, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def log(msg: str) -> None:
    tqdm.write(msg)


def _sized_options(spec: RunSpec) -> dict[str, dict]:
    """The run's sizes for the built-in tasks (a task plugin gets only its --task-option values)."""
    return {
        "mmlu": {"limit": spec.mmlu_limit or None, "shots": spec.mmlu_shots, "seed": spec.seed,
                 "batch_size": spec.batch_size, "source": spec.mmlu_source},
        "lama": {"per_relation": spec.lama_limit or None, "max_candidates": spec.lama_candidates, "seed": spec.seed,
                 "source": spec.lama_source},
        "ppl-token": {"source": spec.text_source, "seq_len": spec.ppl_seq_len, "max_windows": spec.ppl_windows,
                      "batch_size": min(spec.batch_size, 2), "bos": spec.bos},
        "ppl-word": {"source": spec.text_source, "max_docs": spec.ppl_windows},
    }


def build_task(spec: RunSpec, name: str, **overrides) -> task_registry.Task:
    """One task with the run's sizes; --task-option values override them, and `overrides` override both."""
    opts = {**_sized_options(spec).get(name, {}), **spec.task_options.get(name, {}), **overrides}
    return task_registry.get_task(name).from_options(opts)


def build_tasks(spec: RunSpec, analyses: dict | None = None) -> dict[str, task_registry.Task]:
    """The model tasks of the run (names that are analyses are left to them)."""
    return {name: build_task(spec, name) for name in spec.tasks if name not in (analyses or {})}


def task_key(task) -> str:
    return settings_hash(task.name, task.version, task.settings_dict())


def calib_spec(spec: RunSpec) -> CalibSpec:
    return CalibSpec(samples=spec.calib_samples, seq_len=spec.calib_seq_len, seed=spec.seed,
                     pair_tokens=spec.pair_tokens, source=spec.calib_source, bos=spec.bos)


def build_method(variant: str, spec: RunSpec):
    """The Compressor of a method or variant under the run's --method-option values for its base name."""
    return methods.build(variant, spec.method_options.get(methods.base_name(variant)))


def method_key(name: str, spec: RunSpec, allocation: str = UNIFORM, scope: str = ALL,
               budget: RankSpec | SparsitySpec | None = None) -> dict:
    comp = build_method(name, spec)
    key = {"settings": comp.settings_dict(), "version": comp.version,
           "calibration": calib_spec(spec).as_dict() if comp.required_stats() or RULES[allocation] else None}
    if isinstance(budget, SparsitySpec):  # the pattern is the cell's budget; a rank alignment does not apply
        return {**key, "budget": budget.budget}
    key.update(budget=spec.budget, align=spec.rank_align)
    # Only a non-default allocation or selection enters the key: today's cells keep their keys.
    if allocation != UNIFORM:
        key["allocation"] = allocation
    if scope != ALL:
        key["scope"] = scope
    return key


# ---------------------------------------------------------------- calibration statistics (cached on disk)

def stats_folder(fingerprint: dict, cspec: CalibSpec, needed: frozenset[str]) -> Path:
    key = settings_hash(fingerprint, cspec.as_dict(), sorted(needed), __version__, STATS_VERSION)
    return cache_dir() / "stats" / key


def load_or_calibrate(lm, groups, spec: RunSpec, needed: frozenset[str],
                      windows: torch.Tensor | None = None) -> tuple[StatsStore, dict]:
    """Statistics from the cache, calibrating (in as many passes as --stats-memory asks) the groups it lacks."""
    from .plan import calibration_chunks, parse_bytes

    cspec = calib_spec(spec)
    folder = stats_folder(lm.fingerprint, cspec, needed)
    budget = parse_bytes(spec.stats_memory) if spec.stats_memory else default_stats_memory()
    info = {"spec": cspec.as_dict(), "stats": sorted(needed), "cache": folder.name}
    pending = []
    for g in groups:
        if not readable(folder, g.name):
            if group_file(folder, g.name).exists():  # a corrupt or foreign file is recomputed, never trusted
                log(f"recomputing calibration statistics of {g.name}: its cache file is unreadable")
                group_file(folder, g.name).unlink()
            pending.append(g)
    if not pending:
        log(f"calibration statistics from cache ({folder.name})")
        saved = folder / "info.json"
        return StatsStore(folder, [g.name for g in groups], budget), {
            **info, **(json.loads(saved.read_text()) if saved.exists() else {}), "cached": True}
    if windows is None:
        from tasks.data.text_data import calibration_windows, load_text

        windows = calibration_windows(lm.tokenizer, load_text(spec.calib_source, "calib"), cspec.samples,
                                      cspec.seq_len, cspec.seed, cspec.bos)
    chunks = calibration_chunks(pending, needed, spec.pair_tokens, budget)
    t0 = time.perf_counter()
    held: dict[str, GroupStats] = {}
    for i, chunk in enumerate(chunks):
        stats = calibrate(lm.model, chunk, windows, needed, cspec, batch_size=max(1, spec.batch_size // 2),
                          progress=spec.progress, desc=f"calibrate pass {i + 1}/{len(chunks)}")
        _check_stats(stats)
        for name in list(stats):
            write_group(folder, name, stats[name])
            st = stats.pop(name)
            if len(chunks) == 1:  # it all fits: keep the (cache-rounded) values, as a later run would read them
                held[name] = from_stored(to_stored(st))
            del st
    info.update(n_tokens=int(windows.numel()), seconds=time.perf_counter() - t0, cached=False, passes=len(chunks),
                groups_calibrated=len(pending))
    atomic_write_json(folder / "info.json", info)
    return StatsStore(folder, [g.name for g in groups], budget, preloaded=held), info


def _check_stats(stats: dict[str, GroupStats]) -> None:
    for name, s in stats.items():
        for f in ("C", "F", "abs_mean", "mean", "xs", "gs"):
            t = getattr(s, f)
            if t is not None and not torch.isfinite(t).all():
                raise UserError(f"calibration produced non-finite {f} statistics in group {name}: "
                                "run with --dtype float32 and check the model's outputs on the calibration text")


# ---------------------------------------------------------------- evaluation of one model variant

@dataclass
class Variant:
    method: str
    rank: float | None
    model: torch.nn.Module
    compression: dict | None
    timings: dict
    allocation: str = UNIFORM
    scope: str = ALL
    budget: str | None = None  # the cell's budget: rank/params (default: the run's) or a sparsity pattern


def cell_record(plugin, result, **fields) -> CellRecord:
    """A cell from a task's or analysis's result: what the result declares (an lm-eval task's metrics, known only
    once it ran) overrides what the plugin's class declares."""
    return CellRecord(
        metrics=result.metrics, stderr=result.stderr, details=result.details, task_config=result.config,
        records=result.records, higher_is_better={**plugin.higher_is_better, **result.higher_is_better},
        primary_metric=result.primary_metric or plugin.primary_metric or next(iter(result.metrics)), **fields)


def evaluate_variant(v: Variant, lm, spec: RunSpec, todo: dict, common: dict, device) -> list[CellRecord]:
    """Evaluate the missing task cells of one variant and write each as soon as it is done."""
    eff = {"weight_bytes": weight_bytes(v.model)}
    if spec.measure_latency:
        t0 = time.perf_counter()
        eff["latency"] = latency(v.model)
        v.timings["latency_s"] = time.perf_counter() - t0
    method_version = build_method(v.method, spec).version if v.method != DENSE else None
    written = []
    for name, (task, path, key) in todo.items():
        t0 = time.perf_counter()
        with peak_memory(device) as mem:
            result = task.evaluate(v.model, lm.tokenizer, progress=spec.progress)
        record = cell_record(
            task, result, **common,
            cell=CellId(model=lm.name, method=v.method, rank=v.rank, budget=v.budget or spec.budget, task=name, key=key,
                        allocation=v.allocation, scope=v.scope),
            versions={"method": method_version, "task": task.version},
            compression=v.compression, memory={"weight_bytes": eff["weight_bytes"], "peak": dict(mem)},
            latency=eff.get("latency"), timings={**v.timings, "evaluate_s": time.perf_counter() - t0},
        )
        write_cell(path, record)
        written.append(record)
    return written


def _summary_line(records: list[CellRecord]) -> str:
    parts = []
    for r in records:
        v = r.metrics.get(r.primary_metric)
        parts.append(f"{r.cell.task} {r.primary_metric}=" + (f"{v:.4g}" if isinstance(v, (int, float)) and math.isfinite(v)
                                                              else "undefined"))
    c = records[0].compression if records else None
    if c:
        compute = f", compute {c['compute_ratio']:.3f}x" if c.get("compute_ratio") is not None else ""
        parts.append(f"params {c['param_ratio']:.3f}x{compute}, {c['n_fallbacks']} fallbacks")
    return ", ".join(parts)


# ---------------------------------------------------------------- analyses

@dataclass
class AnalysisContext:
    """What an analysis may use of the harness: the dense model, its statistics and groups, the public compress
    step, and tasks sized as the run sizes them."""

    model: torch.nn.Module
    tokenizer: object
    stats: Mapping[str, GroupStats]  # a StatsStore: groups read on demand
    groups: list
    seed: int
    progress: bool
    spec: RunSpec

    @contextmanager
    def compressed(self, method: str, rank: RankSpec, only_groups: set[str] | None = None):
        """`with ctx.compressed(...) as model:` the dense model compressed in place, restored on exit."""
        with compressed(self.model, method, rank, self.stats,
                        self.spec.method_options.get(methods.base_name(method)), only_groups,
                        progress=False) as (model, _):
            yield model

    def task(self, name: str, **overrides):
        return build_task(self.spec, name, **overrides)


def analysis_key(analysis, spec: RunSpec, fingerprint) -> str:
    used = {t: task_key(build_task(spec, t)) for t in analysis.uses_tasks}
    return settings_hash(analysis.name, analysis.version, analysis.settings_dict(), used,
                         calib_spec(spec).as_dict(), fingerprint, spec.budget)


# ---------------------------------------------------------------- the sweep

PARTS = ("dense", "variants", "analyses")  # the local sweep; "calibrate" forces the calibration


def sweep_needs(spec: RunSpec, analyses: dict) -> frozenset[str]:
    """The statistics a whole sweep reads: its methods', its allocation rules' and its analyses'."""
    return needed_stats([build_method(m, spec) for m in spec.methods]).union(
        *(a.needs for a in analyses.values()), *(RULES[rule] for rule in spec.allocate))


def run(spec: RunSpec, analyses: dict | None = None, parts=PARTS, stats_needs: frozenset | None = None,
        claim_owner: str | None = None, models: dict | None = None) -> dict:
    """The sweep. `analyses` ({name: Analysis}, built by the caller from the analyses registry) are the names of
    spec.tasks that are not model tasks; the harness runs them through `AnalysisContext` and never imports them.

    An executor that spreads a sweep over processes runs it in `parts`: "dense" and "calibrate" once, then
    "variants" (one spec per method, rank and allocation) and "analyses" where it likes. `stats_needs`, the whole
    sweep's statistics, makes every part read the one calibration the "calibrate" part wrote. `models`: a dict the
    caller keeps across calls, in which a worker process keeps its loaded model for its next part."""
    from .models import load_model
    from .spec import validate

    analyses = dict(analyses or {})
    validate(spec, set(analyses))
    out_root = Path(spec.output)
    torch.set_num_threads(spec.threads or available_cpus())
    device = torch.device(spec.device)
    torch.manual_seed(spec.seed)
    t_start = time.perf_counter()
    log(f"acbench {__version__}: model {spec.model}, methods {', '.join(spec.methods)}"
        + (f", ranks {', '.join(f'{r:g}' for r in spec.ranks)} ({spec.budget} budget"
           + ("" if spec.allocate == [UNIFORM] else f"; allocation {', '.join(spec.allocate)}") + ")"
           if spec.ranks else "")
        + (f", sparsity {', '.join(map(str, spec.sparsity))}" if spec.sparsity else "")
        + f", tasks {', '.join(spec.tasks)}")
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
        checked["tasks"] = build_tasks(spec, analyses)
        for task in checked["tasks"].values():
            task.check(tokenizer)
        for analysis in analyses.values():
            for name in analysis.uses_tasks:
                build_task(spec, name)  # its run-sized tasks' settings are valid
        if any(a.needs for a in analyses.values()) or any(build_method(m, spec).required_stats()
                                                            for m in spec.methods):
            # kept for calibration: the text is tokenized once
            checked["calib_windows"] = calibration_windows(tokenizer, load_text(spec.calib_source, "calib"),
                                                           spec.calib_samples, spec.calib_seq_len, spec.seed, spec.bos)

    key = (spec.model, spec.dtype, spec.device, spec.device_map)
    if models is not None and key in models:
        # The dense model a previous part of the sweep left in this process (a variant restores it bit for bit)
        lm = models[key]
        log("model: the one this process loaded for its previous part")
        preflight(lm.tokenizer)
    else:
        lm = load_model(spec.model, spec.dtype, spec.device, progress=spec.progress, before_weights=preflight,
                        device_map=spec.device_map)
        if models is not None:
            models.clear()  # one model per process
            models[key] = lm
    model_tasks = checked["tasks"]
    env = environment(spec.device)
    common = {"model_fingerprint": lm.fingerprint, "seed": spec.seed, "env": env, "bos": spec.bos}

    # Which cells are missing?
    ranks = [RankSpec(r, spec.budget, spec.rank_align) for r in spec.ranks]
    patterns = [SparsitySpec.parse(p) for p in spec.sparsity or []]

    def needs_computing(p: Path) -> bool:
        if spec.overwrite:
            return True
        status = cell_status(p)
        if status not in (None, "missing"):
            log(f"recomputing {p}: {status}")
        return status is not None

    all_groups = find_input_groups(lm.model)
    selection = Selection.from_flags(spec.groups, spec.blocks).resolve(len({g.block for g in all_groups}))
    scope = selection.scope
    selected = [g for g in all_groups if selection.includes(g)]
    if scope != ALL:
        log(f"compressing {len(selected)} of {len(all_groups)} input groups: {describe_scope(scope)}"
            + ("; analyses run over every group" if analyses else ""))

    if any(rule != UNIFORM for rule in spec.allocate):
        for r in ranks:
            check_budget(selected, r)
    # a pattern that cannot split a group is refused before any cell is computed
    if any(methods.family_of(m) == SPARSITY_FAMILY for m in spec.methods):
        check_pattern_widths(patterns, selected)

    def paths_for(method, rank, key_extra, allocation=UNIFORM, budget=None):
        todo = {}
        for name, task in model_tasks.items():
            key = settings_hash(task_key(task), key_extra, lm.fingerprint)
            p = cell_path(out_root, lm.name, method, rank, budget or spec.budget, name, key,
                          allocation=allocation if method != DENSE else UNIFORM, scope=scope if method != DENSE else ALL)
            if needs_computing(p):
                todo[name] = (task, p, key)
        return todo

    dense_todo = paths_for(DENSE, None, None) if "dense" in parts else {}
    plan = {}
    for m in (spec.methods if "variants" in parts else []):
        sparse = methods.family_of(m) == SPARSITY_FAMILY
        # a sparsity method keeps one pattern in every group: only the uniform rule applies to it
        for r in (patterns if sparse else ranks):
            for rule in ([UNIFORM] if sparse else spec.allocate):
                todo = paths_for(m, r.ratio, method_key(m, spec, rule, scope, r), rule,
                                 budget=r.budget if sparse else None)
                if todo:
                    plan[(m, r, rule)] = todo
    analysis_todo = {}
    if analyses and not ranks:
        log(f"{', '.join(analyses)}: run at rank ratios, and this run gives none (--sparsity only): skipped; add "
            "--rank 0.5 to run them")
    for name, analysis in (analyses.items() if "analyses" in parts else []):
        key = analysis_key(analysis, spec, lm.fingerprint)
        for r in ranks:
            p = cell_path(out_root, lm.name, analysis_method(name), r.ratio, spec.budget, name, key)
            if needs_computing(p):
                analysis_todo[(name, r)] = (analysis, p, key)
    n_cells = len(dense_todo) + sum(len(t) for t in plan.values()) + len(analysis_todo)
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
            _, p, _ = item
            if not claim_cell(p, claim_owner):
                elsewhere.append(p)
                continue
            claimed.add(p)
            if not spec.overwrite and cell_status(p) is None:  # finished by another run meanwhile
                unclaim(p)
                continue
            mine[name] = item
        return mine

    def release(todo: dict) -> None:
        for _, p, _ in todo.values():
            unclaim(p)

    try:
        dense_todo = claim(dense_todo)
        if dense_todo:
            recs = evaluate_variant(Variant(DENSE, None, lm.model, None, {}), lm, spec, dense_todo, common, device)
            written += len(recs)
            release(dense_todo)
            log(f"[dense] {_summary_line(recs)}")

        # One calibration per sweep: the statistics of all its methods, rules and analyses, whichever cells are
        # missing now, so a rerun and every part of a sweep spread over processes read the same cache folder.
        needs = frozenset()
        if plan or analysis_todo or "calibrate" in parts:
            needs = sweep_needs(spec, analyses)
            if stats_needs is not None and needs:
                needs = frozenset(stats_needs)
        stats, calib_info = ({}, None)
        # analyses read every group; methods the selected ones
        groups = all_groups if analysis_todo or ("calibrate" in parts and analyses) else selected
        if needs:
            stats, calib_info = load_or_calibrate(lm, groups, spec, needs, checked.get("calib_windows"))
        allocations: dict = {}  # (rule, rank) -> Allocation: one per rule and ratio, whatever the method
        for (m, r, rule), todo in tqdm(list(plan.items()), desc="cells", disable=not spec.progress):
            todo = claim(todo)
            if not todo:
                continue
            timings = {}
            if rule != UNIFORM:
                if (rule, r) not in allocations:
                    allocations[(rule, r)] = allocate(rule, selected, stats, r, progress=spec.progress)
                timings["allocate_s"] = sum(allocations[(rule, r)].seconds.values())
            alloc = allocations.get((rule, r))
            uses_stats = bool(build_method(m, spec).required_stats() or RULES[rule])
            opts = spec.method_options.get(methods.base_name(m))
            t0 = time.perf_counter()
            with compressed(lm.model, m, r, stats, opts, progress=spec.progress,
                            only_groups=None if scope == ALL else {g.name for g in selected},
                            ks=alloc.ks if alloc else None) as (model, summaries):
                timings["compress_s"] = time.perf_counter() - t0
                if calib_info and uses_stats:
                    timings["calibrate_s"] = calib_info.get("seconds")
                cell_common = {**common, "calibration": calib_info if uses_stats else None}
                summary = compression_summary(summaries, r, m, opts, alloc.summary() if alloc else None, scope)
                recs = evaluate_variant(Variant(m, r.ratio, model, summary, timings, rule, scope, r.budget), lm,
                                        spec, todo, cell_common, device)
            written += len(recs)
            release(todo)
            log(f"[{variant_name(m, rule)} @ {r.label}] {_summary_line(recs)}")
        analysis_todo = claim(analysis_todo)
        if analysis_todo:
            ctx = AnalysisContext(lm.model, lm.tokenizer, stats, groups, spec.seed, spec.progress, spec)
        for (name, r), (analysis, path, key) in analysis_todo.items():
            t0 = time.perf_counter()
            result = analysis.run(ctx, r)
            write_cell(path, cell_record(
                analysis, result, **common, calibration=calib_info,
                cell=CellId(model=lm.name, method=analysis_method(name), rank=r.ratio, budget=spec.budget, task=name,
                            key=key),
                versions={"analysis": analysis.version}, timings={f"{name}_s": time.perf_counter() - t0}))
            unclaim(path)
            written += 1
            log(f"[{name} @ {r.ratio:g}] " + analysis.summary_line(result))
    finally:
        for p in list(claimed):  # an interrupted run leaves no claim that would block its successor
            unclaim(p)
    if elsewhere:
        log(f"{len(elsewhere)} cell(s) left to another run that is computing them now: "
            + ", ".join(str(p.relative_to(out_root)) for p in elsewhere[:5]) + (" ..." if len(elsewhere) > 5 else ""))
    elapsed = time.perf_counter() - t_start
    log(f"done: {written} cell(s) written in {elapsed:.0f} s")
    return {"written": written, "seconds": elapsed, "output": str(out_root), "elsewhere": [str(p) for p in elsewhere]}
