"""Task adapters and their registry (`bench ls tasks`)."""

from __future__ import annotations

from .base import Task, TaskResult
from .lama import LAMA
from .lm_eval_bridge import LMEvalTask
from .mmlu import MMLU
from .perplexity import PPLToken, PPLWord

__all__ = ["Task", "TaskResult", "TASKS", "get_task", "ANALYSIS_TASKS"]

TASKS: dict[str, type[Task]] = {cls.name: cls for cls in (MMLU, LAMA, PPLToken, PPLWord, LMEvalTask)}
# Tasks computed by the runner from calibration statistics and group-wise compression, not on a model.
ANALYSIS_TASKS = {"rho": "Dependence Violation Score per group and its correlation with knowledge loss"}


class UnknownTask(KeyError):
    def __str__(self):
        return self.args[0]


def known_tasks() -> list[str]:
    return sorted(set(TASKS) | set(ANALYSIS_TASKS))


def get_task(name: str) -> type[Task]:
    if name not in TASKS:
        from core.errors import did_you_mean

        raise UnknownTask(f"unknown task '{name}'.{did_you_mean(name, known_tasks())}")
    return TASKS[name]


def check_task_names(names: list[str]) -> list[str]:
    for n in names:
        if n not in ANALYSIS_TASKS:
            get_task(n)
    return names
