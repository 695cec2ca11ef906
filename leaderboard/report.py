"""`bench report`: markdown leaderboard (tabulate), CSV and JSON of the same tables, and PNG plots."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path


from acbench.core.io import atomic_write_text
from acbench.core.log import say

from .across_models import across_models_section
from .load import read_result_set

from .tables import (REFERENCE, Display, group_cells,
                     metric_columns, missing_cells)
from acbench.leaderboard.formatting import chance_note
from acbench.leaderboard.sections import (_header, across_ranks_section, analysis_sections, cross_family_section,
                                          frontier_section, rank_sections)


def write_tables(out_md: Path, md: list[str], flat_rows: list[dict]) -> None:
    """The markdown, and the same rows as CSV and JSON beside it."""
    atomic_write_text(out_md, "\n".join(md).rstrip() + "\n")
    # the row's place first (model, budget, ratio, scope, method), then its values by name
    lead = [k for k in ("model", "budget", "rank", "scope", "method") if any(k in r for r in flat_rows)]
    fields = lead + sorted({k for r in flat_rows for k in r} - set(lead))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields)
    w.writeheader()
    for r in flat_rows:
        w.writerow({k: r.get(k) for k in fields})
    atomic_write_text(out_md.with_suffix(".csv"), buf.getvalue())
    atomic_write_text(out_md.with_suffix(".json"), json.dumps(flat_rows, indent=2, default=str) + "\n")


DEFAULT_DISPLAY = Display()  # frozen: one instance serves every call


def build_report(results_dirs, out_md: Path, ref: str = REFERENCE, display: Display = DEFAULT_DISPLAY) -> dict:
    """Write the markdown, CSV, JSON and PNGs; return what was written and what was skipped."""
    from acbench.core.errors import UserError

    rs = read_result_set(*results_dirs)
    if not rs.cells:
        skipped = f" ({len(rs.problems)} unreadable or invalid file(s) skipped: {rs.problems[0]})" if rs.problems else ""
        raise UserError(f"no result cells under {', '.join(map(str, results_dirs))}{skipped}: run `bench run` first "
                        "or pass --results <dir with results>")
    methods = {c.cell.method for c in rs.cells}
    if ref != REFERENCE and ref not in methods:
        raise UserError(f"--vs {ref}: no cells of that method under {', '.join(map(str, results_dirs))}; the methods "
                        f"there: {', '.join(sorted(methods))}")
    grouped = group_cells(rs.cells)
    plot_dir = out_md.parent / "plots"
    md = ["# acbench leaderboard", ""]
    flat_rows, written = [], []
    for model in sorted(grouped):
        g = grouped[model]
        model_cells = g["dense"] + [c for per in g["ranks"].values() for cs in per.values() for c in cs]
        columns = metric_columns(model_cells, display)
        analysis_cells = [c for per in g["analyses"].values() for c in per.values()]
        md += [f"## {model}", ""] + _header(model_cells, analysis_cells) + chance_note(g["dense"], columns) + [""]
        lines, section_rows, cross = rank_sections(g, model, ref, columns, plot_dir, written, flat_rows,
                                                   display.margins)
        md += lines + across_ranks_section(g, cross, model, ref, columns, plot_dir, written)
        md += cross_family_section(g, section_rows, columns, model, ref, plot_dir, written,
                                   margins=display.margins)
        md += frontier_section(g, section_rows, columns, model, plot_dir, written)
        md += analysis_sections(g, model, display, plot_dir, written)
    md += across_models_section(grouped, ref, display, plot_dir, written, flat_rows)
    missing = missing_cells(grouped)
    if missing:
        md += ["## Missing cells", "", *[f"- {m}" for m in missing], ""]
    if rs.superseded:
        md += ["## Cells with other settings (not shown)", "", *[f"- {p}" for p in rs.superseded], ""]
    if rs.problems:
        md += ["## Skipped files", "", *[f"- {p}" for p in rs.problems], ""]
    write_tables(out_md, md, flat_rows)
    return {"markdown": out_md, "plots": written, "problems": rs.problems, "missing": missing,
            "duplicates": rs.duplicates}


EXPORT_SUFFIXES = (".csv", ".json")


def _is_own_output(path: Path) -> bool:
    """Whether an existing file is one a report wrote (by its content, not its name): the markdown's title, the
    JSON export's list of rows, the CSV export's header with the method column."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    if path.suffix == ".md":
        return text.startswith("# acbench leaderboard")
    if path.suffix == ".json":
        try:
            rows = json.loads(text)
        except ValueError:
            return False
        return isinstance(rows, list) and all(isinstance(r, dict) and "method" in r for r in rows)
    if not text.strip():
        return True  # a CSV export of no rows is its bare line end; an empty file holds nothing to lose
    first = text.split("\n", 1)[0]
    return "method" in next(csv.reader([first]), [])


def target_problem(out_md: Path, roots) -> str | None:
    """Why the report must not write to out_md (and its .csv / .json exports beside it), or None.

    The report never destroys what it reads: an export's suffix would be overwritten by that export within the same
    call; a path below a results tree's top sits among stored cells; an existing file the report did not write (a
    stored cell, a file of the user's) is never replaced."""
    if out_md.suffix.lower() != ".md":
        hint = out_md.with_suffix(".md")
        if out_md.suffix.lower() in EXPORT_SUFFIXES:
            return (f"the report writes its CSV and JSON exports beside the markdown, so a {out_md.suffix} path would "
                    f"be overwritten by its own export: pass the markdown path, e.g. --out {hint}")
        return f"the leaderboard is a markdown file: pass a path ending in .md, e.g. --out {hint}"
    here = out_md.resolve()
    for root in roots:
        top = Path(root).resolve()
        if here.parent != top and top in here.parents:
            return (f"it lies inside the results tree {root} among stored cells: write the leaderboard at the tree's "
                    f"top ({Path(root) / 'LEADERBOARD.md'}, the default) or outside it")
    for target in (out_md, out_md.with_suffix(".csv"), out_md.with_suffix(".json")):
        if target.is_dir():
            return f"{target} is a folder where the report writes a file: pass another --out"
        if target.exists() and not _is_own_output(target):
            return (f"{target} exists and is not a file an acbench report wrote (a stored cell or a file of yours), "
                    "and the report never writes over it: pass another --out")
    return None


def write_report(results, out: str | None = None, ref: str = REFERENCE, display: Display = DEFAULT_DISPLAY) -> Path:
    """Build the leaderboard from one results directory or several; return the markdown path."""
    from acbench.core.errors import UserError  # only for the error type users see

    roots = [Path(r) for r in ([results] if isinstance(results, (str, Path)) else results)]
    from .load import results_folder_problem

    for root in roots:
        problem = results_folder_problem(root)
        if problem:
            raise UserError(f"{problem}: run `bench run` first or pass --results DIR")
    out_md = Path(out) if out else roots[0] / "LEADERBOARD.md"
    if out_md.is_dir():
        raise UserError(f"--out {out_md} is a folder: pass the markdown file to write, e.g. {out_md / 'LEADERBOARD.md'}")
    problem = target_problem(out_md, roots)
    if problem:
        raise UserError(f"--out {out_md}: {problem}")
    try:
        info = build_report(roots, out_md, ref, display)
    except OSError as e:
        raise UserError(f"cannot write the leaderboard to {out_md} ({e.strerror or type(e).__name__}): pass "
                        "--out <path in a writable folder>") from None
    for p in info["problems"]:
        say(f"skipped: {p}")
    if info["duplicates"]:
        say(f"{info['duplicates']} cell(s) stored more than once: the most recent result of each was used")
    return out_md
