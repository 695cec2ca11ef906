"""How the leaderboard writes a number, a table and the notes under it: formats, the best value in bold, the
frontier line, the significance, chance, speed and comparability notes."""

from __future__ import annotations
import math
from collections.abc import Mapping
from tabulate import tabulate

from acbench.core.record import CellRecord
from acbench.core.significance import ALPHA
from .tables import (REFERENCE, Column, chance_table, delta_key,
                     fmt_decision, fmt_interval, is_number)


MATCHED_COMPUTE = 0.5  # the compute ratio at which the cross-family table compares the two families

LATENCY_NOTE = ("- speedups: dense time / the row's time, measured in one process with dense and the row alternating "
                "(bench/measure/latency.py), geometric mean of the per-round ratios [95 % interval]; \"= dense\" marks an "
                "interval containing 1.0 (no measurable change). decode: batch 1 with the KV cache, (body) the "
                "decoder layers alone, without the embedding and the head no method compresses; prefill (body): "
                "tokens per second at the evaluation batch. Activation-sparsity rows decode through the gathered "
                "product (only the kept channels' weights are read) and prefill as a masked dense product. "
                "wanda / magnitude-prune keep dense-shaped weights with zeros where no kernel exploits them (on every "
                "CPU, and for any pattern but 2:4), so their speed there is dense's; on a CUDA GPU with sparse tensor "
                "cores their 2:4 weights run as torch's semi-structured sparse tensors (a cell's conditions say which "
                "ran).")

BOUND_NOTE = ("- bytes bound: at batch 1 each weight is read once per token, so a row's linear products can be at most "
              "dense's bytes over its bytes faster (1 / compute ratio; 1 / measured density for a threshold); "
              "ceiling (body): the body decode speedup that bound allows once the time outside the linear products "
              "(norms, attention, rotary, the modules' Python: the overhead floor, measured on dense with its "
              "products skipped) is counted, dense / (floor + (dense - floor) / bound); of ceiling: the measured body "
              "speedup over it. A low share of the ceiling is a slow kernel; a ceiling near 1 is a machine or model "
              "where compressing the linear layers cannot pay.")

COMPUTE_NOTE = "- compute ratio (theory): multiply-adds per token vs dense, not a measured speedup."


def speed_notes(rows: list[dict], sparse: bool) -> list[str]:
    """The notes a section's speed columns need: the measured speedups' where a row was timed, the theoretical
    compute ratio's where the section shows one (a sparsity section, or the both-families table)."""
    bound = any(is_number(r.get("bytes bound")) for r in rows)
    return ([LATENCY_NOTE] if measured_speed(rows) else []) + ([BOUND_NOTE] if bound else []) + \
        ([COMPUTE_NOTE] if sparse else [])

# the frontier line: the fastest row whose token NLL stays within this many nats of dense (ppl within 10.5 %)
FRONTIER_NLL = 0.1

ARROW = {True: " ↑", False: " ↓", None: ""}

DISPLAY = [  # (header, key, higher is better or None, format), after the task columns
    ("recovery % ↑", "recovery %", True, "{:.1f}"),
    ("param ratio ↓", "param ratio", False, "{:.3f}"),
    ("compute ratio (theory) ↓", "compute ratio", False, "{:.3f}"),
    ("activation ratio ↓", "activation ratio", False, "{:.3f}"),
    ("measured density", "measured density", None, "{:.3f}"),
    ("weights MB ↓", "weight MB", False, "{:.1f}"),
    ("peak MB ↓", "peak MB", False, "{:.0f}"),
    ("decode speedup (body) ↑", "decode speedup (body)", None, "speedup"),
    ("bytes bound", "bytes bound", None, "{:.2f}x"),
    ("of bound", "of bound", None, "{:.0%}"),
    ("ceiling (body)", "ceiling (body)", None, "{:.2f}x"),
    ("of ceiling", "of ceiling", None, "{:.0%}"),
    ("decode speedup ↑", "decode speedup", None, "speedup"),
    ("prefill speedup (body) ↑", "prefill speedup (body)", None, "speedup"),
]


def _num(v: float, fmt: str) -> str:
    if fmt == "ppl":  # perplexities of broken models run to 1e9: keep the column readable
        return f"{v:.3g}" if abs(v) >= 1e5 else f"{v:.2f}"
    return fmt.format(v)


def measured_speed(rows: list[dict]) -> bool:
    """Whether any row carries a measured speedup (the speed note is said only then)."""
    from .tables import SPEEDUP_COLUMNS

    return any(is_number(r.get(label)) for r in rows for label in SPEEDUP_COLUMNS)


def _fmt(row: dict, key: str, fmt: str, best: bool) -> str:
    v = row.get(key)
    if not is_number(v):
        return ""
    s = _num(v, fmt)
    se = row.get(key + " stderr")
    if is_number(se):
        s += f" ± {_num(se, fmt)}"
    return f"**{s}**" if best else s


def column_display(columns: list[Column]) -> list[tuple]:
    """Task columns as the cells declare them: higher-is-better metrics (accuracies) to 3 decimals, the others
    (perplexities, losses) in a format that stays readable for a broken model's 1e9."""
    return [(c.label + ARROW[c.higher], c.label, c.higher, "{:.3f}" if c.higher else "ppl") for c in columns]


def _best(rows: list[dict], key: str, higher: bool):
    vals = [r[key] for r in rows if r["method"] != "dense" and is_number(r.get(key))]
    if len(vals) < 2 or len(set(vals)) == 1:  # nothing to single out
        return None
    return max(vals) if higher else min(vals)


def _fmt_speedup(row: dict, key: str) -> str:
    """1.62x [1.55, 1.70]; an interval containing 1.0 reads "= dense"; an older cell's ratio has no interval; a
    comparison that reached its time cap before its interval narrowed to the target says "not converged"."""
    v, ci = row.get(key), row.get(key + " ci")
    if not is_number(v):
        return ""
    if not ci:
        return f"{v:.2f}x"
    s = f"{v:.2f}x [{ci[0]:.2f}, {ci[1]:.2f}]"
    s = f"= dense ({s})" if ci[0] <= 1.0 <= ci[1] else s
    return s + " (not converged)" if row.get("decode converged") is False else s


def _ppl_label(columns: list[Column]) -> str | None:
    """The perplexity column the frontier measures quality by (its log ratio to dense is a Δ NLL)."""
    return next((c.label for c in columns if c.higher is False and c.task.startswith("ppl")), None)


def frontier_line(rows: list[dict], columns: list[Column]) -> list[str]:
    """The fastest row (measured decode speedup, interval above 1) whose token NLL is within FRONTIER_NLL of
    dense's, or a line saying none is."""
    ppl = _ppl_label(columns)
    dense = rows[0] if rows and rows[0]["method"] == "dense" else None
    key = "decode speedup"
    timed = [r for r in rows[1:] if r.get(key + " ci") and is_number(r.get(key))]
    if not ppl or dense is None or not is_number(dense.get(ppl)) or not timed:
        return []
    close = [r for r in timed if is_number(r.get(ppl)) and r[ppl] > 0
             and math.log(r[ppl] / dense[ppl]) <= FRONTIER_NLL]
    faster = [r for r in close if r[key + " ci"][0] > 1.0]
    within = f"within {FRONTIER_NLL:g} nats of dense's token NLL ({ppl} <= {dense[ppl] * math.exp(FRONTIER_NLL):.2f})"
    if not faster:
        return [f"- frontier: no row {within} is measurably faster than dense at decode.", ""]
    best = max(faster, key=lambda r: r[key])
    body = _fmt_speedup(best, key + " (body)")  # absent from cells timed before the body was
    return [f"- frontier: the fastest row {within} is **{best['method']}**, decode {_fmt_speedup(best, key)}"
            + (f" (body {body})" if body else "") + ".", ""]


def _fmt_delta(row: dict, key: str) -> str:
    if not is_number(row.get(key)):
        return ""
    s = fmt_interval(row[key], row[key + " lo"], row[key + " hi"], row[key + " p"], row.get(key + " n"))
    return s + " " + fmt_decision(row[key + " verdict"], row.get(key + " detectable")) if row.get(key + " verdict") \
        else s


def markdown_table(rows: list[dict], ref: str = REFERENCE, columns: list[Column] = ()) -> str:
    shown = []
    for d in column_display(columns) + DISPLAY:
        if any(is_number(r.get(d[1])) for r in rows):
            shown.append(d)
            dk = delta_key(d[1], ref)
            if any(is_number(r.get(dk)) for r in rows):
                nll = any(str(r.get(dk + " test", "")).startswith("paired t") or (
                    str(r.get(dk + " test", "")).startswith("confidence sequence") and d[2] is False) for r in rows)
                label = "Δ NLL" if nll else "Δ " + d[1]
                shown.append((f"{label} vs {ref}", dk, None, "delta"))
    bests = {d[1]: _best(rows, d[1], d[2]) if d[3] not in ("delta", "speedup") and d[2] is not None else None
             for d in shown}
    # the windows each row's method was calibrated on, beside its authors' (a text column, last): shown where the
    # rows differ in it or a row names its authors' (cells before it named neither: the header line says it all)
    labels = {r.get("calibration") for r in rows if isinstance(r.get("calibration"), str)}
    calibrated = len(labels) > 1 or any("(authors" in label or "SHORT" in label for label in labels)
    body = []
    for r in rows:
        body.append([r["method"] + (" (ref)" if r["method"] == ref else "")] + [
            _fmt_delta(r, key) if fmt == "delta" else _fmt_speedup(r, key) if fmt == "speedup" else
            _fmt(r, key, fmt, bests[key] is not None and r["method"] != "dense" and r.get(key) == bests[key])
            for _, key, _, fmt in shown] + ([r.get("calibration") or ""] if calibrated else []))
    return tabulate(body, headers=["method"] + [d[0] for d in shown] + (["calibration (authors')"] if calibrated
                                                                       else []),
                    tablefmt="github", disable_numparse=True)


def significance_note(rows: list[dict], ref: str, margins: Mapping[str, float] | None = None) -> list[str]:
    if not any(k.startswith("Δ ") for r in rows for k in r):
        return []
    shown = ", ".join(f"{t} ±{m:g}" for t, m in sorted((margins or {}).items()))
    return [f"Δ columns: paired difference to `{ref}` on the same items, [95 % interval], p-value; * marks p < {ALPHA}. "
            "Accuracy: per-item (micro) difference, McNemar's exact test on the discordant items, exact conditional interval. "
            "Perplexity: difference of per-window mean NLL (log of the perplexity ratio), t interval, "
            "paired t-test. Then the verdict: *better* or *worse* where the test rejects zero, *equivalent* where two "
            f"one-sided tests at {ALPHA} put the difference within the task's margin ({shown or 'none set'}; "
            "`--margin`), else *undecided*; in brackets the difference the comparison had 80 % power to detect "
            "(two-sided 5 %), which an undecided comparison could have missed."
            + (" `CS n=...`: evaluated until decided (`--until-decided`): the interval is the anytime-valid confidence "
               "sequence over the n items both rows scored (a fixed-n interval is not valid when read after every "
               "block), and the verdict is its decision." if any(str(r.get(k, "")).startswith("confidence sequence")
                                                            for r in rows for k in r if k.endswith(" test")) else ""),
            ""]


def chance_note(dense_cells: list[CellRecord], columns: list[Column] | None = None) -> list[str]:
    """Which tasks the dense model is above chance on: only those enter recovery %."""
    parts = []
    for task, info in chance_table(dense_cells, columns).items():
        if info is None:
            continue
        verdict = "above chance" if info["above"] else "AT CHANCE: left out of recovery %, read its column as noise"
        parts.append(f"{task} dense {info['acc']:.3f} vs chance {info['chance']:.3f} "
                     f"(n={info['n']}, one-sided p={info['p']:.2g}): {verdict}")
    if not parts:
        return []
    return ["- recovery % averages the accuracy tasks where dense is significantly above chance (each item's "
            "chance level as its task records it): " + "; ".join(parts)]

PARAM_RATIO_TOLERANCE = 0.01


def param_ratio_warning(rows: list[dict], key: str = "param ratio") -> list[str]:
    """Rows of one rank ratio are compared as equals only if they deploy about as many parameters (a sparsity
    section: only if they cost about as much compute)."""
    ratios = {r["method"]: r[key] for r in rows if r["method"] != "dense" and is_number(r.get(key))}
    if len(ratios) < 2 or max(ratios.values()) - min(ratios.values()) <= PARAM_RATIO_TOLERANCE:
        return []
    lo, hi = min(ratios.values()), max(ratios.values())
    at = lambda v: ", ".join(m for m, x in sorted(ratios.items()) if abs(x - v) <= PARAM_RATIO_TOLERANCE / 2)
    if key != "param ratio":
        return [f"**Unequal budgets:** {key}s in this table range from {lo:.3f} ({at(lo)}) to {hi:.3f} ({at(hi)}).",
                ""]
    return [f"**Unequal budgets:** parameter ratios in this table range from {lo:.3f} ({at(lo)}) to {hi:.3f} "
            f"({at(hi)}), more than {PARAM_RATIO_TOLERANCE} apart; rows are not compared at equal size "
            "(`--budget params` sets the same parameter ratio for every method).", ""]


def item_set_warning(dense: list[CellRecord], by_row: dict) -> list[str]:
    """Rows of one table are set side by side only when each task scored the same items: a rerun at another
    --ppl-windows or --lama-limit leaves a pca of 3 windows beside a fasc-kfac of 4, and the table says so."""
    from acbench.core.significance import item_keys, until_decided

    by_task: dict[str, dict[tuple, list[str]]] = {}
    for name, cells in [("dense", dense), *sorted(by_row.items())]:
        for c in cells:
            if c.records and not until_decided(c):  # evaluated until decided: a prefix of one order, by design
                by_task.setdefault(c.cell.task, {}).setdefault(tuple(item_keys(c)), []).append(name)
    out = []
    for task, sets in sorted(by_task.items()):
        if len(sets) > 1:
            parts = "; ".join(f"{', '.join(names)}: {len(items)} items" for items, names in
                              sorted(sets.items(), key=lambda kv: (-len(kv[1]), kv[1])))
            out += [f"**Different items:** the {task} rows of this table were scored on different items ({parts}): "
                    "their values are not comparable; rerun the odd rows at the others' settings (--overwrite).", ""]
    return out
