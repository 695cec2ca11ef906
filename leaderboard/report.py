"""`bench report`: markdown leaderboard (tabulate), CSV and JSON of the same tables, and PNG plots."""

from __future__ import annotations

import csv
import io
import math
import json
from collections.abc import Mapping
from pathlib import Path

from tabulate import tabulate

from acbench.core.io import atomic_write_text
from acbench.core.log import say
from acbench.core.record import ALL_GROUPS, ONE_PASS, UNIFORM, CellRecord, calibration_label, calibration_mode, describe_scope

from . import plots
from .across_models import across_models_section
from .load import cell_date, read_result_set
from acbench.core.significance import ALPHA
from acbench.core.stats import is_sparsity_budget

from .tables import (REFERENCE, Column, Display, file_slug, allocation_k, budget_title, chance_table, compute_of, delta_key,
                     fmt_decision, fmt_interval, group_cells,
                     is_number, matched_compute, metric_columns, missing_cells, rank_table, section_order)

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


def _seconds(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def stage_totals(cells: list[CellRecord]) -> dict[str, float]:
    """The wall time the stored cells record, per stage, each piece counted once: a calibration once per
    statistics cache, a variant's compression and latency once per variant, every evaluation and analysis."""
    calib, per_variant, totals = {}, {}, {"evaluation": 0.0, "analyses": 0.0}
    for c in cells:
        t = c.timings or {}
        variant = (c.cell.method, c.cell.budget, c.cell.rank, c.cell.allocation, c.cell.scope)
        cache = (c.calibration or {}).get("cache")
        if cache is not None and _seconds(t.get("calibrate_s")) is not None:
            calib[str(cache)] = _seconds(t["calibrate_s"])
        for key, stage in (("compress_s", "compress"), ("allocate_s", "compress"), ("latency_s", "latency")):
            if _seconds(t.get(key)) is not None:
                per_variant[(variant, key, stage)] = _seconds(t[key])
        if _seconds(t.get("evaluate_s")) is not None:
            totals["evaluation"] += _seconds(t["evaluate_s"])
        if c.cell.is_analysis:
            totals["analyses"] += sum(v for k, v in t.items() if k.endswith("_s") and _seconds(v) is not None)
    out = {"calibration": sum(calib.values())}
    for (_, _, stage), sec in per_variant.items():
        out[stage] = out.get(stage, 0.0) + sec
    out.update(totals)
    return {k: v for k, v in out.items() if v > 0}


def _header(cells: list[CellRecord], analysis_cells: list[CellRecord] = ()) -> list[str]:
    fp = next((c.model_fingerprint for c in cells if c.model_fingerprint), {}) or {}
    cal = next((c.calibration for c in cells if c.calibration), None)
    env = next((c.env for c in cells if c.env), {}) or {}
    dates = sorted(cell_date(c) for c in cells)
    lines = ["- model fingerprint: " + ", ".join(f"{k}={str(v)[:16]}" for k, v in sorted(fp.items())
                                                 if k != "compressed")]
    if fp.get("compressed"):  # a checkpoint bench compress wrote: where it came from
        lines.append(f"- compressed checkpoint: {fp['compressed']}")
    if cal:
        spec = cal.get("spec", {})
        sizes = {calibration_label({"spec": (c.calibration or {}).get("spec")}) for c in cells if c.calibration}
        size = (f"{spec.get('samples')} x {spec.get('seq_len')} tokens" + (
            f" ({calibration_mode(cal)})" if calibration_mode(cal) != ONE_PASS else "")) if len(sizes) == 1 \
            else "per row (the calibration column)"
        lines.append(f"- calibration: {size} from {spec.get('source')}, "
                     f"{spec.get('pair_tokens')} (x, g) pairs/group, seed {spec.get('seed')}")
    bos = sorted({str(c.bos) for c in cells if c.bos})
    if bos:
        lines.append(f"- BOS protocol (calibration and perplexity windows; BOS never scored): {', '.join(bos)}"
                     + (" — MIXED: these rows are not comparable" if len(bos) > 1 else ""))
    spent = stage_totals(list(cells) + list(analysis_cells))
    if spent:
        sec = lambda v: f"{v:.1f} s" if v < 10 else f"{v:.0f} s"
        lines.append("- wall time the cells record: " + ", ".join(f"{k} {sec(v)}" for k, v in spent.items())
                     + f" (total {sec(sum(spent.values()))})")
    seeds = sorted({c.seed for c in cells if c.seed is not None})
    lines.append(f"- seed: {', '.join(map(str, seeds))}")
    if env.get("cpu_model"):  # the machine the speeds were measured on (cells written since the machine was stored)
        lines.append(machine_line(env))
    lines += bounds_line(cells)
    lines.append(f"- versions: acbench {env.get('acbench')}, torch {env.get('torch')}, transformers "
                 f"{env.get('transformers')}, lm-eval {env.get('lm_eval')}, commit {env.get('git_commit')}, "
                 f"device {env.get('device')}")
    lines.append(f"- results dated {dates[0][:10]} to {dates[-1][:10]}" if dates and dates[0] else "- results undated")
    return lines


def bounds_line(cells: list[CellRecord]) -> list[str]:
    """- what bounds decode here: the memory bandwidth, the dense batch-1 product's, and dense's overhead floor, as
    the first timed cell measured them (once per run and model)."""
    lat = next((c.latency for c in cells if isinstance(c.latency, dict)
                and isinstance((c.latency.get("conditions") or {}).get("memory_bandwidth"), dict)), None)
    if lat is None:
        return []
    cond, parts = lat["conditions"], []
    mb = cond["memory_bandwidth"]
    if is_number(mb.get("copy_gb_s")) and is_number(mb.get("triad_gb_s")):
        parts.append(f"memory copy {mb['copy_gb_s']:.1f} GB/s, triad {mb['triad_gb_s']:.1f} GB/s "
                     f"({mb.get('array_mb')} MB arrays, {mb.get('threads')} threads)")
    dp = cond.get("dense_product") or {}
    if is_number(dp.get("gb_s")) and isinstance(dp.get("shape"), list):
        parts.append(f"a dense batch-1 product of the largest site ({' x '.join(map(str, dp['shape']))} "
                     f"{dp.get('dtype')}, weights cold) streams {dp['gb_s']:.1f} GB/s")
    over = lat.get("body_overhead") or {}
    if is_number(over.get("dense_body_ms")) and is_number(over.get("floor_ms")):
        if 0 <= over["floor_ms"] <= over["dense_body_ms"]:
            parts.append(f"dense body decode {over['dense_body_ms']:.2f} ms/token, of which {over['floor_ms']:.2f} ms "
                         "outside the linear products (the overhead floor)")
        else:  # timing noise on a body too small to measure: no ceiling is drawn from it
            parts.append(f"dense body decode {over['dense_body_ms']:.2f} ms/token; the overhead floor measured "
                         f"{over['floor_ms']:.2f} ms, above it (timing noise), so no ceiling is shown")
    return ["- what bounds decode here: " + "; ".join(parts)] if parts else []


def machine_line(env: dict) -> str:
    """- machine: the processor, its vector extensions, CPUs and threads, torch's kernels, BLAS and oneDNN."""
    parts = [str(env["cpu_model"])]
    if env.get("cpus_available") is not None:
        parts.append(f"{env['cpus_available']} CPUs available, {env.get('cpu_threads')} threads used")
    if env.get("cpu_vector_extensions"):
        parts.append(f"vector extensions {env['cpu_vector_extensions']}")
    torch_parts = [f"{k} {env[key]}" for k, key in (("kernels", "torch_cpu_capability"), ("BLAS", "torch_blas"),
                                                    ("oneDNN", "torch_onednn")) if env.get(key)]
    if torch_parts:
        parts.append("torch " + ", ".join(torch_parts))
    return "- machine: " + "; ".join(parts)


def allocation_section(by_row: dict, model: str, budget: str, rank: float, scope: str,
                       plot_dir: Path, written: list) -> list[str]:
    """Rank allocations of one section: the budget each met, and k per group by block (table and plot)."""
    cells = [c for cs in by_row.values() for c in cs]
    ks = allocation_k(cells)
    lines = []
    for name in sorted(ks):
        info = next(((c.compression or {}).get("allocation") for c in by_row.get(name, [])), None) or {}
        if info.get("rule", UNIFORM) == UNIFORM:
            continue
        secs = sum((info.get("seconds") or {}).values())
        lines.append(f"- {name}: {info['allocated_params']:,} of a {info['budget_params']:,}-parameter budget "
                     f"({info['allocated_ratio']:.4f} of dense), allocated in {secs:.2f} s")
    if not lines:
        return []
    # Allocations depend on the rule, not on the method: rows with the same ks share one line and one label
    same: dict = {}
    for name in sorted(ks):
        same.setdefault(json.dumps(sorted((g["group"], g["k"]) for g in ks[name])), []).append(name)
    ks = {", ".join(names): ks[names[0]] for names in same.values()}
    kinds = sorted({g["kind"] for per in ks.values() for g in per})
    table = []
    for name in sorted(ks):
        for kind in kinds:
            per = sorted((g["block"], g["k"]) for g in ks[name] if g["kind"] == kind)
            table.append([name, kind, " ".join(str(k) for _, k in per)])
    p = plots.k_by_block(ks, f"{model}, {budget} ratio {rank:g}: k per group",
                         plot_dir / f"{file_slug(model)}_k_{budget}_{rank:g}{'' if scope == ALL_GROUPS else '_' + file_slug(scope)}.png")
    written.append(p)
    return (["Rank allocation (budget over the compressed groups):", ""] + lines + [""]
            + ["k per group, by block:", "", tabulate(table, headers=["row", "group", "k by block"], tablefmt="github",
                                                      disable_numparse=True), "",
               f"![k per group by block](plots/{p.name})", ""])


def cross_family_section(g: dict, section_rows: dict, columns: list[Column], model: str, ref: str, plot_dir: Path,
                         written: list, target: float = MATCHED_COMPUTE, margins: Mapping[str, float] | None = None
                         ) -> list[str]:
    """Low-rank and sparsity rows at one compute ratio, with paired differences to the reference row, and a
    figure of each loss-like metric against compute ratio with both families (only where both were run).
    `section_rows`: the rows each (budget, rank, scope) table already computed, read for the figure."""
    families = {is_sparsity_budget(b) for (b, _, scope) in g["ranks"] if scope == ALL_GROUPS}
    if families != {True, False}:
        return []
    by_label = matched_compute(g["ranks"], target)
    ref_label = next((lab for lab in sorted(by_label) if lab.split(" @ ")[0] == ref), ref)
    rows = rank_table(g["dense"], by_label, ref_label, columns, margins)
    md = [f"### Both families at compute ratio {target:g}", "",
          f"- each low-rank row at its run ratio whose compute ratio (theoretical multiply-adds per token vs dense) "
          f"is closest to {target:g}, each sparsity row at density {target:g}; the row label names the budget and "
          "the compute ratio column the ratio matched"] + speed_notes(rows, True) + [
          "", markdown_table(rows, ref_label, columns), ""]
    md += significance_note(rows, ref_label, margins)
    # the figure: every row of every section (every group), a line per method over its ratios
    points: dict[str, list] = {}
    col = next((c for c in columns if c.higher is False), columns[0] if columns else None)
    dense_row = rows[0] if rows and rows[0]["method"] == "dense" else {}
    for (budget, _rank, scope), shown in section_rows.items():
        if scope != ALL_GROUPS:
            continue
        for r in shown:
            if r["method"] == "dense":
                continue
            x, y = compute_of(r), r.get(col.label) if col else None
            if is_number(x) and is_number(y):
                # a line per low-rank method over its ratios, per sparsity method and block size M (1:4, 2:4,
                # 3:4 on one line), and per sparsity method over its unstructured densities
                if not is_sparsity_budget(budget):
                    series = r["method"]
                elif budget == "unstructured":
                    series = f"{r['method']} (unstructured)"
                else:
                    series = f"{r['method']} @ N:{budget.split(':')[1]}"
                points.setdefault(series, []).append((x, y))
    if col and points:
        p = plots.metric_vs_compute(points, dense_row.get(col.label), col.label, col.higher is False,
                                    f"{model}: both families", plot_dir / f"{file_slug(model)}_{file_slug(col.task)}_vs_compute.png")
        written.append(p)
        md += [f"![{col.label} vs compute ratio](plots/{p.name})", ""]
    return md


def frontier_section(g: dict, section_rows: dict, columns: list[Column], model: str, plot_dir: Path,
                     written: list) -> list[str]:
    """Quality (Δ NLL to dense, and each accuracy) against measured decode speedup, every row of every section over
    all groups, both families on one figure; only rows whose speedup has an interval (measured interleaved)."""
    ppl = _ppl_label(columns)
    accs = [c.label for c in columns if c.higher is True]
    panels: dict[str, dict[str, list]] = {}
    for (budget, rank, scope), rows in section_rows.items():
        if scope != ALL_GROUPS or not rows or rows[0]["method"] != "dense":
            continue
        dense = rows[0]
        fam = "sparsity" if is_sparsity_budget(budget) else "low-rank"
        for r in rows[1:]:
            ci, x = r.get("decode speedup ci"), r.get("decode speedup")
            if not ci or not is_number(x):
                continue
            # short point labels: "pca @ rank 0.5", "act-sparse @ 2:4", "teal @ 0.5" (unstructured density)
            name = f"{r['method']} @ " + (f"{rank:g}" if budget == "unstructured" else budget if fam == "sparsity"
                                          else f"{budget} {rank:g}")
            if ppl and is_number(r.get(ppl)) and is_number(dense.get(ppl)) and r[ppl] > 0 and dense[ppl] > 0:
                panels.setdefault(f"Δ NLL vs dense ({ppl})", {}).setdefault(fam, []).append(
                    (name, x, ci[0], ci[1], math.log(r[ppl] / dense[ppl])))
            for a in accs:
                if is_number(r.get(a)):
                    panels.setdefault(a, {}).setdefault(fam, []).append((name, x, ci[0], ci[1], r[a]))
    if not panels:
        return []
    p = plots.quality_vs_speed(panels, f"{model}: quality against measured decode speed",
                               plot_dir / f"{file_slug(model)}_quality_vs_speed.png")
    written.append(p)
    return ["### Quality against measured speed", "",
            "- each row measured against dense in one process (decode at batch 1, end to end, [95 % interval]); "
            "up and to the right is better for accuracy, down and to the right for Δ NLL", "",
            f"![quality vs measured decode speedup](plots/{p.name})", ""]


def rank_sections(g: dict, model: str, ref: str, columns: list[Column], plot_dir: Path, written: list,
                  flat_rows: list, margins: Mapping[str, float] | None = None) -> tuple[list[str], dict, dict]:
    """One table per (budget, ratio, scope); returns the lines, the rows each table showed, and the low-rank rows
    by method and ratio (for the across-ranks table)."""
    md, section_rows, cross = [], {}, {}
    if g["dense"] and not g["ranks"]:  # a model evaluated as it is (e.g. a saved checkpoint): its own row
        rows = rank_table(g["dense"], {}, ref, columns)
        md += ["### As loaded (no compression in this run)", "", markdown_table(rows, ref, columns), ""]
        flat_rows += [{"model": model, "budget": None, "rank": None, "scope": None, **r} for r in rows]
    for key in sorted(g["ranks"], key=section_order):
        budget, rank, scope = key
        rows = section_rows[key] = rank_table(g["dense"], g["ranks"][key], ref, columns, margins)
        where = "" if scope == ALL_GROUPS else f", {describe_scope(scope)}"
        sparse = is_sparsity_budget(budget)
        md += [f"### {budget_title(budget, rank)}{where}", ""]
        if scope != ALL_GROUPS:
            md += [f"- compressed: {describe_scope(scope)} only; the other groups stay dense and the parameter "
                   "ratio counts the compressed groups", ""]
        md += [markdown_table(rows, ref, columns), ""]
        md += significance_note(rows, ref, margins)
        md += frontier_line(rows, columns)
        notes = speed_notes(rows, sparse)  # a run with --no-latency has no speedup for the note to explain
        md += notes + ([""] if notes else [])
        # a sparsity section compares at equal compute (activation and weight sparsity keep different weights)
        md += param_ratio_warning(rows, "compute ratio" if sparse else "param ratio")
        md += item_set_warning(g["dense"], g["ranks"][key])
        fb = [f"{r['method']}: {r['fallbacks']}" for r in rows if r.get("fallbacks")]
        if fb:
            md += [f"Numeric fallbacks recorded (see the result files): {', '.join(fb)}.", ""]
        # allocation_section writes nothing unless some row of the section has a non-uniform allocation
        md += allocation_section(g["ranks"][key], model, budget, rank, scope, plot_dir, written)
        for r in rows:
            flat_rows.append({"model": model, "budget": budget, "rank": rank, "scope": scope, **r})
            if r["method"] != "dense" and not sparse:  # ranks of the low-rank family
                name = r["method"] if scope == ALL_GROUPS else f"{r['method']} [{scope}]"
                cross.setdefault(name, {})[rank] = r
    return md, section_rows, cross


def across_ranks_section(g: dict, cross: dict, model: str, ref: str, columns: list[Column], plot_dir: Path,
                         written: list) -> list[str]:
    """Every low-rank row at every ratio in one table, with accuracy-vs-rank and loss-vs-parameters figures."""
    if not cross:
        return []
    ranks = sorted({r for per in cross.values() for r in per}, reverse=True)
    body = []
    for m in sorted(cross):
        line = [m]
        for rk in ranks:
            r = cross[m].get(rk, {})
            line.append(" / ".join("" if not is_number(r.get(c.label)) else
                                   _num(r[c.label], "{:.3f}" if c.higher else "ppl") for c in columns))
        body.append(line)
    md = [f"### Across rank ratios ({' / '.join(c.label for c in columns)})", "",
          tabulate(body, headers=["method"] + [f"{r:g}" for r in ranks], tablefmt="github", disable_numparse=True),
          ""]
    dense_row = rank_table(g["dense"], {}, ref, columns)[0] if g["dense"] else {}
    series = {}
    for col in (c.label for c in columns if c.higher):
        pts = {m: [(rk, r[col]) for rk, r in per.items() if is_number(r.get(col))] for m, per in cross.items()}
        if any(pts.values()):
            series[col] = pts
    if series:
        p = plots.accuracy_vs_rank(series, {c: dense_row.get(c) for c in series}, model,
                                   plot_dir / f"{file_slug(model)}_accuracy_vs_rank.png")
        written.append(p)
        md += [f"![accuracy vs rank ratio](plots/{p.name})", ""]
    loss = next((c.label for c in columns if c.higher is False), None)  # the first loss-like column
    loss_pts = {m: [(r["param ratio"], r[loss]) for r in per.values()
                    if is_number(r.get("param ratio")) and is_number(r.get(loss))]
                for m, per in cross.items()} if loss else {}
    if any(loss_pts.values()):
        p = plots.ppl_vs_params(loss_pts, dense_row.get(loss), model, plot_dir / f"{file_slug(model)}_ppl_vs_params.png")
        written.append(p)
        md += [f"![perplexity vs parameter ratio](plots/{p.name})", ""]
    return md


def analysis_sections(g: dict, model: str, display: Display, plot_dir: Path, written: list) -> list[str]:
    """Each analysis cell under its heading, rendered by the analysis itself (or as a table of its metrics)."""
    md = []
    for name in sorted(g["analyses"]):
        for (budget, rank), cell in sorted(g["analyses"][name].items(), key=lambda kv: (kv[0][0], -(kv[0][1] or 0))):
            md += [f"### {name} at {budget} ratio {rank:g}", ""]
            render = display.sections.get(name)
            try:
                out = render(cell, plot_dir, f"{file_slug(model)}_{name}_{budget}_{rank:g}", f"{model} @ {rank:g}") \
                    if render else None
            except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
                # a cell whose details its analysis cannot read: named, and shown as its metrics
                md += [f"*{getattr(cell, 'source', name)}: its details could not be rendered ({type(e).__name__}); "
                       "its metrics:*", ""]
                out = None
            if out is None:
                md += [tabulate([[k, f"{v:.4g}" if is_number(v) else ""] for k, v in cell.metrics.items()],
                                headers=["metric", "value"], tablefmt="github", disable_numparse=True), ""]
                continue
            lines, figures = out
            md += lines + [""]
            written += figures
    return md


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
