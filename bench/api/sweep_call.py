"""`acbench.sweep` (what `bench run` does, its flags as keywords) and the results: `load_results` and `to_frame`,
one pandas DataFrame of stored or returned cells."""

from __future__ import annotations
import os
from collections.abc import Mapping
from contextlib import contextmanager
from pathlib import Path
import torch

from acbench.core.errors import UserError
from acbench.core.log import say
from acbench.model.sources import DEFAULT_MODEL, LoadedModel
from acbench.runner.cells import ModelInfo, plan
from acbench.runner.config import DEFAULT_TASKS, RunConfig
from acbench.runner.run_checks import check_config_types
from acbench.runner.resolve import resolve_run
from acbench.runner.shortcuts import shortcut_options, task_shortcuts
from acbench.runner.one_variant import Compressed
from acbench.api.caller_state import keeps_caller_state
from acbench.api.catalogue import cache_bound
from acbench.api.evaluate_call import _with_shortcuts


_FLAG_NAMES = {"rank": "ranks", "method": "methods", "task": "tasks"}


def check_sweep_tasks(config: RunConfig) -> None:
    """A sweep scores at least one task, and a study is named as its own command: `bench run` and `sweep` alike."""
    from acbench.results.plugged import plugged_commands

    if isinstance(config.tasks, (list, tuple)) and not config.tasks:
        raise UserError("--tasks is empty: pass task names (see `bench ls tasks`), e.g. --tasks lama ppl-token")
    for name in config.tasks:  # a study named as a task gets its own command named, not a did-you-mean over tasks
        if isinstance(name, str) and name in plugged_commands():
            raise UserError(f"{name} is not a task of bench run: it is a study with its own command, `bench {name}`")


def sweep_configs(models, keywords: dict) -> list[RunConfig]:
    """One RunConfig per model from `sweep`'s keywords: RunConfig's fields or the flags' names (`rank` for
    --rank), and the task shortcuts (`lama_limit`)."""
    fields_ = RunConfig.field_names()
    data, shortcuts = {}, {}
    known = {flag.lstrip("-").replace("-", "_") for flag in task_shortcuts()}
    by_dest: dict[str, str] = {}
    for key, value in keywords.items():
        dest = _FLAG_NAMES.get(key, key)
        if dest in by_dest:  # rank= and ranks= are one setting: the last would win in silence
            raise UserError(f"sweep: {by_dest[dest]}= and {key}= are the same setting: give it once")
        by_dest[dest] = key
        if dest in fields_ and dest != "model":
            data[dest] = value
        elif key in known:
            shortcuts[key] = value
        else:
            raise UserError(f"unknown sweep setting {key}=: use bench run's flags in snake_case (rank=, methods=, "
                            f"calib_source=, lama_limit=...)")
    for dest in ("methods", "tasks", "ranks", "allocate", "groups", "sparsity"):
        if isinstance(data.get(dest), (str, int, float)) and not isinstance(data.get(dest), bool):
            data[dest] = [data[dest]]  # one value where the flag takes several
    if isinstance(data.get("sparsity"), list):  # densities as numbers, as compress(sparsity=0.5) takes them
        data["sparsity"] = [str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v
                            for v in data["sparsity"]]
    options = _with_shortcuts(shortcut_options(shortcuts, data.get("tasks", list(DEFAULT_TASKS))),
                              data.pop("task_options", None))
    models = [models] if isinstance(models, (str, Path, torch.nn.Module, LoadedModel, Compressed)) else list(models)
    models = [_sweep_source(m) for m in models]
    if not models:
        raise UserError("model=[] names no model: pass one or more models")
    configs = []
    for m in models:
        config = RunConfig(model=str(m), task_options=options, **data)
        check_config_types(config)
        check_sweep_tasks(config)
        configs.append(config)
    return configs


def _sweep_source(model):
    """What a sweep opens for `model`: a name or path as given; a model `load_model` returned, by its source (the
    sweep opens it again, as bench run does), unless it is compressed now (its cells would not be its source's)."""
    if isinstance(model, Compressed):
        raise UserError("sweep(model=...) got a compressed model: sweep the model it came from (load_model's result, "
                        "after .restore()), or save it (.save(folder)) and evaluate that with acbench.evaluate")
    if isinstance(model, LoadedModel):
        from acbench.deploy.compression import is_deployed

        if is_deployed(model.model):
            raise UserError("sweep(model=...) got a model compressed in place: .restore() the handle compress "
                            "returned first, so the sweep starts from the model as loaded")
        if model.given is None:
            raise UserError("sweep(model=...) got a model built in memory: save it with save_pretrained (and its "
                            "tokenizer) and pass the folder")
        return model.given
    if isinstance(model, torch.nn.Module):
        raise UserError("sweep(model=...) takes load_model's result, a model name or a checkpoint folder: for a "
                        "model you built yourself, save it with save_pretrained (and its tokenizer) and pass the folder")
    return model


@contextmanager
def _statistics_cache_for(cache, cache_limit):
    """A sweep's statistics: with `cache`, kept in the shared cache under its bound (the bound given to the runner
    for this call); without, in a temporary folder removed afterwards. The environment is restored by the caller's
    kept_state."""
    import tempfile

    bound = cache_bound(cache, cache_limit)
    if cache:
        os.environ["ACBENCH_STATS_CACHE_LIMIT"] = str(bound)
        yield
        return
    with tempfile.TemporaryDirectory(prefix="acbench-stats-") as tmp:
        os.environ["ACBENCH_STATS_CACHE"] = tmp
        yield


@keeps_caller_state
def sweep(model=DEFAULT_MODEL, **keywords) -> list[dict]:
    """What `bench run` does, with its flags as keywords (`methods=["pca", "fasc-kfac"], rank=[0.5],
    lama_limit=5, output="results"`): the missing cells computed and stored under `output`, the leaderboard
    written there (unless report=False). Without `output` nothing is kept: the cells are computed in a temporary
    folder, returned, and the folder removed (no leaderboard). `model`: one model or a list (one results folder
    each, pooled in the report). Returns every cell the sweep asks for, as stored (with `output`, a rerun computes
    only what is missing and returns them all). `model` may also be what `load_model` returned (opened again from
    its source). The calibration statistics are computed for the call and removed after it, unless `cache=True`
    keeps them in the shared cache (`cache_limit` as in `compress`)."""
    cache, cache_limit = keywords.pop("cache", False), keywords.pop("cache_limit", None)
    if "output" not in keywords:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="acbench-sweep-") as tmp:
            return sweep(model, **{**keywords, "output": tmp, "report": keywords.get("report", False),
                                   "cache": cache, "cache_limit": cache_limit})
    configs = sweep_configs(model, keywords)
    if any(c.executor != "local" for c in configs):
        raise UserError("executor= other than local: run a Ray sweep with `bench run --executor ray`")
    with _statistics_cache_for(cache, cache_limit):
        prepared = run_configs(configs)
    return [cell for p in prepared for cell in stored_cells(p)]


def run_configs(configs: list[RunConfig]) -> list:
    """`bench run` on this machine for checked configs (one per model): every model's settings resolved before
    any model opens, the sweep computed, the leaderboard written unless report is off. Returns each model's
    Prepared (its plan and `outcome`)."""
    from acbench.runner.execute import STAGE_LOG, sweep_runs, third_party_kept, write_kept_lines

    runs = [resolve_run(c) for c in configs]
    with third_party_kept(not configs[0].progress) as said:  # --quiet: other libraries' lines kept, not shown
        prepared = sweep_runs(runs)
    if said:
        kept = write_kept_lines(Path(configs[0].output) / STAGE_LOG, said)
        say(f"{len(said)} line(s) other libraries printed kept in {kept} (--quiet)")
    if configs[0].report:
        say(f"leaderboard: {write_leaderboard(configs[0].output, configs[0].margin)}")
    return prepared


def stored_cells(prepared) -> list[dict]:
    """The stored record of every cell a prepared run asks for (computed now or before), as written."""
    import json

    src = prepared.source
    wanted = plan(prepared.run, ModelInfo(src.name, src.fingerprint, prepared.run.n_blocks), overwrite=True)
    return [json.loads(c.path.read_text(encoding="utf-8")) for c in wanted if c.path.exists()]


def write_leaderboard(folder: str | Path, margins: dict | None = None) -> Path:
    """The markdown leaderboard of every cell under `folder` (as `bench report` writes it); `margins` ({task:
    margin}) override the tasks' default equivalence margins."""
    from acbench.leaderboard.report import write_report

    from acbench.results.leaderboard_display import report_display

    return Path(write_report(str(folder), display=report_display(margins)))


def to_frame(results, model: str | None = None, method: str | None = None):
    """What `evaluate` or `sweep` returned as the DataFrame `load_results` gives: one row per (cell or task) and
    metric, in load_results' columns. `sweep`'s cells fill every column; `evaluate`'s {task: result} fills the task,
    metric, value, stderr, direction and item count, with `model` and `method` as given (the rest empty)."""
    import pandas as pd

    from acbench.core.record import CellRecord
    from acbench.leaderboard.frame import COLUMNS, results_frame
    from acbench.tasks.base import TaskResult

    for what, value in (("model", model), ("method", method)):
        if value is not None and not (isinstance(value, str) and value.strip()):
            raise UserError(f"to_frame: {what}={value!r}: pass the {what}'s name as a string (it fills the frame's "
                            f"{what} column for evaluate's results), or leave it out")
    if isinstance(results, list) and all(isinstance(c, (Mapping, CellRecord)) for c in results):
        try:
            cells = [c if isinstance(c, CellRecord) else CellRecord.from_json(dict(c)) for c in results]
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise UserError(f"to_frame: a cell sweep returned does not read as one ({e})") from None
        return results_frame(cells)
    if isinstance(results, Mapping) and all(isinstance(r, TaskResult) for r in results.values()):
        rows = []
        for task, r in results.items():
            primary = r.primary_metric or getattr(_task_class(task), "primary_metric", "")
            higher = {**getattr(_task_class(task), "higher_is_better", {}), **r.higher_is_better}
            for name, value in r.metrics.items():
                rows.append({"model": model, "method": method, "task": task, "kind": "task", "metric": name,
                             "value": value, "stderr": r.stderr.get(name), "primary": name == primary,
                             "higher_is_better": higher.get(name), "n_items": len(r.records)})
        return pd.DataFrame(rows, columns=list(COLUMNS))
    raise UserError(f"to_frame takes what sweep returned (a list of cells) or what evaluate returned ({{task: "
                    f"result}}), not {type(results).__name__}")


def _task_class(name: str):
    from acbench import tasks as registry

    return registry.get_task(name) if name in registry.known_tasks() else None


def load_results(*folders: str | Path):
    """Every stored cell under the folders as one pandas DataFrame: one row per cell and metric, with the cell's
    coordinates (model, method, budget, rank, allocation, scope, task), its settings key, the metric's value and
    stderr, the compression ratios and the cell's file. Cells the leaderboard would skip (unreadable, invalid,
    superseded) are left out the same way, and the DataFrame's `attrs["problems"]` names them."""
    from acbench.leaderboard.frame import results_frame
    from acbench.leaderboard.load import read_result_set as load_cells

    from acbench.leaderboard.load import results_folder_problem

    if not folders:
        raise UserError("load_results() names no folder: pass the output folder of a run, e.g. "
                        "load_results('results')")
    for f in folders:
        problem = results_folder_problem(f)
        if problem:
            raise UserError(problem + ": pass the output folder of a run (default results)")
    rs = load_cells(*folders)
    frame = results_frame(rs.cells)
    frame.attrs["problems"] = list(rs.problems) + list(rs.superseded)
    return frame
