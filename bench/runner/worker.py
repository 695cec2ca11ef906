"""The local `Worker`: one process computing its share of a sweep's cells, variant by variant: the model loaded once,
the shared calibration computed or read once, each variant compressed in place, its cells scored and stored, and
the model restored."""

from __future__ import annotations
import functools
import math
import time
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
import torch
from tqdm.auto import tqdm

from acbench.core.interruptible import interruptible
from acbench.core.log import warn
from acbench.core.record import DENSE, UNIFORM, CellRecord
from acbench.core.stats import GroupStats, RankSpec, solve_torch_dtype
from acbench.deploy.allocation import SPARSITY_RULES, allocate, allocate_density
from acbench.runner.cells import Cell, ModelInfo
from acbench.deploy.compression import Deployment, compressed, compression_summary, deploy, deploy_sequential
from acbench.runner.config import (OWN_CALIBRATION, SEQUENTIAL_CALIBRATION, Run, reference_method,
                                    solve_device_for)
from acbench.model.groups import find_input_groups
from acbench.measure.latency import (LatencySpec, compare_latency, latency, measured_density, peak_memory,
                                  threshold_sparsifiers, weight_bytes, with_calibration_peak)
from acbench.model.sources import LoadedModel, ModelSource, load_weights, loaded_as, open_model
from acbench.runner.selection import ALL
from acbench.runner.until_decided import (evaluate_until_decided, partial_path,
                                        reference_records)
from acbench.calibration.cache import Calibration, calibration_windows, load_or_calibrate
from acbench.calibration.support import after_line, support_record
from acbench.results.store import cell_status, claim_cell, environment, release_cell, write_cell
from acbench.runner.prepare import log


def cell_record(plugin, result, **fields) -> CellRecord:
    """A cell from a task's or analysis's result: what the result declares (an lm-eval task's metrics, known only
    once it ran) overrides what the plugin's class declares."""
    return CellRecord(
        metrics=result.metrics, stderr=result.stderr, details=result.details, task_config=result.config,
        records=result.records, higher_is_better={**plugin.higher_is_better, **result.higher_is_better},
        primary_metric=result.primary_metric or plugin.primary_metric or next(iter(result.metrics)), **fields)


def summary_line(records: list[CellRecord]) -> str:
    parts = []
    for r in records:
        v = r.metrics.get(r.primary_metric)
        parts.append(f"{r.cell.task} {r.primary_metric}=" + (f"{v:.4g}" if isinstance(v, (int, float))
                                                              and math.isfinite(v) else "undefined"))
    c = (records[0].compression if records else None) or {}
    if "param_ratio" in c:  # a compression this run made (a checkpoint run as dense carries only its density)
        compute = f", compute {c['compute_ratio']:.3f}x" if c.get("compute_ratio") is not None else ""
        parts.append(f"params {c['param_ratio']:.3f}x{compute}, {c['n_fallbacks']} fallbacks")
    if c.get("measured_density") is not None:
        parts.append(f"measured density {c['measured_density']:.3f}")
    return ", ".join(parts)


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
    run: Run
    solve_device: str = "cpu"

    @property
    def solve_dtype(self) -> str:
        return self.run.config.solve_dtype

    @contextmanager
    def compressed(self, method: str, rank: RankSpec, only_groups: set[str] | None = None):
        """`with ctx.compressed(...) as model:` the dense model compressed in place, restored on exit."""
        with compressed(self.model, method, rank, self.stats, self.run.method_options(method), only_groups,
                        progress=False, solve_device=self.solve_device, solve_dtype=self.solve_dtype) as (model, _):
            yield model

    def task(self, name: str, **overrides):
        return self.run.task(name, **overrides)


def _on_claimed(stage):
    """A Worker stage runs on the cells this process claims (another run may hold or have finished the rest);
    it returns the cells it wrote, 0 where it claimed none."""

    @functools.wraps(stage)
    def on_claimed(self, cells):
        mine = self.claim(cells)
        return stage(self, mine) if mine else 0

    return on_claimed


def cell_calibration(record: dict | None, comp, groups) -> dict | None:
    """A cell's calibration record with its method's authors' calibration beside it (null where they state none),
    so a leaderboard row says what the method got against what its paper used, and, where the calibration has fewer
    tokens than groups it solves from full-rank statistics, how many (`short`)."""
    if record is None:
        return None
    own = comp.authors_calibration
    out = {**record, "authors": own.as_dict() if own is not None else None}
    spec = record.get("spec") or {}
    short = support_record(comp, groups, int(spec.get("samples", 0)) * int(spec.get("seq_len", 0)))
    if short is not None:
        out["short"] = short
    return out


def deploy_one(run: Run, model, method: str, budget, stats, record: dict | None, windows, alloc, selected,
               solve_device: str, merge: bool = False) -> tuple[Deployment, dict | None, float | None]:
    """`method` at `budget` deployed in `model` in place, over the selected groups: from `stats` (their calibration
    `record`), or, where the method's calibration is sequential, calibrated block by block from `windows` as it is
    compressed. Returns the Deployment, the calibration record the cells store, and the seconds a sequential
    calibration took (None otherwise)."""
    opts = run.method_options(method)
    only = None if run.selection.scope == ALL else {g.name for g in selected}
    plan = run.calibration_of(method)
    if plan.kind == SEQUENTIAL_CALIBRATION:
        spec = plan.spec
        with peak_memory(torch.device(run.config.device)) as mem:  # the calibration's and its solves' together
            dep, counts = deploy_sequential(model, method, budget, windows, spec, opts, only_groups=only,
                                            progress=run.config.progress, merge=merge, solve_device=solve_device,
                                            solve_dtype=run.config.solve_dtype,
                                            batch_size=max(1, run.config.batch_size // 2))
        needs = sorted(run.compressor(method).required_stats())
        return dep, {"spec": spec.as_dict(), "stats": needs, "cached": False, **counts, "peak": dict(mem)}, \
            counts["seconds"]
    dep = deploy(model, method, budget, stats, opts, progress=run.config.progress, only_groups=only, merge=merge,
                 solve_device=solve_device, solve_dtype=run.config.solve_dtype,
                 **(alloc.compress_args() if alloc else {}))
    return dep, record, None


def variant_allocation(run: Run, rule: str, budget, selected, stats, solve_device: str):
    """The allocation of `rule` at `budget` over the selected groups: k per group under a parameter budget, a
    density per group under a sparsity one; None for uniform."""
    if rule == UNIFORM:
        return None
    if rule in SPARSITY_RULES:
        return allocate_density(rule, selected, stats, budget)
    # its eigen-solves in a helper thread, as the groups' solves: a signal reaches the run inside them
    return interruptible(allocate, rule, selected, stats, budget, progress=run.config.progress, device=solve_device,
                         dtype=solve_torch_dtype(run.config.solve_dtype))


@dataclass
class Worker:
    """One process's state across the cells it computes: the loaded model, its groups, the statistics, the rank
    allocations and the cells it has claimed. `models`: a dict kept across calls (a Ray worker process keeps its
    loaded model for its next share)."""

    run: Run
    source: ModelSource | None = None
    calib_windows: torch.Tensor | None = None
    models: dict | None = None
    claim_owner: str | None = None
    lm: LoadedModel | None = None
    groups: list = field(default_factory=list)  # every input group of the loaded model (analyses read them all)
    selected: list = field(default_factory=list)  # those the run compresses
    stats: Mapping = field(default_factory=dict)
    calibration: Calibration | None = None  # once the statistics stage ran
    calibrations: dict = field(default_factory=dict)  # {CalibSpec: Calibration}: methods' own one-pass calibrations
    windows: dict = field(default_factory=dict)  # {windows key: tokens} of calibrations other than the run's
    allocations: dict = field(default_factory=dict)
    claimed: set = field(default_factory=set)
    elsewhere: list = field(default_factory=list)
    stages: dict = field(default_factory=dict)  # wall seconds per stage, in the order they first ran
    solve_device: str | None = None  # where the solves run: resolved once, when the model is loaded
    loaded_as: dict = field(default_factory=dict)  # the dense model's parameters and dtype, read when it is loaded

    def spent(self, stage: str, seconds: float) -> None:
        self.stages[stage] = self.stages.get(stage, 0.0) + seconds

    def model(self) -> LoadedModel:
        if self.lm is not None:
            return self.lm
        c = self.run.config
        key = (c.model, c.dtype, c.device, c.device_map)
        if self.models is not None and key in self.models:
            # The dense model a previous share left in this process (a variant restores it bit for bit)
            log("model: the one this process loaded for its previous cells")
            self.lm = self.models[key]
        else:
            t0 = time.perf_counter()
            source = self.source or open_model(c.model, c.dtype, c.progress, c.device_map)
            self.lm = load_weights(source, c.device)
            self.spent("model load", time.perf_counter() - t0)
            if self.models is not None:
                self.models.clear()  # one model per process
                self.models[key] = self.lm
        self.solve_device = solve_device_for(self.run.config, self.lm.model)
        self.loaded_as = loaded_as(self.lm.model)
        if not self.run.methods:  # the model as it is (--methods dense): a compressed checkpoint has no dense groups
            return self.lm
        self.groups = find_input_groups(self.lm.model)
        if self.run.n_blocks is None:
            raise ValueError("a Worker computes a prepared run (its selection resolved by open_checked)")
        self.selected = [g for g in self.groups if self.run.selection.includes(g)]
        return self.lm

    @property
    def scope(self) -> str:
        return self.run.selection.scope

    def common(self) -> dict:
        """What every cell of this worker records of the run: the model (its identity, and its parameters and dtype
        as loaded, read before any variant is deployed), seed, environment and BOS protocol."""
        lm = self.model()
        return {"model_fingerprint": {**lm.fingerprint, **self.loaded_as}, "seed": self.run.config.seed,
                "env": environment(self.run.config.device), "bos": self.run.bos}

    # -------------------------------------------- claims: parallel runs on one results directory split the work

    def claim(self, cells: list[Cell]) -> list[Cell]:
        """The cells this process computes: those no live process has claimed and none has finished since the
        plan was made."""
        mine = []
        for cell in cells:
            if not claim_cell(cell.path, self.claim_owner):
                self.elsewhere.append(cell.path)
                continue
            self.claimed.add(cell.path)
            if cell.why != "overwrite" and cell_status(cell.path) is None:  # finished by another run meanwhile
                self.unclaim(cell.path)
                continue
            mine.append(cell)
        return mine

    def unclaim(self, path: Path) -> None:
        release_cell(path)
        self.claimed.discard(path)

    def release_all(self) -> None:
        for p in list(self.claimed):  # an interrupted run leaves no claim that would block its successor
            self.unclaim(p)

    # -------------------------------------------- the stages

    def statistics(self, every_group: bool) -> None:
        """The sweep's statistics (all its methods', rules' and analyses'), whichever cells are missing now, so a
        rerun and every worker read the same cache folder. Analyses read every group; methods the selected ones."""
        needs = self.run.stats_needs()
        if not needs or self.calibration is not None:
            return
        lm = self.model()
        run = self.run
        t0 = time.perf_counter()
        self.calibration = with_calibration_peak(run.config.device, lambda: load_or_calibrate(
            lm, self.groups if every_group else self.selected, run.calibration, needs, run.stats_memory,
            run.config.batch_size, run.config.progress, self.calib_windows))
        self.stats = self.calibration.stats
        self.spent(self.calibration.stage, time.perf_counter() - t0)

    @property
    def calibration_record(self) -> dict | None:
        """What a cell's `calibration` field stores (None before the statistics stage, or when none is needed)."""
        return None if self.calibration is None else self.calibration.record

    def text(self) -> torch.Tensor:
        """Token windows of the calibration text, for latency to decode and prefill (tokenized once)."""
        if self.calib_windows is None:
            self.calib_windows = calibration_windows(self.model().tokenizer, self.run.calibration)
        return self.calib_windows

    def evaluate(self, model, cells: list[Cell], compression: dict | None, timings: dict,
                 common: dict, deployment: Deployment | None = None) -> list[CellRecord]:
        """Evaluate the cells of one model variant (dense, or `deployment`'s) and write each as soon as it is
        done."""
        run = self.run
        eff = {"weight_bytes": weight_bytes(model)}
        if run.config.measure_latency:
            t0 = time.perf_counter()
            spec = LatencySpec(batch=run.config.batch_size, seconds=float(run.config.latency_seconds))
            # a variant is timed against dense in the same process, alternating; dense alone for its own row
            eff["latency"] = latency(model, spec, text=self.text()) if deployment is None else \
                compare_latency(model, deployment.dense_switch(), spec, text=self.text())
            timings["latency_s"] = time.perf_counter() - t0
            self.spent("latency", timings["latency_s"])
        method = cells[0].id.method
        method_version = run.compressor(method).version if method != DENSE else None
        written = []
        for cell in cells:
            task = run.tasks[cell.id.task]
            t0 = time.perf_counter()
            for s in threshold_sparsifiers(model):
                s.reset_counts()
            with peak_memory(torch.device(run.config.device)) as mem:
                if task.until_decided is not None:
                    result = evaluate_until_decided(task, model, self.lm.tokenizer, self.reference_for(cell),
                                                    progress=run.config.progress, keep=partial_path(cell.path))
                else:
                    result = task.evaluate(model, self.lm.tokenizer, progress=run.config.progress)
            # thresholds: the density this task's tokens kept (a threshold checkpoint run as dense has no
            # compression summary of this run, but its layers still keep a measured density)
            density = measured_density(model)
            comp = compression if density is None else {**(compression or {}), "measured_density": density}
            record = cell_record(
                task, result, **common, cell=cell.id, versions={"method": method_version, "task": task.version},
                compression=comp, memory={"weight_bytes": eff["weight_bytes"], "peak": dict(mem)},
                latency=eff.get("latency"), timings={**timings, "evaluate_s": time.perf_counter() - t0})
            self.spent(f"evaluate {cell.id.task}", record.timings["evaluate_s"])
            seq = result.details.get("until_decided") if isinstance(result.details, dict) else None
            if seq and seq.get("interval"):
                log(f"[{cell.label}] {cell.id.task} vs {seq['reference']}: {seq['decision'] or 'undecided'} after "
                    f"{seq['items']:,} of {seq['budget']:,} items ({seq['stopped']})")
            write_cell(cell.path, record)
            self.unclaim(cell.path)
            written.append(record)
        return written

    def reference_for(self, cell: Cell) -> list[dict] | None | bool:
        """--until-decided: the stored records of the reference's cell this cell is compared with (same budget and
        task); False for dense and the reference itself, which are evaluated on the whole budget."""
        ref = self.run.tasks[cell.id.task].until_decided.reference
        if cell.id.method in (DENSE, ref):
            return False
        from acbench.runner.cells import path_of, variant_cell_id

        lm = self.model()
        info = ModelInfo(cell.id.model, lm.fingerprint, self.run.n_blocks)
        return reference_records(path_of(self.run, variant_cell_id(self.run, info, ref, cell.budget, UNIFORM,
                                                                   cell.id.task)))

    @_on_claimed
    def dense(self, cells: list[Cell]) -> int:
        recs = self.evaluate(self.model().model, cells, None, {}, self.common())
        log(f"[dense] {summary_line(recs)}")
        return len(recs)

    def allocation(self, rule: str, budget):
        """The allocation of `rule` at `budget` over the selected groups (None: uniform), computed once: k per
        group under a parameter budget, or a density per group under a sparsity one."""
        if (rule, budget) not in self.allocations:
            self.allocations[(rule, budget)] = variant_allocation(self.run, rule, budget, self.selected, self.stats,
                                                                  self.solve_device)
        return self.allocations[(rule, budget)]

    def own_calibration(self, method: str) -> Calibration:
        """A one-pass calibration of the method's own (its authors' sizes): computed or read from the cache once,
        holding only what the method reads."""
        spec = self.run.calibration_for(method)
        if spec not in self.calibrations:
            lm, run = self.model(), self.run
            t0 = time.perf_counter()
            self.calibrations[spec] = with_calibration_peak(run.config.device, lambda: load_or_calibrate(
                lm, self.selected, spec, run.compressor(method).required_stats(), run.stats_memory,
                run.config.batch_size, run.config.progress, self.windows_for(spec)))
            self.spent(self.calibrations[spec].stage, time.perf_counter() - t0)
        return self.calibrations[spec]

    def windows_for(self, spec) -> torch.Tensor:
        """The calibration windows of a spec (the run's are the ones prepared), tokenized once each."""
        if spec.windows_key == self.run.calibration.windows_key:
            return self.text()
        if spec.windows_key not in self.windows:
            self.windows[spec.windows_key] = calibration_windows(self.model().tokenizer, spec)
        return self.windows[spec.windows_key]

    def statistics_for(self, method: str) -> tuple:
        """(statistics, their Calibration, windows) a method deploys from: the sweep's shared calibration, one of
        its own (its authors' sizes), or, calibrated sequentially, none yet and the windows it calibrates on as it
        compresses."""
        plan = self.run.calibration_of(method)
        if plan.kind == SEQUENTIAL_CALIBRATION:
            return {}, None, self.windows_for(plan.spec)
        if plan.kind == OWN_CALIBRATION:
            own = self.own_calibration(method)
            return own.stats, own, None
        # shared, or none (what an allocation rule reads): computed once, a sweep's first stage has usually run it
        self.statistics(every_group=False)
        return self.stats, self.calibration, None

    def deploy_variant(self, m: str, budget, rule: str, alloc, timings: dict) -> tuple[Deployment, dict | None]:
        """One variant deployed in place: from the shared statistics, a calibration of its own, or (sequential)
        calibrated block by block as it is compressed. Returns the Deployment and the cells' calibration record."""
        run = self.run
        stats, calibration, windows = self.statistics_for(m)
        t0 = time.perf_counter()
        dep, record, calibrate_s = deploy_one(
            run, self.model().model, m, budget, stats, calibration.record if calibration else None, windows, alloc,
            self.selected, self.solve_device)
        timings["compress_s"] = time.perf_counter() - t0 - (calibrate_s or 0.0)
        if calibrate_s is not None:
            self.spent("calibration (sequential)", calibrate_s)
        self.spent(f"compress {m}", timings["compress_s"] + timings.get("allocate_s", 0.0))
        if record is not None and run.uses_stats(m, rule):
            timings["calibrate_s"] = calibrate_s if calibrate_s is not None else calibration.seconds
            return dep, record
        return dep, None

    @_on_claimed
    def variant(self, cells: list[Cell]) -> int:
        """The cells of one (method, budget, allocation): compressed once, in place, restored after."""
        run = self.run
        m, budget, rule = cells[0].variant
        timings = {}
        alloc = self.allocation(rule, budget)
        if alloc:
            timings["allocate_s"] = sum(alloc.seconds.values())
        opts = run.method_options(m)
        dep, record = self.deploy_variant(m, budget, rule, alloc, timings)
        try:
            calibration = cell_calibration(record, run.compressor(m), self.selected)
            common = {**self.common(), "calibration": calibration}
            summary = compression_summary(dep.summaries, budget, m, opts, alloc.summary() if alloc else None,
                                          self.scope, self.solve_device, run.config.solve_dtype)
            if calibration and calibration.get("short"):
                warn(after_line(cells[0].label, calibration["short"], summary))
            recs = self.evaluate(dep.model, cells, summary, timings, common, dep)
        finally:
            dep.restore()
        log(f"[{cells[0].label}] {summary_line(recs)}")
        return len(recs)

    @_on_claimed
    def analyses(self, cells: list[Cell]) -> int:
        lm, run = self.model(), self.run
        ctx = AnalysisContext(lm.model, lm.tokenizer, self.stats, self.groups, run.config.seed, run.config.progress,
                              run, self.solve_device)
        for cell in cells:
            analysis = run.analyses[cell.id.task]
            t0 = time.perf_counter()
            result = analysis.run(ctx, cell.budget)
            seconds = time.perf_counter() - t0
            self.spent(f"analysis {cell.id.task}", seconds)
            write_cell(cell.path, cell_record(
                analysis, result, **self.common(), calibration=self.calibration_record, cell=cell.id,
                versions={"analysis": analysis.version}, timings={f"{cell.id.task}_s": seconds}))
            self.unclaim(cell.path)
            log(f"[{cell.id.task} @ {cell.budget.label}] " + analysis.summary_line(result))
        return len(cells)

    def compute(self, cells: list[Cell], calibrate: bool = False) -> int:
        """Every given cell this process can claim: dense first, then each variant, then the analyses.
        `calibrate`: compute the sweep's statistics even if none of these cells reads them (Ray's first task)."""
        dense = [c for c in cells if c.id.method == DENSE]
        analysis = [c for c in cells if c.id.is_analysis]
        by_variant: dict = {}
        for c in cells:
            if c.id.method != DENSE and not c.id.is_analysis:
                by_variant.setdefault(c.variant, []).append(c)
        if self.run.config.until_decided:  # the reference first: every other variant stops against its records
            by_variant = dict(sorted(by_variant.items(), key=lambda kv: kv[0][0] != reference_method(self.run.config)))
        written = 0
        try:
            written += self.dense(dense)
            if by_variant or analysis or calibrate:
                self.model()
                self.statistics(every_group=bool(analysis) or (calibrate and bool(self.run.analyses)))
            for group in tqdm(list(by_variant.values()), desc="cells", disable=not self.run.config.progress):
                written += self.variant(group)
            written += self.analyses(analysis)
        finally:
            self.release_all()
        return written
