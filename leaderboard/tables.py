"""Tables from result cells: per model and rank ratio, a dense row and one row per method."""

from __future__ import annotations

import math
from collections import defaultdict

from .load import DENSE, RHO
from .significance import above_chance, compare

REFERENCE = "pca"  # paired differences are taken against this row (the variance baseline), `bench report --vs`

# (column, task, metric, higher is better, kind)
METRIC_COLUMNS = [
    ("MMLU acc", "mmlu", "acc", True),
    ("LAMA P@1", "lama", "p@1", True),
    ("PPL (ppl-token)", "ppl-token", "ppl", False),
    ("PPL (ppl-word)", "ppl-word", "word_ppl", False),
]
RECOVERY_METRICS = [("mmlu", "acc"), ("lama", "p@1")]


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


def variant_row(cells: list[dict]) -> dict:
    """One row's raw values from the task cells of one (model, method, rank)."""
    by_task = {c["cell"]["task"]: c for c in cells}
    row: dict = {}
    for col, task, metric, _ in METRIC_COLUMNS:
        c = by_task.get(task)
        row[col] = _get(c, "metrics", metric) if c else None
        row[col + " stderr"] = _get(c, "stderr", metric) if c else None
    row["param ratio"] = _first(cells, lambda c: _get(c, "compression", "param_ratio"))
    row["weight MB"] = _first(cells, lambda c: _get(c, "memory", "weight_bytes"))
    if row["weight MB"] is not None:
        row["weight MB"] /= 2**20
    # deployed weights + the largest working set measured while a task ran
    work = [b for c in cells if (b := _get(c, "memory", "peak", "working_bytes")) is not None]
    wb = _first(cells, lambda c: _get(c, "memory", "weight_bytes"))
    row["peak MB"] = (wb + max(work)) / 2**20 if work and wb is not None else None
    row["prefill ms/tok"] = _first(cells, lambda c: _get(c, "latency", "prefill_ms_per_token"))
    row["decode ms/tok"] = _first(cells, lambda c: _get(c, "latency", "decode_ms_per_token"))
    row["fallbacks"] = _first(cells, lambda c: _get(c, "compression", "n_fallbacks"))
    return row


def group_cells(cells: list[dict]):
    """{model: {"dense": [...], (budget, rank): {method: [...]}, "rho": {(budget, rank): cell}}}"""
    out: dict = defaultdict(lambda: {"dense": [], "ranks": defaultdict(lambda: defaultdict(list)), "rho": {}})
    for c in cells:
        cell = c["cell"]
        m = out[cell["model"]]
        if cell["task"] == RHO:
            m["rho"][(cell.get("budget", "rank"), cell["rank"])] = c
        elif cell["method"] == DENSE:
            m["dense"].append(c)
        else:
            m["ranks"][(cell.get("budget", "rank"), cell["rank"])][cell["method"]].append(c)
    return out


def chance_table(dense_cells: list[dict]) -> dict[str, dict]:
    """Per recovery task, whether the dense model is significantly above chance (None: cannot tell)."""
    by_task = {c["cell"]["task"]: c for c in dense_cells}
    return {task: above_chance(by_task[task]) if task in by_task else None for task, _ in RECOVERY_METRICS}


def delta_key(col: str, ref: str) -> str:
    return f"Δ {col} vs {ref}"


def rank_table(dense_cells: list[dict], by_method: dict[str, list[dict]], ref: str = REFERENCE) -> list[dict]:
    """Rows (dense first) with ratios to dense for latency, paired differences to the reference method on the
    same items, and a recovery percentage over the tasks where dense is significantly above chance."""
    dense = variant_row(dense_cells) if dense_cells else None
    chance = chance_table(dense_cells)
    ref_cells = {c["cell"]["task"]: c for c in by_method.get(ref, [])}
    rows = []
    for name, cells in [(DENSE, dense_cells)] + sorted(by_method.items()):
        if not cells:
            continue
        row = {"method": name, **variant_row(cells)}
        if name == DENSE:
            row["param ratio"] = 1.0
        if name != ref:
            by_task = {c["cell"]["task"]: c for c in cells}
            for col, task, _, _ in METRIC_COLUMNS:
                if task in by_task and task in ref_cells and (d := compare(ref_cells[task], by_task[task])):
                    k = delta_key(col, ref)
                    row[k], (row[k + " lo"], row[k + " hi"]), row[k + " p"] = d["diff"], d["ci95"], d["p"]
        rec = []
        if dense:
            for task, metric in RECOVERY_METRICS:
                col = next(c for c, t, m, _ in METRIC_COLUMNS if t == task and m == metric)
                if not (chance.get(task) or {}).get("above"):
                    continue  # a task at chance says nothing about recovery
                if row[col] is not None and dense[col]:
                    rec.append(row[col] / dense[col])
            for key in ("prefill ms/tok", "decode ms/tok"):
                row[key + " (x dense)"] = row[key] / dense[key] if row[key] is not None and dense[key] else None
        row["recovery %"] = 100 * sum(rec) / len(rec) if rec else None
        rows.append(row)
    return rows


def missing_cells(grouped) -> list[str]:
    """Cells a complete sweep would have: every method seen for a model at every rank seen, for every task seen."""
    out = []
    for model, g in grouped.items():
        methods = sorted({m for per in g["ranks"].values() for m in per})
        tasks = sorted({c["cell"]["task"] for per in g["ranks"].values() for cs in per.values() for c in cs}
                       | {c["cell"]["task"] for c in g["dense"]})
        for key in sorted(g["ranks"], key=lambda k: (k[0], -(k[1] or 0))):
            for m in methods:
                have = {c["cell"]["task"] for c in g["ranks"][key].get(m, [])}
                for t in tasks:
                    if t not in have:
                        out.append(f"{model} / {m} / {key[0]} {key[1]:g} / {t}")
        have_dense = {c["cell"]["task"] for c in g["dense"]}
        for t in tasks:
            if t not in have_dense:
                out.append(f"{model} / dense / {t}")
    return out


def is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
