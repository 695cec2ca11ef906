"""Analyses: studies that run on calibration statistics and the harness's compress step (rho is one), found
by the registry like methods and tasks (`acbench.analyses` entry points for plugins elsewhere)."""

from __future__ import annotations

from core.errors import UserError
from core.registry import Registry, UnknownName

from .base import Analysis

__all__ = ["Analysis", "REGISTRY", "get_analysis", "known_analyses", "build", "run_sweep", "UnknownName"]

REGISTRY = Registry("analysis", __name__, Analysis, "acbench.analyses")


known_analyses = REGISTRY.names
get_analysis = REGISTRY.get


def build(names, options: dict | None = None) -> dict[str, Analysis]:
    """The analyses among `names` (the rest are tasks), each with its `--analysis-option` settings."""
    options = options or {}
    for name in options:
        if name not in REGISTRY:
            get_analysis(name)  # did-you-mean for an option aimed at no analysis
    out = {}
    for name in names:
        if name in REGISTRY:
            try:
                out[name] = get_analysis(name).from_options(options.get(name))
            except (ValueError, TypeError) as e:
                raise UserError(f"analysis options for '{name}': {e}") from None
    return out


def run_sweep(spec) -> dict:
    """`bench run`: the harness's sweep with the analyses among spec.tasks resolved from this registry (the
    harness runs them but never imports them)."""
    from bench.runner import run

    return run(spec, build(spec.tasks, spec.analysis_options))
