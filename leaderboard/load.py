"""Read a results tree: parse, check the schema, deduplicate cells, and report what is unreadable."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from acbench.core.record import SCHEMA_VERSION as SUPPORTED_SCHEMA  # noqa: F401 (the result schema this reader reads)
from acbench.core.record import ONE_PASS, CellRecord, calibration_mode, place_problem

DENSE = "dense"
OWN_OUTPUTS = {"LEADERBOARD.json"}


@dataclass
class ResultSet:
    cells: list[CellRecord] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # one line per skipped file
    duplicates: int = 0  # the same cell (settings key included) stored more than once
    # cells at the same coordinates (model, method, rank, task) as a shown one but with other settings
    superseded: list[str] = field(default_factory=list)


def cell_id(rec: CellRecord) -> tuple:
    return rec.cell.identity(rec.model_hash)


def coordinates(rec: CellRecord) -> tuple:
    """Where a cell goes in a table: its identity without the settings key, and its calibration mode where that
    is sequential (a row of its own beside the one-pass row)."""
    mode = calibration_mode(rec.calibration)
    return cell_id(rec)[:-1] + (() if mode == ONE_PASS else (mode,))


def cell_date(rec: CellRecord) -> str:
    """The cell's date for ordering; a missing or non-text date (a hand-edited cell) sorts as the oldest."""
    date = (rec.env or {}).get("date", "") if isinstance(rec.env, dict) else ""
    return date if isinstance(date, str) else ""


def results_folder_problem(root) -> str | None:
    """Why `root` cannot be read as a results folder, or None (missing, or a file named as a file)."""
    from acbench.core.io import folder_problem as problem

    return problem(root, "results folder")


def read_result_set(*roots, every_setting: bool = False) -> ResultSet:
    """Every *.json cell under the roots; several roots (runs, models) merge without double-counting:
    when one cell appears twice the most recent result wins. A table shows one cell per position (the newest
    settings); `every_setting` keeps the cells of every settings key instead (a study that reads one method in
    several protocols from one folder)."""
    rs = ResultSet()
    best: dict[tuple, dict] = {}
    for root in roots:
        for path in sorted(Path(root).rglob("*.json")):
            if any(part.startswith(".") for part in path.relative_to(root).parts):
                continue  # hidden files and folders (a run's stage log, claims) are not cells
            shown = f"{Path(root).name}/{path.relative_to(root)}"
            try:
                rec = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                rs.problems.append(f"{shown}: unreadable JSON ({type(e).__name__}), skipped")
                continue
            if isinstance(rec, list) and (path.name in OWN_OUTPUTS or path.with_suffix(".md").exists()):
                continue  # a leaderboard's own JSON table, written next to the results
            try:
                raw, rec = rec, CellRecord.from_json(rec)
            except (ValueError, TypeError) as e:
                rs.problems.append(f"{shown}: {e}, skipped")
                continue
            misplaced = place_problem(raw, path)
            if misplaced:  # e.g. a pca cell edited to say fasc: it is not shown as fasc's row
                rs.problems.append(f"{shown}: {misplaced}, skipped")
                continue
            rec.source = shown
            key = cell_id(rec)
            if key in best:
                rs.duplicates += 1
                if cell_date(rec) <= cell_date(best[key]):
                    continue
            best[key] = rec
    # One model per name: cells of two models filed under one name (an earlier version put checkpoints that share a
    # folder name together) are never shown as one model's; the newest model's are kept and the others named.
    newest: dict[str, CellRecord] = {}
    for rec in sorted(best.values(), key=cell_date, reverse=True):
        newest.setdefault(rec.cell.model, rec)
    for key, rec in list(best.items()):
        keep = newest[rec.cell.model]
        if rec.model_hash and keep.model_hash and rec.model_hash != keep.model_hash:
            rs.problems.append(f"{rec.source}: measured another model (weights {rec.model_hash[:8]}) than the newest "
                               f"cells filed as {rec.cell.model} ({keep.model_hash[:8]}), skipped: rerun that model, "
                               "and it gets a results folder of its own")
            del best[key]
    # One cell per table position: where settings differ (shots, calibration size, a method's version) the newest
    # is shown and the others are named, never merged.
    if every_setting:
        rs.cells = sorted(best.values(), key=lambda r: tuple(str(x) for x in cell_id(r)))
        return rs
    shown_at: dict[tuple, CellRecord] = {}
    for rec in sorted(best.values(), key=cell_date, reverse=True):
        at = coordinates(rec)
        if at in shown_at:
            rs.superseded.append(f"{rec.source} (settings {rec.cell.key}, {cell_date(rec)[:10] or 'undated'}) is not "
                                 f"shown: {shown_at[at].source} (settings {shown_at[at].cell.key}) is newer")
            continue
        shown_at[at] = rec
    rs.cells = sorted(shown_at.values(), key=lambda r: tuple(str(x) for x in cell_id(r)))
    rs.superseded.sort()
    return rs
