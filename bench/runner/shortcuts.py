"""The task shortcuts of `bench run` (`--lama-limit` and friends, generated from each task's declarations) and the
merging of option blocks given more than one way."""

from __future__ import annotations

from acbench import tasks as task_registry
from acbench.core.errors import UserError


def task_shortcuts() -> dict[str, list[tuple[str, object]]]:
    """{flag: [(task, Shortcut)]} over every registered task, plugins included."""
    from acbench import tasks

    out: dict[str, list] = {}
    for name in tasks.known_tasks():
        for sc in tasks.get_task(name).shortcuts:
            out.setdefault(sc.flag, []).append((name, sc))
    return out


def shortcut_dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def shortcut_options(values: dict, tasks=None) -> dict:
    """{task: {setting: value}} from shortcut values ({dest: value}); a flag several tasks share (--limit) first,
    so one task's own flag (--lama-limit) overrides it. `tasks`, the run's task names where known: a shared flag
    sets only the tasks the run scores, and one that sets none of them is refused (it would do nothing); a task's
    own flag is kept for `check_options_used` to name."""
    from acbench import analyses

    known = set(task_registry.known_tasks()) | set(analyses.known_analyses())
    run_tasks = set(tasks) if isinstance(tasks, (list, tuple)) and all(isinstance(t, str) for t in tasks) else None
    if run_tasks is not None and not run_tasks <= known:
        run_tasks = None  # an unknown task name is refused with its did-you-mean, before any setting is read
    if run_tasks is not None:  # an analysis sizes its probes from the run's tasks (rho: ppl-token, lama, mmlu)
        run_tasks |= {t for a in run_tasks & set(analyses.known_analyses()) for t in analyses.REGISTRY.get(a).uses_tasks}
    out: dict = {}
    for flag, uses in sorted(task_shortcuts().items(), key=lambda kv: -len(kv[1])):
        value = values.get(shortcut_dest(flag))
        if value is None:
            continue
        if run_tasks is not None and len(uses) > 1:
            kept = [(task, sc) for task, sc in uses if task in run_tasks]
            if not kept:
                raise UserError(f"{flag} sets {' and '.join(t for t, _ in uses)}, and this run scores neither "
                                f"({', '.join(sorted(run_tasks))}): add one to --tasks or leave {flag} out")
            uses = kept
        for task, sc in uses:
            out.setdefault(task, {})[sc.setting] = value
    return out


def merge_option_blocks(*labelled, overridden: list | None = None) -> dict:
    """{name: {setting: value}} blocks, each with where it came from ((label, block) pairs), merged into one, later
    blocks over earlier ones. A setting given twice with different values is refused naming both places, unless
    `overridden` is a list: then the later value wins (the command line over a config file) and the override is
    appended to it as one line, so that it is said, never silent. A block that is not a mapping is returned as it
    is, for `check_option_blocks` to name."""
    out: dict = {}
    where: dict = {}
    for label, block in labelled:
        if block is None:
            continue
        if not isinstance(block, dict):
            return block
        for name, opts in block.items():
            if not isinstance(opts, dict):  # of the wrong type: kept for check_option_blocks to name
                out[name] = opts
                continue
            if not isinstance(out.get(name, {}), dict):  # an earlier block's wrong type is never replaced unsaid
                continue
            mine = out.setdefault(name, {})
            for key, value in opts.items():
                if key in mine and mine[key] != value:
                    if overridden is None:
                        raise UserError(f"{name}.{key} is set twice, to {mine[key]!r} by {where[name, key]} and to "
                                        f"{value!r} by {label}: give it once")
                    overridden.append(f"{name}.{key} = {value!r} from {label} overrides {mine[key]!r} from "
                                      f"{where[name, key]}")
                mine[key] = value
                where[name, key] = label
    return out


def shortcut_flag(task: str, setting: str) -> str | None:
    """The flag of bench run that sets this one task's setting (--mmlu-format for mmlu.format), or None."""
    for flag, uses in task_shortcuts().items():
        if (task, setting) in [(t, sc.setting) for t, sc in uses]:
            return flag
    return None
