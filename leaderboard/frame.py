"""Stored cells as one pandas DataFrame: one row per cell and metric, the cell's coordinates and settings as
columns (what people reach for after a sweep, beside the markdown leaderboard)."""

from __future__ import annotations

from acbench.core.record import CellRecord

COLUMNS = ("model", "method", "budget", "rank", "allocation", "scope", "task", "kind", "metric", "value", "stderr",
           "primary", "higher_is_better", "n_items", "param_ratio", "compute_ratio", "activation_ratio",
           "n_fallbacks", "calibration_source", "calibration_tokens", "seed", "bos", "key", "model_hash", "date",
           "file")


def cell_rows(rec: CellRecord) -> list[dict]:
    """One row per metric of a cell (a cell with no metric gives none)."""
    comp = rec.compression or {}
    calib = rec.calibration or {}
    spec = calib.get("spec") if isinstance(calib.get("spec"), dict) else {}
    common = {
        "model": rec.cell.model, "method": rec.cell.method, "budget": rec.cell.budget, "rank": rec.cell.rank,
        "allocation": rec.cell.allocation, "scope": rec.cell.scope, "task": rec.cell.task, "kind": rec.cell.kind,
        "n_items": len(rec.records), "param_ratio": comp.get("param_ratio"),
        "compute_ratio": comp.get("compute_ratio"), "activation_ratio": comp.get("activation_ratio"),
        "n_fallbacks": comp.get("n_fallbacks"), "calibration_source": spec.get("source"),
        "calibration_tokens": calib.get("n_tokens"), "seed": rec.seed, "bos": rec.bos, "key": rec.cell.key,
        "model_hash": getattr(rec, "model_hash", None), "date": (rec.env or {}).get("date"),
        "file": getattr(rec, "source", None)}
    return [{**common, "metric": name, "value": value, "stderr": rec.stderr.get(name),
             "primary": name == rec.primary_metric, "higher_is_better": rec.higher_is_better.get(name)}
            for name, value in rec.metrics.items()]


def results_frame(cells: list[CellRecord]):
    """The DataFrame of `cells` (acbench.leaderboard.load's validated records), with the columns of COLUMNS in order."""
    import pandas as pd

    rows = [row for rec in cells for row in cell_rows(rec)]
    return pd.DataFrame(rows, columns=list(COLUMNS))
