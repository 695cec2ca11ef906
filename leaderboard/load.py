"""Read a results tree: parse, check the schema, deduplicate cells, and report what is unreadable."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from core.record import SCHEMA_VERSION as SUPPORTED_SCHEMA  # the result schema version this reader understands
from core.record import cell_problem

DENSE = "dense"
OWN_OUTPUTS = {"LEADERBOARD.json"}
RHO = "rho"


@dataclass
class ResultSet:
    cells: list[dict] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # one line per skipped file
    duplicates: int = 0


def cell_id(rec: dict) -> tuple:
    c = rec["cell"]
    model = (rec.get("model_fingerprint") or {}).get("sha256") or c["model"]
    return (c["model"], model, c["method"], c.get("budget", "rank"), c.get("rank"), c["task"])


def load_results(*roots) -> ResultSet:
    """Every *.json cell under the roots; several roots (runs, models) merge without double-counting:
    when one cell appears twice the most recent result wins."""
    rs = ResultSet()
    best: dict[tuple, dict] = {}
    for root in roots:
        for path in sorted(Path(root).rglob("*.json")):
            if path.name.startswith("."):
                continue
            shown = f"{Path(root).name}/{path.relative_to(root)}"
            try:
                rec = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                rs.problems.append(f"{shown}: unreadable JSON ({type(e).__name__}), skipped")
                continue
            if isinstance(rec, list) and (path.name in OWN_OUTPUTS or path.with_suffix(".md").exists()):
                continue  # a leaderboard's own JSON table, written next to the results
            problem = cell_problem(rec)
            if problem:
                rs.problems.append(f"{shown}: {problem}, skipped")
                continue
            rec["_path"] = str(path)
            key = cell_id(rec)
            if key in best:
                rs.duplicates += 1
                if (rec.get("env") or {}).get("date", "") <= (best[key].get("env") or {}).get("date", ""):
                    continue
            best[key] = rec
    rs.cells = sorted(best.values(), key=lambda r: tuple(str(x) for x in cell_id(r)))
    return rs
