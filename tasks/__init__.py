"""Tasks: one module per task family, each a `Task` subclass, found by the registry (`bench ls tasks`).

A new module here is registered by being here; a task in another distribution registers through the
`acbench.tasks` entry-point group.
"""

from __future__ import annotations

from acbench.core.registry import Registry, UnknownName

from .base import Task, TaskResult

__all__ = ["Task", "TaskResult", "REGISTRY", "get_task", "known_tasks", "UnknownName"]

REGISTRY = Registry("task", __name__, Task, "acbench.tasks")


known_tasks = REGISTRY.names
get_task = REGISTRY.get
