"""The result-cell schema: what a stored cell must hold to count as done, and to be shown in a leaderboard."""

from __future__ import annotations

import math

SCHEMA_VERSION = 1
CELL_KEYS = {"model": str, "method": str, "task": str, "budget": str}


def _finite_or_null(v) -> bool:
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v))


def cell_problem(rec) -> str | None:
    """None for a valid cell; otherwise what is wrong with it, in a few words."""
    if not isinstance(rec, dict):
        return "not a JSON object"
    if rec.get("schema_version") != SCHEMA_VERSION:
        return f"schema version {rec.get('schema_version')} (this version reads {SCHEMA_VERSION})"
    cell = rec.get("cell")
    if not isinstance(cell, dict):
        return "no cell identity (model, method, rank, task)"
    for key, kind in CELL_KEYS.items():
        if not isinstance(cell.get(key), kind):
            return f"cell.{key} missing or not a {kind.__name__}"
    rank = cell.get("rank")
    if not (rank is None or (_finite_or_null(rank) and 0 < rank <= 1)):
        return f"cell.rank {rank!r} is not a ratio in (0, 1]"
    metrics = rec.get("metrics")
    if not isinstance(metrics, dict) or not metrics:
        return "no metrics"
    bad = [k for k, v in metrics.items() if not _finite_or_null(v)]
    if bad:
        return f"metric {bad[0]} is not a finite number"
    if not isinstance(rec.get("stderr", {}), dict):
        return "stderr is not a mapping"
    pm = rec.get("primary_metric")
    if pm is not None and pm not in metrics:
        return f"primary metric {pm!r} is not among its metrics"
    return None
