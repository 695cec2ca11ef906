"""One variant of one model, compressed in place and held as a handle (`Compressed`): what `bench compress` saves
and what the Python call `acbench.compress` returns. Both build it here, from a one-variant run, so a checkpoint's
provenance and a cell's compression summary mean the same whichever way the model was compressed."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from acbench.core.errors import UserError
from acbench.core.log import console_lines, warn
from acbench.core.stats import RankSpec, SparsitySpec

from acbench.deploy.compression import Deployment, compression_summary
from acbench.measure.latency import weight_bytes
from acbench.calibration.support import after_line
from acbench.model.checkpoint import MODELING_FILE, check_target, write_checkpoint
from acbench.calibration.cache import Calibration, calibrated_passes, calibration_windows, load_or_calibrate
from acbench.calibration.engine import CalibSpec
from acbench.calibration.group_files import default_stats_memory, from_stored, to_stored
from acbench.calibration.memory import calibration_chunks
from acbench.measure.latency import with_calibration_peak
from acbench.runner.config import OWN_CALIBRATION, SEQUENTIAL_CALIBRATION, Run, solve_device_for
from acbench.results.store import available_cpus
from acbench.runner.execute import third_party_kept, write_kept_lines
from acbench.runner.worker import Worker, deploy_one, variant_allocation, cell_calibration
from acbench.runner.prepare import log, open_checked


@dataclass
class Compressed:
    """A model compressed in place by one method at one budget. `model` is the caller's model object itself, now
    running the deployed variant; `summary` is what a cell's `compression` field stores (ratios, groups,
    fallbacks, the method's settings); `calibration` is what its `calibration` field stores (None for a data-free
    method). `restore()` gives the dense model back bit for bit; `save(path)` writes a checkpoint that
    transformers, lm-eval and acbench load. Usable as a context manager that restores on exit."""

    model: torch.nn.Module
    tokenizer: object
    method: str
    budget: RankSpec | SparsitySpec
    summary: dict
    calibration: dict | None
    provenance: dict
    deployment: Deployment

    @property
    def summaries(self) -> list[dict]:
        """One summary per compressed input group (k, form, parameters, fallbacks)."""
        return self.deployment.summaries

    @property
    def restored(self) -> bool:
        return self.deployment.restored

    def restore(self) -> torch.nn.Module:
        """Put the dense modules back (a second call does nothing); returns the model."""
        self.deployment.restore()
        return self.model

    def save(self, path: str | Path, overwrite: bool = False) -> dict:
        """Write the compressed model, its tokenizer and compression.json into `path` (absent or empty unless
        `overwrite`), atomically. Returns the files written and their bytes."""
        if self.restored:
            raise UserError(f"this {self.method} compression was restored (the model is dense again): compress it "
                            "anew to save it")
        out = Path(path)
        check_target(out, overwrite)
        with console_lines(only_if_unheard=True):  # a call of the Python API, as compress is
            log(f"writing {out}/")
            written = write_checkpoint(self.model, self.tokenizer, out, self.provenance, overwrite)
            log(f"{out}: {written['verified']}")
        return {**written, "custom_code": MODELING_FILE in written["files"]}

    def __enter__(self) -> "Compressed":
        return self

    def __exit__(self, *exc) -> None:
        self.restore()


def compress_variant(run: Run, model, tokenizer, source_model: dict, selected, stats,
                     calibration_record: dict | None,
                     merge: bool = False, allocation=None, solve_device: str | None = None,
                     windows: torch.Tensor | None = None) -> Compressed:
    """Deploy the one-variant run's method at its budget over the selected groups of `model` (in place).
    `source_model`: {"given", "name", "fingerprint"} for the provenance; `allocation`: the rule's allocation, if
    already computed (else it is computed here); `windows`: the calibration tokens of a sequential calibration
    (which calibrates as it compresses, so `stats` is then empty)."""
    (method,), budget, rule = run.methods, (run.ranks + run.patterns)[0], run.allocate[0]
    solve_device = solve_device or solve_device_for(run.config, model)
    alloc = allocation if allocation is not None else variant_allocation(run, rule, budget, selected, stats,
                                                                         solve_device)
    opts = run.method_options(method)
    scope = run.selection.scope
    dep, record, _ = deploy_one(run, model, method, budget, stats, calibration_record, windows, alloc, selected,
                                solve_device, merge)
    summary = compression_summary(dep.summaries, budget, method, opts, alloc.summary() if alloc else None, scope,
                                  solve_device, run.config.solve_dtype)
    calibration = cell_calibration(record, run.compressor(method), selected) if run.uses_stats(method, rule) \
        else None
    if calibration and calibration.get("short"):
        warn(after_line(f"{method} @ {budget.label}", calibration["short"], summary))
    label = f"{budget.budget} {budget.label}" if isinstance(budget, RankSpec) else f"sparsity {budget.label}"
    provenance = {
        "method": method, "budget": label + ("" if alloc is None else f", {rule} allocation"),
        "form": "merged" if merge else "as solved", "source_model": source_model, "calibration": calibration,
        "bos": run.bos, "seed": run.config.seed, "compression": summary}
    return Compressed(model, tokenizer, method, budget, summary, calibration, provenance, dep)


def save_compressed(run: Run, out: Path, merge: bool = False, overwrite: bool = False) -> dict:
    """`bench compress`: open and check the model, calibrate (or read the statistics cache), compress with the
    run's one method at its one budget, and write the checkpoint. Returns what was written and measured."""
    check_target(out, overwrite)  # before anything loads
    torch.set_num_threads(run.config.threads or available_cpus())  # as a sweep's process sets them
    torch.manual_seed(run.config.seed)
    with third_party_kept(not run.config.progress) as said:  # --quiet: other libraries' lines kept, not shown
        prepared = open_checked(run)
        check_target(out, overwrite, prepared.source.target)  # an alias's folder is known once the model is located
        run = prepared.run
        worker = Worker(run, prepared.source, prepared.calib_windows)
        lm = worker.model()
        dense_bytes = weight_bytes(lm.model)
        t0 = time.perf_counter()
        # the windows prepared (where a statistic needs them): compress_model tokenizes only what it reads
        with compress_model(lm, run, worker.selected, run.config.model, worker.calib_windows, cache=True,
                            merge=merge, solve_device=worker.solve_device) as done:
            seconds = time.perf_counter() - t0
            written = done.save(out, overwrite)
    if said:
        from acbench.core.io import cache_dir

        kept = write_kept_lines(cache_dir() / "logs", said, prefix="compress-")
        log(f"{len(said)} line(s) other libraries printed kept in {kept} (--quiet)")
    return {**written, "dense_bytes": dense_bytes, "seconds": seconds, "provenance": done.provenance}


def in_memory_statistics(lm, groups, cspec: CalibSpec, needed, windows, stats_memory, batch_size,
                         progress) -> Calibration:
    """Statistics held in memory (a model without a fingerprint, or a call that keeps no cache): calibrated in as
    many passes as `stats_memory` asks and rounded as the cache stores them, so they equal what a cached run
    reads."""
    t0 = time.perf_counter()
    chunks = calibration_chunks(groups, needed, cspec.pair_tokens, stats_memory or default_stats_memory())
    held = {}
    for _, stats in calibrated_passes(lm.model, chunks, windows, needed, cspec, batch_size, progress):
        held.update({name: from_stored(to_stored(s)) for name, s in stats.items()})
    info = {"spec": cspec.as_dict(), "stats": sorted(needed), "cache": None, "base": None,
            "n_tokens": int(windows.numel()), "seconds": time.perf_counter() - t0, "cached": False,
            "passes": len(chunks), "groups_calibrated": len(groups)}
    return Calibration(held, info)


def _statistics(lm, run: Run, selected, spec: CalibSpec, needed, windows, cache: bool,
                limit: int | None) -> Calibration | None:
    """The `needed` statistics of the selected groups under `spec`: read from (or calibrated into) the cache by
    content where asked and the model has a fingerprint, else held in memory; None where nothing is needed."""
    if not needed:
        return None
    if windows is None:
        windows = calibration_windows(lm.tokenizer, spec)
    c = run.config
    if cache and lm.fingerprint:
        load = lambda: load_or_calibrate(lm, selected, spec, needed, run.stats_memory, c.batch_size, c.progress,
                                         windows, limit)
    else:
        load = lambda: in_memory_statistics(lm, selected, spec, needed, windows, run.stats_memory, c.batch_size,
                                            c.progress)
    return with_calibration_peak(str(next(lm.model.parameters()).device), load)


def compress_model(lm, run: Run, selected, given: str, windows: torch.Tensor | None = None, cache: bool = False,
                   limit: int | None = None, merge: bool = False, solve_device: str | None = None) -> Compressed:
    """The one calibrate-then-compress of a one-variant run: `bench compress` and `acbench.compress` both come
    here. The method is calibrated as the run decided (`Run.calibration_of`): from the run's shared calibration,
    one of its own (its authors' sizes), block by block as it is compressed (sequential), or not at all; an
    allocation rule reads the shared one. `windows`: the run's calibration windows where the caller holds them
    (tokens it was given, or the CLI's prepared ones); `given`: the model as the caller named it."""
    (method,), rule = run.methods, run.allocate[0]
    plan = run.calibration_of(method)
    shared = _statistics(lm, run, selected, run.calibration, run.stats_needs(), windows, cache, limit)
    own = _statistics(lm, run, selected, plan.spec, plan.needs, None, cache, limit) \
        if plan.kind == OWN_CALIBRATION else None
    if plan.kind == SEQUENTIAL_CALIBRATION:  # its windows: the run's, unless its spec draws others
        same = plan.spec.windows_key == run.calibration.windows_key and windows is not None
        windows = windows if same else calibration_windows(lm.tokenizer, plan.spec)
    else:
        windows = None
    solve_device = solve_device or solve_device_for(run.config, lm.model)
    budget = (run.ranks + run.patterns)[0]
    shared_stats = shared.stats if shared else {}
    alloc = variant_allocation(run, rule, budget, selected, shared_stats, solve_device)
    calibrated = own or shared
    source_model = {"given": given, "name": lm.name, "fingerprint": lm.fingerprint}
    return compress_variant(run, lm.model, lm.tokenizer, source_model, selected,
                            calibrated.stats if calibrated else {}, calibrated.record if calibrated else None,
                            merge, alloc, solve_device, windows)
