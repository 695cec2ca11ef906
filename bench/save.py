"""`bench compress`'s pipeline: a one-variant run's model, statistics and allocation (as a sweep computes them),
compressed in place and written as a checkpoint (bench.checkpoint)."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from core.stats import RankSpec

from .checkpoint import MODELING_FILE, check_target, write_checkpoint
from .compress import compressed, compression_summary
from .execute import Worker, available_cpus, log, open_checked
from .measure import weight_bytes
from .selection import ALL


def save_compressed(run, out: Path, merge: bool = False, overwrite: bool = False) -> dict:
    """`bench compress`: open and check the model, calibrate (or read the statistics cache), compress with the
    run's one method at its one budget, and write the checkpoint. Returns what was written and measured."""
    check_target(out, overwrite)  # before anything loads
    torch.set_num_threads(run.config.threads or available_cpus())  # as a sweep's process sets them
    torch.manual_seed(run.config.seed)
    prepared = open_checked(run)
    check_target(out, overwrite, prepared.source.target)  # an alias's folder is known once the model is located
    run = prepared.run
    worker = Worker(run, prepared.source, prepared.calib_windows)
    lm = worker.model()
    dense_bytes = weight_bytes(lm.model)
    t0 = time.perf_counter()
    worker.statistics(every_group=False)
    (method,), budget, rule = run.methods, (run.ranks + run.patterns)[0], run.allocate[0]
    alloc = worker.allocation(rule, budget)
    opts = run.method_options(method)
    only = None if worker.scope == ALL else {g.name for g in worker.selected}
    with compressed(lm.model, method, budget, worker.stats, opts, only, run.config.progress, merge=merge,
                    solve_device=worker.solve_device, solve_dtype=run.config.solve_dtype,
                    **(alloc.compress_args() if alloc else {})) as (model, summaries):
        seconds = time.perf_counter() - t0
        summary = compression_summary(summaries, budget, method, opts, alloc.summary() if alloc else None,
                                      worker.scope, worker.solve_device, run.config.solve_dtype)
        label = f"{budget.budget} {budget.label}" if isinstance(budget, RankSpec) else f"sparsity {budget.label}"
        provenance = {
            "method": method, "budget": label + ("" if alloc is None else f", {rule} allocation"), "form": "merged" if merge else "as solved",
            "source_model": {"given": run.config.model, "name": lm.name, "fingerprint": lm.fingerprint},
            "calibration": worker.calib_info if run.uses_stats(method, rule) else None, "bos": run.bos,
            "seed": run.config.seed, "compression": summary}
        log(f"writing {out}/")
        written = write_checkpoint(model, lm.tokenizer, out, provenance, overwrite)
    return {**written, "dense_bytes": dense_bytes, "seconds": seconds, "provenance": provenance,
            "custom_code": MODELING_FILE in written["files"]}
