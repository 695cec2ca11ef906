"""Analyses: what a sweep runs on its calibration statistics and compressions (rho is one), found by the registry
like methods and tasks (`acbench.analyses` entry points for plugins elsewhere). An analysis imports nothing of
bench: the sweep hands it an AnalysisContext (the model, the statistics, the groups and a compress step)."""

from __future__ import annotations

from acbench.core.errors import UserError
from acbench.core.registry import Registry, UnknownName

from .base import Analysis

__all__ = ["Analysis", "REGISTRY", "get_analysis", "known_analyses", "build", "UnknownName"]

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
