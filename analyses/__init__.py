"""Analyses: studies that run on calibration statistics and the harness's compress step (rho is one), found
by the registry like methods and tasks (`acbench.analyses` entry points for plugins elsewhere)."""

from __future__ import annotations

from core.errors import UserError
from core.registry import Registry, UnknownName

from .base import Analysis

__all__ = ["Analysis", "REGISTRY", "get_analysis", "known_analyses", "build", "from_config", "UnknownName"]

REGISTRY = Registry("analysis", __name__, Analysis, "acbench.analyses", plural="analyses")


known_analyses = REGISTRY.names
get_analysis = REGISTRY.get


def build(names, options: dict | None = None) -> dict[str, Analysis]:
    """The analyses among `names` (the rest are tasks), each with its `--analysis-option` settings."""
    options = options or {}

    def make(name):
        try:
            return get_analysis(name).from_options(options.get(name))
        except (ValueError, TypeError) as e:
            raise UserError(f"analysis options for '{name}': {e}") from None

    for name in options:  # checked even when the analysis is not run this time: a typo is never silent
        make(name)
    return {name: make(name) for name in names if name in REGISTRY}


def from_config(config) -> dict[str, Analysis]:
    """The analyses among config.tasks, built with their options; an unknown name gets one did-you-mean over tasks
    and every analysis (not only those asked for)."""
    from bench.config import check_option_blocks, check_task_names

    check_option_blocks(config)
    names = [n for n in config.tasks if isinstance(n, str)] if isinstance(config.tasks, (list, tuple)) else []
    check_task_names(names, set(known_analyses()))
    for name in names:
        if name in REGISTRY and not get_analysis(name).runs_in_sweep:
            raise UserError(f"{name} is not a task of bench run: it has its own command, `bench {name}`")
    return build(names, config.analysis_options)
