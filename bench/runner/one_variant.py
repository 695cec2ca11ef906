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
from acbench.runner.config import Run, solve_device_for
from acbench.results.store import available_cpus
from acbench.runner.execute import (Worker, deploy_one, log, open_checked, third_party_kept, variant_allocation,
                                  cell_calibration, write_kept_lines)


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
        (method,), rule, budget = run.methods, run.allocate[0], (run.ranks + run.patterns)[0]
        stats, calibration, windows = worker.statistics_for(method)
        record = calibration.record if calibration else None
        source_model = {"given": run.config.model, "name": lm.name, "fingerprint": lm.fingerprint}
        with compress_variant(run, lm.model, lm.tokenizer, source_model, worker.selected, stats, record, merge,
                              worker.allocation(rule, budget), worker.solve_device, windows) as done:
            seconds = time.perf_counter() - t0
            written = done.save(out, overwrite)
    if said:
        from acbench.core.io import cache_dir

        kept = write_kept_lines(cache_dir() / "logs", said, prefix="compress-")
        log(f"{len(said)} line(s) other libraries printed kept in {kept} (--quiet)")
    return {**written, "dense_bytes": dense_bytes, "seconds": seconds, "provenance": done.provenance}
