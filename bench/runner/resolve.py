"""The boundary: what was typed (a RunConfig) checked and resolved once into a frozen Run (the checks in
run_checks.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from acbench import tasks as task_registry
from acbench.core.errors import UserError
from acbench.core.stats import RankSpec
from acbench.core.units import parse_bytes
from acbench.tasks.base import RunShared, Task
from acbench.runner.selection import Selection
from acbench.runner.config import Run, RunConfig
from acbench.runner.run_checks import (check_allocation, check_budgets_used, check_calibration, check_config_types,
                                       check_execution, check_methods, check_options_used, check_rank_flags_used,
                                       check_settings_used, check_task_names, check_until_decided_reference,
                                       resolve_budgets)


def build_tasks(config: RunConfig, analyses: Mapping) -> dict[str, Task]:
    """The run's model tasks; every --task-option block is checked, also of a task this run does not run (that each
    is a mapping, `check_option_blocks` made sure)."""
    shared = RunShared(seed=config.seed, batch_size=config.batch_size, bos=config.bos)
    built = {}
    for name in list(config.task_options) + [t for t in config.tasks if t not in analyses]:
        try:
            built[name] = task_registry.get_task(name).for_run(config.task_options.get(name), shared)
        except UserError:
            raise
        except (ValueError, TypeError) as e:  # the message names the task and its setting
            raise UserError(f"{e}: fix --task-option {name}.<setting> or its shortcut flag (`bench ls tasks`)") from None
    return {name: built[name] for name in config.tasks if name not in analyses}


def build_analyses(config: RunConfig) -> dict:
    """The names of config.tasks that are analyses, built with their --analysis-option settings; an unknown name
    gets one did-you-mean over every task and analysis (not only those asked for)."""
    from acbench import analyses as registry

    names = [n for n in config.tasks if isinstance(n, str)] if isinstance(config.tasks, (list, tuple)) else []
    check_task_names(names, set(registry.known_analyses()))
    return registry.build(names, config.analysis_options)


def resolve_run(config: RunConfig, writes: bool = True) -> Run:
    """Every user error is found here, before the model loads: one line, and the fix. The analyses among
    config.tasks are built here too. `writes`: the run writes results (False for `bench plan`, which only reads the
    model's config)."""
    check_config_types(config)
    analyses = build_analyses(config)
    names, ranks, patterns = resolve_budgets(config)
    check_methods(config, names)
    check_budgets_used(config, names, analyses)
    selection = Selection.from_flags(config.groups, config.blocks)
    check_allocation(config, names)
    check_calibration(config, names)
    check_rank_flags_used(config, names, analyses)
    model_tasks = build_tasks(config, analyses)
    check_options_used(config, names, analyses)
    check_execution(config, writes)
    from acbench.results.leaderboard_display import check_margins

    margins = check_margins(config.margin, "--margin")
    check_settings_used(config, model_tasks, margins)
    if config.until_decided:
        check_until_decided_reference(config, names)
    run = Run(config=config, methods=names,
              ranks=tuple(RankSpec(r, config.budget, config.rank_align) for r in ranks), patterns=tuple(patterns),
              allocate=tuple(dict.fromkeys(config.allocate)), selection=selection, bos=config.bos, tasks=model_tasks,
              analyses=analyses, stats_memory=parse_bytes(config.stats_memory) if config.stats_memory else None)
    # each task as the run sizes it: Run.task, the one place --until-decided is applied
    return replace(run, tasks={name: run.task(name) for name in model_tasks}) if config.until_decided else run
