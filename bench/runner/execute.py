"""Computing planned cells: model -> calibrate -> compress -> evaluate -> store, one result file per cell.

`prepare(run)` opens the model without its weights, settles the BOS protocol, checks every data source and plans
the cells; `execute(cells, run, executor)` computes them. The local executor is a `Worker` in this process; the
Ray executor hands each worker process its share of the same `Cell`s.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from acbench.core.errors import UserError

from acbench.runner.cells import Cell
from acbench.runner.config import Run
from acbench.model.sources import ModelSource
from acbench.results.store import environment, model_identity, run_process_state
from acbench.runner.prepare import Prepared, log, prepare
from acbench.runner.worker import Worker


def execute(cells: list[Cell], run: Run, executor=None) -> dict:
    """Compute `cells` with `executor` (default: a Worker in this process): {"written", "seconds", "elsewhere",
    "failed"}."""
    return (executor or LocalExecutor())(cells, run)


def stage_table(stages: dict[str, float], total: float) -> str:
    """Where a run's wall time went: each stage's seconds and share, and what no stage accounts for."""
    from tabulate import tabulate

    rows = [[name, f"{sec:.1f}", f"{sec / total:.0%}" if total else ""] for name, sec in stages.items()]
    rest = total - sum(stages.values())
    rows += [["other (planning, cell files, reports)", f"{max(rest, 0.0):.1f}", f"{max(rest, 0.0) / total:.0%}"
              if total else ""], ["total", f"{total:.1f}", "100%"]]
    return "where the time went:\n" + tabulate(rows, headers=["stage", "seconds", "share"], tablefmt="github",
                                                disable_numparse=True)


STAGE_LOG = ".runs"  # hidden: the leaderboard reads cells, and skips what a dot hides


# the libraries whose log records and warnings reach a user's terminal during a run (lm-eval's notes on an
# in-memory model, transformers' kernel fallbacks); under --quiet they are kept in the run's log instead
THIRD_PARTY_LOGGERS = ("lm_eval", "transformers", "accelerate", "datasets", "huggingface_hub", "torch")


@contextmanager
def third_party_kept(enabled: bool):
    """While `enabled` (a --quiet run), what other libraries print is kept instead of shown: their log records,
    Python warnings, and what they write to stderr (lm-eval's own progress bars); yields the list of lines. acbench's
    own lines go to stdout through `log` and are not touched; a UserError still reaches the user (it is raised)."""
    import io
    import logging
    import sys
    import warnings

    kept: list[str] = []
    if not enabled:
        yield kept
        return

    class Keep(logging.Handler):
        def emit(self, record):
            kept.append(f"{record.name}: {record.getMessage()}")

    handler = Keep(level=logging.INFO)
    saved = []
    for name in THIRD_PARTY_LOGGERS:
        logger = logging.getLogger(name)
        saved.append((logger, logger.handlers[:], logger.propagate))
        logger.handlers, logger.propagate = [handler], False
    stderr, sys.stderr = sys.stderr, io.StringIO()
    try:
        with warnings.catch_warnings(record=True) as caught:  # the filters in force stay: what would show is kept
            yield kept
    finally:
        written = sys.stderr.getvalue()
        sys.stderr = stderr
        for logger, handlers, propagate in saved:
            logger.handlers, logger.propagate = handlers, propagate
        kept += [f"warning: {w.category.__name__}: {w.message}" for w in caught]
        # a progress bar redraws its line with carriage returns: its last state is what it said
        kept += [line.split("\r")[-1] for line in written.splitlines() if line.split("\r")[-1].strip()]


def write_kept_lines(folder: Path, lines: list[str], prefix: str = "") -> Path:
    """What other libraries said during a --quiet command, one line each, in `folder`: a run's beside its stage log
    (results/.runs/), bench compress's (no results folder) in the cache's logs/."""
    from acbench.core.io import atomic_write_text

    stamp = time.strftime("%Y-%m-%dT%H%M%SZ", time.gmtime())
    path = Path(folder) / f"{prefix}{stamp}-{os.getpid()}.log"
    atomic_write_text(path, "\n".join(lines) + "\n")
    return path


def write_stage_log(run: Run, stages: dict[str, float], total: float, written: int) -> Path:
    """The run's stage table as data (JSON, in results/.runs/<UTC time>-<pid>.stages), so a report of where a
    run's time went is rebuilt from what the run stored rather than copied from its log."""
    from acbench.core.io import atomic_write_json

    env = environment(run.config.device)
    stamp = env["date"].replace(":", "")
    path = Path(run.output) / STAGE_LOG / f"{stamp}-{os.getpid()}.stages"  # JSON, named apart from the cells
    atomic_write_json(path, {"schema": 1, "date": env["date"], "git_commit": env["git_commit"], "host": env["host"],
                             "cpu_threads": env["cpu_threads"], "cells_written": written, "seconds": total,
                             "stages": [[name, sec] for name, sec in stages.items()]})  # in the order they ran
    return path


@dataclass
class LocalExecutor:
    """The cells in this process, in plan order; the prepared model source and calibration windows are reused."""

    source: ModelSource | None = None
    calib_windows: torch.Tensor | None = None

    def __call__(self, cells: list[Cell], run: Run) -> dict:
        with run_process_state(run.config.threads, run.config.seed):  # the caller's threads and seeds put back
            return self._compute(cells, run)

    def _compute(self, cells: list[Cell], run: Run) -> dict:
        t0 = time.perf_counter()
        worker = Worker(run, self.source, self.calib_windows)
        written = worker.compute(cells)
        if worker.elsewhere:
            shown = ", ".join(str(p.relative_to(run.output)) for p in worker.elsewhere[:5])
            log(f"{len(worker.elsewhere)} cell(s) left to another run that is computing them now: {shown}"
                + (" ..." if len(worker.elsewhere) > 5 else ""))
        elapsed = time.perf_counter() - t0
        if written:
            log(stage_table(worker.stages, elapsed))
            write_stage_log(run, worker.stages, elapsed, written)
        log(f"done: {written} cell(s) written in {elapsed:.0f} s")
        return {"written": written, "seconds": elapsed, "output": str(run.output),
                "elsewhere": [str(p) for p in worker.elsewhere], "failed": []}


def prepare_models(runs: list[Run]) -> list[Prepared]:
    """Every model of a sweep opened, its weights checked against its config (and an acbench checkpoint's against
    its digests) and its cells planned, before any cell is computed; one model named twice (a path and a link to it,
    `X` and `X/`) is refused, and two models that share a folder name get a folder each."""
    prepared: list[Prepared] = []
    taken: dict[str, str] = {}
    for i, run in enumerate(runs):
        log(f"model {i + 1} of {len(runs)}: {run.config.model}")
        p = prepare(run, taken)
        ident = model_identity(p.source.fingerprint)
        twin = next((q for q in prepared if model_identity(q.source.fingerprint) == ident), None)
        if twin is not None:
            raise UserError(f"--model names one model twice: {twin.run.config.model} and {run.config.model} hold the "
                            "same weights (it would count twice in the pooled verdict): name it once")
        taken[p.source.name] = ident
        prepared.append(p)
    return prepared


def sweep_runs(runs: list[Run]) -> list[Prepared]:
    """`bench run` on this machine: with several models, every model opened and checked, and its cells planned,
    before any cell is computed (a model that cannot load stops the sweep before it starts); then each model's
    cells. Returns each model's Prepared with its `outcome` ({"written", "seconds", "elsewhere", "failed"})."""
    prepared = prepare_models(runs) if len(runs) > 1 else [prepare(runs[0])]
    for i, p in enumerate(prepared):
        if len(prepared) > 1:
            log(f"computing model {i + 1} of {len(prepared)}: {p.run.config.model}")
        p.outcome = execute(p.cells, p.run, LocalExecutor(p.source, p.calib_windows))
    return prepared


def sweep_models(runs: list[Run]) -> list[dict]:
    """Several models' sweep on this machine (`sweep_runs`): each model's outcome."""
    return [p.outcome for p in sweep_runs(runs)]
