"""`acbench.evaluate` (a model scored as a run's cells score it, whole or until decided) and `acbench.compare` (the
paired difference of two results, as the leaderboard tests it)."""

from __future__ import annotations
import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
import torch

from acbench.core.errors import UserError
from acbench.runner.config import RunConfig, until_decided_task
from acbench.runner.run_checks import check_config_types
from acbench.runner.resolve import resolve_run
from acbench.runner.shortcuts import merge_option_blocks, shortcut_options, task_shortcuts
from acbench.runner.until_decided import evaluate_until_decided
from acbench.runner.prepare import check_lengths
from acbench.api.caller_state import keeps_caller_state
from acbench.api.compress_call import _loaded


class _Scored:
    """What acbench.core.significance reads of a result: its per-item records and details."""

    def __init__(self, records, details):
        self.records, self.details = records, details


def _scored(result, task: str | None, what: str) -> tuple[_Scored, str | None, str | None, dict]:
    """(records holder, task name, primary metric, higher_is_better) of an evaluate result, a stored cell (as sweep
    returns it, or a CellRecord), or evaluate's whole {task: result} with `task` naming one."""
    from acbench.core.record import CellRecord
    from acbench.tasks.base import TaskResult

    if isinstance(result, Mapping) and "cell" in result:
        result = CellRecord.from_json(dict(result))
    if isinstance(result, Mapping):
        if task not in result:
            raise UserError(f"compare: {what} is evaluate's {{task: result}}: name one of its tasks with task= "
                            f"({', '.join(map(str, result)) or 'none'})")
        result = result[task]
    if isinstance(result, CellRecord):
        return (_Scored(result.records, result.details), result.cell.task, result.primary_metric,
                result.higher_is_better)
    if isinstance(result, TaskResult):
        return _Scored(result.records, result.details), task, result.primary_metric or None, result.higher_is_better
    raise UserError(f"compare: {what} is a {type(result).__name__}: pass what evaluate or sweep returned (a task's "
                    "result, evaluate's dict with task=, or a stored cell)")


def compare(reference, other, task: str | None = None, margin: float | None = None) -> dict:
    """The paired difference other - reference on the items both scored, as the leaderboard prints it: `diff`,
    `ci95` and `p` (a confidence sequence and no p for results evaluated until decided), `n`, `test`, the
    difference it had 80 % power to detect (`detectable`) and the `verdict` (better, worse, equivalent within
    `margin` (default: the task's own), undecided). `reference`, `other`: what evaluate returned (one task's
    result, or the whole dict with `task=`) or a cell sweep returned."""
    from acbench import tasks as registry

    from acbench.core.significance import compare as paired, record_scores, verdict

    a, name, metric, higher = _scored(reference, task, "reference")
    b, other_name, other_metric, _ = _scored(other, task, "other")
    name = name or other_name
    metric = metric or other_metric
    for side, held in (("reference", a), ("other", b)):
        scores = record_scores(held.records)
        if scores and not all(math.isfinite(v) for v in scores[1]):
            raise UserError(f"compare: the {side}'s records hold a score that is not a finite number: a broken "
                            "evaluation, not one to compare")
    d = paired(a, b)
    if d is None:
        raise UserError("compare: the two results did not score the same items in the same order (or keep no "
                        "per-item records): evaluate both with the same task settings")
    if margin is not None:  # checked as --margin checks it: a margin of 5 would call any two models equivalent
        margin = checked_margin(margin)
    if margin is None and name in registry.known_tasks():
        margin = registry.get_task(name).margin
    if name in registry.known_tasks() and (metric is None or metric not in higher):
        cls = registry.get_task(name)
        metric, higher = cls.primary_metric, cls.higher_is_better
    # per-window NLL is compared (perplexity's unit): lower is better whatever the metric shown
    kind = (record_scores(a.records) or ("", []))[0]
    direction = False if kind == "nll" else higher.get(metric) if metric else None
    return {**d, "verdict": verdict(d, margin, direction), "margin": margin}


def checked_margin(margin) -> float:
    """compare's margin: a number in (0, 1] (the range --margin takes), or one line naming the problem."""
    number = isinstance(margin, (int, float)) and not isinstance(margin, bool)
    if not (number and math.isfinite(margin) and 0 < margin <= 1):
        raise UserError(f"compare: margin={margin!r}: a margin is a number in (0, 1] in the task's comparison unit "
                        "(0.02: two points of accuracy, or 0.02 nats of mean NLL), or None for the task's own")
    return float(margin)


def _with_shortcuts(shortcuts: dict, task_options):
    """The task shortcuts' options with the explicit `task_options`; a setting given both ways with different values
    is refused, naming both (neither silently wins); `task_options` that are not {task: {setting: value}} are
    passed on for the run's checks to refuse in their words."""
    if task_options is None:
        return shortcuts
    if not isinstance(task_options, Mapping) or not all(isinstance(v, Mapping) for v in task_options.values()):
        return task_options
    return merge_option_blocks(("a task keyword (lama_limit= ...)", shortcuts),
                               ("task_options", {t: dict(v) for t, v in task_options.items()}))


def _task_config(tasks: Sequence[str], task_options: Mapping | None, settings: dict, **run) -> RunConfig:
    """A RunConfig with these tasks, their options, and the task shortcuts among `settings` (`lama_limit=5` as
    `--lama-limit 5`); an unknown keyword is one line naming the known ones."""
    known = {flag.lstrip("-").replace("-", "_") for flag in task_shortcuts()}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise UserError(f"unknown task setting {unknown[0]}=: use one of {', '.join(sorted(known))}, or "
                        "task_options={task: {setting: value}}")
    options = _with_shortcuts(shortcut_options(settings, list(tasks)), task_options)
    return RunConfig(tasks=list(tasks), task_options=options, methods=["dense"], **run)


@keeps_caller_state
def evaluate(model, tokenizer=None, tasks: Sequence[str] = ("lama", "ppl-token"), *, task_options=None,
             bos: str = "auto", seed: int = 0, batch_size: int = 4, progress: bool = True,
             until_decided: Mapping | bool | None = None, **settings) -> dict:
    """Score `model` (any transformers causal LM, compressed or not) on `tasks` as a run's cells score it:
    {task: TaskResult} with `.metrics`, `.stderr`, `.records` (per item, for paired tests) and `.config`.
    `**settings`: the task shortcuts of `bench run` (`lama_limit=`, `ppl_windows=`, `mmlu_shots=`...);
    `task_options`: {task: {setting: value}} as `--task-option` gives them. `until_decided`, as `bench run
    --until-decided` does it: True scores the reference model (the tasks that can stop early, e.g. lama, ppl-token,
    mmlu, on their whole budget in the seeded order a comparison draws); what such a call returned then makes each of
    those tasks stop as soon as its paired comparison with the reference is decided. A result's details say how far
    it went and why it stopped."""
    from acbench.tasks.data.text_data import resolve_bos

    lm = _loaded(model, tokenizer)
    if isinstance(tasks, str):  # "lama" or "lama,ppl-token", as --tasks takes them
        tasks = [t.strip() for t in tasks.split(",")]
    if isinstance(tasks, Sequence) and not tasks:
        raise UserError("tasks=[] names no task: pass task names (bench ls tasks), e.g. tasks=['lama', 'ppl-token']")
    config = _task_config(tasks, task_options, settings, model=lm.name, bos=bos, seed=seed, batch_size=batch_size,
                          measure_latency=False, report=False, progress=progress)
    check_config_types(config)
    run = resolve_run(config, writes=False)
    if run.analyses:
        raise UserError(f"{', '.join(run.analyses)} is an analysis of a sweep, not a task: run it with acbench.sweep")
    run = run.with_bos(resolve_bos(lm.tokenizer, run.bos))
    check_lengths(run, lm.model.config)
    references = _until_decided_references(until_decided, run) if until_decided is not None else {}
    out = {}
    for task in run.tasks.values():
        task.check(lm.tokenizer)
    for name, task in run.tasks.items():
        with torch.no_grad():
            if name in references:
                stoppable = until_decided_task(task, replace(config, until_decided=True, reference=EVALUATE_REFERENCE),
                                               {})
                out[name] = evaluate_until_decided(stoppable, lm.model, lm.tokenizer, references[name], progress)
            else:
                out[name] = task.evaluate(lm.model, lm.tokenizer, progress=progress)
    return out

# what an until-decided result of `evaluate` names as its reference (a sweep names the reference method)
EVALUATE_REFERENCE = "evaluate(until_decided=)"


def _until_decided_references(given, run) -> dict[str, list[dict]]:
    """{task: the reference's per-item records, or False for the reference itself (its whole budget)} for the
    tasks that can stop early; refused in one line where `given` is neither True nor what an until-decided
    evaluate returned, lacks such a task, or no task asked for can stop early."""
    from acbench.tasks.base import Task

    if given is not True and (not isinstance(given, Mapping) or not all(hasattr(r, "records")
                                                                        for r in given.values())):
        raise UserError(f"until_decided= takes True (the reference model) or what evaluate(..., until_decided=True) "
                        f"returned for it ({{task: result}}), not a {type(given).__name__}")
    stoppable = [name for name, task in run.tasks.items() if type(task).item_pool is not Task.item_pool]
    if not stoppable:
        raise UserError(f"until_decided=: none of {', '.join(run.tasks)} can stop early (a task that scores any "
                        "subset of its items can, e.g. lama, ppl-token, mmlu): evaluate them without it")
    if given is True:
        return dict.fromkeys(stoppable, False)
    missing = [name for name in stoppable if name not in given or "until_decided" not in given[name].details]
    if missing:
        raise UserError(f"until_decided= holds no until-decided result of {', '.join(missing)}: evaluate the "
                        f"reference model with until_decided=True on {', '.join(missing)} and pass what it returned")
    return {name: given[name].records for name in stoppable}
