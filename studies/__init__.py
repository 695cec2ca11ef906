"""Studies: experiments that drive whole sweeps, one module or folder each, above the harness.

A study calls bench as the CLI does (RunConfig -> resolve_run -> prepare -> execute) and reads back the cells it
stored; nothing in core, methods, tasks, leaderboard, analyses or bench imports a study.

- `emergence/`: knowledge emergence over training checkpoints, with its leaderboard section; its command,
  `bench emerge`, plugs into the CLI through the `acbench.commands` entry point (`emergence/command.py`).
- `nm_sparsity.py`: the N:M activation-sparsity study's tables and paired claims, from stored cells.
- `solve_precision.py`: float32 against float64 solves on the default model's real statistics.
- `solve_8b_group.py`: one Llama-3-8B-shaped group solved on a GPU against the host (benchmarks/gpu_check.sh).
- `large_model_memory.py`: calibrating Llama-3-8B shapes in bounded memory.
- `tinyllama_shaped.py`: a random-weight TinyLlama-1.1B-shaped checkpoint for the 1B proof.
- `architectures.py`: the coverage table of every transformers decoder type (`make architectures`).
- `claims.py`: the FASC paper's knowledge claim on both embedded models at three ranks (`make claims`).
- `baselines.py`: the 2025 baselines against the older methods at matched compute.
- `calibration.py`, `reproductions.py`, `objectives.py`: how much calibration each method needs, every published
  ordering in its paper's protocol where acbench can run it, and each method against its own objective on held-out tokens.

Each script runs as `python -m acbench.studies.<name>`; figures the README shows are in `studies/figures/`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path


class StudyParser(argparse.ArgumentParser):
    """A study's flags: a bad one is one line and exit 2 (not argparse's usage block before it)."""

    def error(self, message):
        import sys

        sys.stderr.write(f"{self.prog}: error: {' '.join(str(message).split())} (see {self.prog} --help)\n")
        sys.exit(2)


def output_problem(path, what: str, folder: bool = False) -> str | None:
    """Why a study could not write `path` (a page or file it writes, or with `folder` a folder it fills), or None:
    checked before any compute, so that an hour's sweep never ends in "cannot write"."""
    from acbench.core.io import unwritable

    p = Path(path).expanduser()
    if not folder and p.is_dir():
        return f"{what} {path} is a folder: pass the file to write"
    if folder and p.exists() and not p.is_dir():
        return f"{what} {path} is a file: pass a folder"
    why = unwritable(p if folder else p.parent)
    return f"{what} {path} cannot be written ({why}): pass a writable path" if why else None


def thread_counts(cells) -> str:
    """The thread counts `cells` ran on, as "2" or "1 or 2" (parts run side by side, pinned to a core each, store
    cells of one thread beside those of two), "?" where no cell says."""
    found = sorted({str(c.env["cpu_threads"]) for c in cells if c.env and c.env.get("cpu_threads") is not None})
    return " or ".join(found) or "?"


def refuse_unwritable(ap, doc, folders: dict | None = None) -> None:
    """A study's --doc must be a markdown file it can write, and each of `folders` ({flag: path}, the cells it
    fills) a folder it can write: else ap.error's one line, before any compute."""
    if not str(doc).endswith(".md"):
        ap.error(f"--doc {str(doc)!r}: give a markdown file (.md)")
    problems = [output_problem(doc, "--doc")] + [output_problem(path, what, folder=True)
                                                 for what, path in (folders or {}).items()]
    problem = next((p for p in problems if p), None)
    if problem:
        ap.error(problem)


def refuse_bad_models(ap, models) -> None:
    """Every --models name checked from its name before any part is computed (a study computes model by model:
    a bad second name must not wait for the first model's hour): else ap.error's one line naming it."""
    from acbench.model.sources import model_name_problem

    if not models:
        ap.error("--models is empty: name at least one model (an alias, a .gguf file or a checkpoint folder)")
    if len(set(models)) != len(models):
        ap.error("--models names a model twice: give each once")
    problem = next((p for p in map(model_name_problem, models) if p), None)
    if problem:
        ap.error(f"--models: {problem}")


def recorded_fallbacks(cell) -> list[dict]:
    """The fallbacks a cell's compression record lists (entries that are not records skipped)."""
    return [f for f in ((cell.compression or {}).get("fallbacks") or []) if isinstance(f, dict)]


def ranks_clipped_to_one(cell) -> list[str]:
    """The groups a cell's allocation clipped to rank 1 (all but removed), each with the rank its rule asked for."""
    return sorted({f"{f['group']} (k {f['k']})" for f in recorded_fallbacks(cell)
                   if f.get("clipped_to") == 1 and f.get("group")})


def budget_label(cell) -> str:
    """A cell's budget as the studies' pages name it: "params 0.8", "rank 0.9", "density 0.5" or "2:4" ("" for
    dense)."""
    if cell.cell.method == "dense":
        return ""
    if ":" in cell.cell.budget:
        return cell.cell.budget
    return f"{'density' if cell.cell.budget == 'unstructured' else cell.cell.budget} {cell.cell.rank:g}"


@dataclass(frozen=True)
class Side:
    method: str
    budget: str  # "density 0.5", "2:4", "params 0.8", "rank 0.75"
    allocation: str = "uniform"  # the rule that splits the budget across groups (greedy: TEAL's)

    @property
    def label(self) -> str:
        return f"{self.method} ({self.budget}{'' if self.allocation == 'uniform' else ', ' + self.allocation})"

    def sweep_budget(self) -> dict:
        kind, _, value = self.budget.partition(" ")
        if ":" in kind:
            return {"sparsity": [kind]}
        if kind == "density":
            return {"sparsity": [value]}
        return {"rank": [float(value)], "budget": kind}


def find(cells: list, model: str, side: Side, task: str, options: dict | None = None):
    """The cell of `side` on `task`, evaluated with `options` (task settings it must hold: a setting given as None
    must be absent or null), or None; of several (a method measured again, e.g. at its authors' calibration once
    it declared one), the latest."""
    found = [c for c in cells if c.cell.model == model and c.cell.method == side.method and c.cell.task == task
             and budget_label(c) == side.budget and (c.cell.allocation or "uniform") == side.allocation
             and all((c.task_config or {}).get(k) == v for k, v in (options or {}).items())]
    return max(found, key=lambda c: str((c.env or {}).get("date", "")), default=None)
