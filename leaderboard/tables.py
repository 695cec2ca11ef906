"""Tables from result cells: per model and rank ratio, a dense row and one row per method."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from acbench.core.record import (ALL_GROUPS, DENSE, ONE_PASS, CellRecord, calibration_label, calibration_mode, describe_scope,
                         variant_name)
from acbench.core.stats import UNSTRUCTURED, is_sparsity_budget

from acbench.core.significance import ALPHA, above_chance, compare, verdict

REFERENCE = "pca"  # paired differences are taken against this row (the variance baseline), `bench report --vs`


@dataclass(frozen=True)
class Display:
    """How the installed plugins ask to be shown; the CLI builds it from the registries, so the leaderboard names
    no task or analysis. A task without a label is "<task> <primary metric>", placed after the labelled ones by
    name; an analysis without a section shows its metrics as a table."""

    labels: Mapping[str, str] = field(default_factory=dict)  # task -> column label
    order: Mapping[str, int] = field(default_factory=dict)  # task -> column position (lower first)
    # analysis -> (cell, plot_dir, file stem, title) -> (markdown lines, figures) or None
    sections: Mapping[str, Callable] = field(default_factory=dict)
    # task -> the margin within which a paired difference counts as equivalent, in the metric's own unit (nats of
    # mean NLL for perplexity); a task without one is never called equivalent
    margins: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Column:
    label: str
    task: str
    metric: str
    higher: bool | None  # None: the metric has no better direction (no "best" mark, no recovery)


def row_name(c: CellRecord) -> str:
    """A table row: the method, its rank allocation where that is not uniform ("fasc-kfac+fisher"), and its
    calibration mode where that is sequential ("sparsegpt (sequential)")."""
    mode = calibration_mode(c.calibration)
    return variant_name(c.cell.method, c.cell.allocation) + ("" if mode == ONE_PASS else f" ({mode})")


def metric_columns(cells: list[CellRecord], display: Display = Display()) -> list[Column]:
    """One column per task, from what its cells declare (primary metric, direction), labelled and ordered as the
    task asks."""
    declared: dict[str, Column] = {}
    for c in cells:
        if c.cell.is_analysis or c.cell.task in declared:
            continue
        m = c.primary_metric
        declared[c.cell.task] = Column(display.labels.get(c.cell.task) or f"{c.cell.task} {m}", c.cell.task, m,
                                       c.direction(m))
    last = max(display.order.values(), default=0) + 1
    return [declared[t] for t in sorted(declared, key=lambda t: (display.order.get(t, last), t))]


def _first(cells, key):
    for c in cells:
        v = key(c)
        if v is not None:
            return v
    return None


def _get(d, *path):
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return None
        d = d[p]
    return d


# leaderboard label -> the speedup a cell's latency stores (dense time / variant time, measured interleaved)
SPEEDUP_COLUMNS = {"decode speedup (body)": "decode_body", "decode speedup": "decode",
                   "prefill speedup (body)": "prefill_body"}
# an older cell (latency version 1: the variant timed alone) has only its own times: its speedup is the ratio of
# its time to the dense row's, with no interval
_OLD_SPEEDUP = {"decode speedup": "decode ms/tok", "prefill speedup (body)": "prefill ms/tok"}


def variant_row(cells: list[CellRecord], columns: list[Column]) -> dict:
    """One row's raw values from the task cells of one (model, method, rank)."""
    by_task = {c.cell.task: c for c in cells}
    row: dict = {}
    for col in columns:
        c = by_task.get(col.task)
        row[col.label] = c.metrics.get(col.metric) if c else None
        row[col.label + " stderr"] = c.stderr.get(col.metric) if c else None
    row["param ratio"] = _first(cells, lambda c: _get(c.compression, "param_ratio"))
    # theoretical multiply-adds per token and activation numbers kept, vs dense (docs/design.md, sections 1 and 7); stored since the
    # sparsity family (older low-rank cells lack them, and their compute ratio equals their parameter ratio)
    row["compute ratio"] = _first(cells, lambda c: _get(c.compression, "compute_ratio"))
    row["activation ratio"] = _first(cells, lambda c: _get(c.compression, "activation_ratio"))
    row["weight MB"] = _first(cells, lambda c: _get(c.memory, "weight_bytes"))
    if row["weight MB"] is not None:
        row["weight MB"] /= 2**20
    # deployed weights + the largest working set measured while a task ran
    work = [b for c in cells if (b := _get(c.memory, "peak", "working_bytes")) is not None]
    wb = _first(cells, lambda c: _get(c.memory, "weight_bytes"))
    row["peak MB"] = (wb + max(work)) / 2**20 if work and wb is not None else None
    row["prefill ms/tok"] = _first(cells, lambda c: _get(c.latency, "prefill_ms_per_token"))
    row["decode ms/tok"] = _first(cells, lambda c: _get(c.latency, "decode_ms_per_token"))
    # measured against dense in the same process (latency version 2): the ratio and its 95 % interval
    for label, name in SPEEDUP_COLUMNS.items():
        got = _first(cells, lambda c: _get(c.latency, "speedup", name))
        if isinstance(got, dict) and is_number(got.get("ratio")):
            ci = got.get("ci95")
            row[label] = got["ratio"]
            row[label + " ci"] = tuple(ci) if isinstance(ci, list) and len(ci) == 2 and all(map(is_number, ci)) \
                else None
    row["fallbacks"] = _first(cells, lambda c: _get(c.compression, "n_fallbacks"))
    calibration = _first(cells, lambda c: calibration_label(c.calibration))
    if calibration is not None:  # named only where calibrated: a table of data-free rows exports as it always did
        row["calibration"] = calibration
    # thresholds (teal) keep a density that varies per token: the mean over the row's tasks of what each measured
    dens = [v for c in cells if is_number(v := _get(c.compression, "measured_density"))]
    row["measured density"] = sum(dens) / len(dens) if dens else None
    row["decode converged"] = _first(cells, lambda c: _get(c.latency, "converged"))
    speed_bounds(row, _first(cells, lambda c: _get(c.latency, "body_overhead")))
    return row


def ceiling(dense_ms: float, floor_ms: float, bound: float) -> float:
    """The body speedup reached if the linear products ran `bound` times faster than dense's and nothing else
    changed: dense / (floor + (dense - floor) / bound)."""
    return dense_ms / (floor_ms + max(dense_ms - floor_ms, 0.0) / bound)


def speed_bounds(row: dict, overhead: dict | None) -> None:
    """A timed row's bytes bound (at batch 1 every weight is read once per token, so the linear products can speed
    up at most by dense's bytes over the row's: 1 / its compute ratio, or 1 / its measured density for a threshold),
    the fraction of it its body decode speedup reached, and the ceiling the measured overhead floor allows."""
    if not is_number(row.get("decode speedup (body)")) or not row.get("decode speedup (body) ci"):
        return
    share = row["measured density"] if is_number(row.get("measured density")) else compute_of(row)
    if not is_number(share) or share <= 0 or share >= 1:
        return
    row["bytes bound"] = 1 / share
    row["of bound"] = row["decode speedup (body)"] / row["bytes bound"]
    # a floor measured above the dense body it is part of (noise on a tiny model) bounds nothing
    if isinstance(overhead, dict) and is_number(overhead.get("dense_body_ms")) and is_number(overhead.get("floor_ms")) \
            and 0 <= overhead["floor_ms"] <= overhead["dense_body_ms"] and overhead["dense_body_ms"] > 0:
        row["ceiling (body)"] = ceiling(overhead["dense_body_ms"], overhead["floor_ms"], row["bytes bound"])
        row["of ceiling"] = row["decode speedup (body)"] / row["ceiling (body)"]


def group_cells(cells: list[CellRecord]):
    """{model: {"dense": [...], "ranks": {(budget, rank, scope): {row name: [...]}},
    "analyses": {task: {(budget, rank): cell}}}}"""
    out: dict = defaultdict(lambda: {"dense": [], "ranks": defaultdict(lambda: defaultdict(list)),
                                     "analyses": defaultdict(dict)})
    for c in cells:
        cell = c.cell
        m = out[cell.model]
        if cell.is_analysis:
            m["analyses"][cell.task][(cell.budget, cell.rank)] = c
        elif cell.method == DENSE:
            m["dense"].append(c)
        else:
            m["ranks"][(cell.budget, cell.rank, cell.scope)][row_name(c)].append(c)
    return out


def chance_table(dense_cells: list[CellRecord], columns: list[Column] | None = None) -> dict[str, dict]:
    """Per higher-is-better task (in column order), whether the dense model is significantly above chance (None:
    cannot tell)."""
    by_task = {c.cell.task: c for c in dense_cells}
    return {col.task: above_chance(by_task[col.task]) for col in columns or metric_columns(dense_cells)
            if col.higher is True and col.task in by_task}


def delta_key(col: str, ref: str) -> str:
    return f"Δ {col} vs {ref}"


def rank_table(dense_cells: list[CellRecord], by_method: dict[str, list[CellRecord]], ref: str = REFERENCE,
               columns: list[Column] | None = None, margins: Mapping[str, float] | None = None) -> list[dict]:
    """Rows (dense first) with ratios to dense for latency, paired differences to the reference method on the
    same items (each with its detectable difference and verdict at the task's margin), and a recovery percentage
    over the tasks where dense is significantly above chance."""
    if columns is None:
        columns = metric_columns(dense_cells + [c for cs in by_method.values() for c in cs])
    dense = variant_row(dense_cells, columns) if dense_cells else None
    chance = chance_table(dense_cells)
    ref_cells = {c.cell.task: c for c in by_method.get(ref, [])}
    rows = []
    for name, cells in [(DENSE, dense_cells)] + sorted(by_method.items()):
        if not cells:
            continue
        row = {"method": name, **variant_row(cells, columns)}
        if name == DENSE:
            row["param ratio"] = 1.0
            if any(_get(c.compression, "compute_ratio") is not None for cs in by_method.values() for c in cs):
                row["compute ratio"] = row["activation ratio"] = 1.0
        if name != ref:
            by_task = {c.cell.task: c for c in cells}
            for col in columns:
                if col.task in by_task and col.task in ref_cells and (d := compare(ref_cells[col.task],
                                                                                   by_task[col.task])):
                    k = delta_key(col.label, ref)
                    row[k], (row[k + " lo"], row[k + " hi"]), row[k + " p"] = d["diff"], d["ci95"], d["p"]
                    row[k + " test"], row[k + " n"] = d["test"], d.get("n")
                    row[k + " detectable"] = d.get("detectable")
                    row[k + " verdict"] = verdict(d, (margins or {}).get(col.task), col.higher)
        rec = []
        if dense:
            for col in columns:
                if col.higher is not True or not (chance.get(col.task) or {}).get("above"):
                    continue  # a task at chance (or without a chance level) says nothing about recovery
                if row[col.label] is not None and dense[col.label]:
                    rec.append(row[col.label] / dense[col.label])
            for label, key in _OLD_SPEEDUP.items():
                if row.get(label) is None and is_number(row[key]) and is_number(dense[key]) and row[key] > 0:
                    row[label], row[label + " ci"] = dense[key] / row[key], None
        if name == DENSE and is_number(row.get("decode ms/tok")):
            for label in SPEEDUP_COLUMNS:  # the reference every speedup divides
                row[label], row[label + " ci"] = 1.0, None
        row["recovery %"] = 100 * sum(rec) / len(rec) if rec else None
        rows.append(row)
    return rows


def missing_cells(grouped) -> list[str]:
    """Cells a complete sweep would have: every row seen for a model under a budget and scope at every ratio seen
    there, for every task seen."""
    out = []
    for model, g in grouped.items():
        tasks = sorted({c.cell.task for per in g["ranks"].values() for cs in per.values() for c in cs}
                       | {c.cell.task for c in g["dense"]})
        for key in sorted(g["ranks"], key=section_order):
            methods = sorted({m for k, per in g["ranks"].items() if (k[0], k[2]) == (key[0], key[2]) for m in per})
            for m in methods:
                have = {c.cell.task for c in g["ranks"][key].get(m, [])}
                for t in tasks:
                    if t not in have:
                        where = "" if key[2] == ALL_GROUPS else f" ({describe_scope(key[2])})"
                        out.append(f"{model} / {m} / {key[0]} {key[1]:g}{where} / {t}")
        have_dense = {c.cell.task for c in g["dense"]}
        for t in tasks:
            if t not in have_dense:
                out.append(f"{model} / dense / {t}")
    return out


def section_order(key: tuple) -> tuple:
    """(budget, rank, scope) sections: every group first, then by budget and descending ratio."""
    budget, rank, scope = key
    # low-rank budgets first; then sparsity by density, N:M patterns by M (2:4 before 16:32), unstructured last
    sparse = is_sparsity_budget(budget)
    m = int(budget.split(":")[1]) if sparse and ":" in budget else 10**9
    return (scope != ALL_GROUPS, scope, sparse, -(rank or 0) if sparse else 0, m, budget, -(rank or 0))


def allocation_k(cells: list[CellRecord]) -> dict[str, list[dict]]:
    """{row name: [{group, block, kind, k, d_in}]} for the rows of one section, from their stored compression."""
    out = {}
    for c in cells:
        groups = (c.compression or {}).get("groups") or []
        rows = []
        for g in groups:
            name = g.get("group", "")
            parts = name.split(".")
            if len(parts) == 3 and parts[1].isdigit() and is_number(g.get("k")) and is_number(g.get("d_in")):
                rows.append({"group": name, "block": int(parts[1]), "kind": parts[2], "k": g["k"], "d_in": g["d_in"]})
        if rows:
            out.setdefault(row_name(c), rows)
    return out


def fmt_interval(diff: float, lo: float, hi: float, p: float | None, n: int | None = None) -> str:
    """A paired difference as every table prints it: +0.152 [+0.058, +0.207] p=0.0015 *, the star at p < ALPHA; a
    comparison evaluated until decided has a confidence sequence and the items it used instead of a p-value:
    +0.152 [+0.031, +0.260] CS n=240."""
    if p is None:
        return f"{diff:+.3f} [{lo:+.3f}, {hi:+.3f}] CS" + (f" n={n}" if n is not None else "")
    s = f"{diff:+.3f} [{lo:+.3f}, {hi:+.3f}] p={p:.2g}"
    return s + " *" if p < ALPHA else s


def fmt_decision(word: str, detectable: float | None) -> str:
    """A verdict as the tables print it after the interval, with the difference the comparison had 80 % power to
    detect: 'worse (detectable 0.041)', 'undecided (could miss 0.087)'."""
    if not is_number(detectable):
        return word
    return f"{word} ({'could miss' if word == 'undecided' else 'detectable'} {detectable:.3f})"


def file_slug(s: str) -> str:
    """A name as a file name's part: anything but letters, digits, '-', '.' and '_' becomes '_'."""
    return "".join(ch if ch.isalnum() or ch in "-._" else "_" for ch in s)


def is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def budget_title(budget: str, rank: float) -> str:
    """A section's heading: 'rank ratio 0.5', 'params ratio 0.5', 'N:M 2:4 sparsity (density 0.5)'."""
    if budget == UNSTRUCTURED:
        return f"unstructured sparsity, density {rank:g}"
    if is_sparsity_budget(budget):
        return f"N:M {budget} sparsity (density {rank:g})"
    return f"{budget} ratio {rank:g}"


def compute_of(row: dict) -> float | None:
    """A row's compute ratio; a low-rank cell stored before it was recorded has it equal to its parameter ratio."""
    v = row.get("compute ratio")
    return v if is_number(v) else row.get("param ratio") if is_number(row.get("param ratio")) else None


def matched_compute(sections: dict, target: float = 0.5) -> dict[str, list[CellRecord]]:
    """Rows of both families at one compute ratio: each low-rank row at the section whose compute ratio is closest
    to `target`; each sparsity row at density `target`. {label "method @ budget ratio": cells} (every group only)."""
    out: dict[str, list[CellRecord]] = {}
    best: dict[str, tuple[float, str, list]] = {}
    for (budget, rank, scope), by_row in sections.items():
        if scope != ALL_GROUPS:
            continue
        sparse = is_sparsity_budget(budget)
        for name, cells in by_row.items():
            if sparse:
                if rank is not None and abs(rank - target) < 1e-9:
                    out[f"{name} @ {budget}"] = cells
                continue
            cr = compute_of(variant_row(cells, []))
            if cr is None:
                continue
            if name not in best or abs(cr - target) < best[name][0]:
                best[name] = (abs(cr - target), f"{name} @ {budget} {rank:g}", cells)
    for _, label, cells in best.values():
        out[label] = cells
    return out
