"""The leaderboard's sections, each from the stored cells: the header (stages, bounds, machine), one section per
budget, both families at matched compute, the frontier, across ranks, allocation, and each analysis's own."""

from __future__ import annotations
import math
import json
from collections.abc import Mapping
from pathlib import Path
from tabulate import tabulate

from acbench.core.record import (ALL_GROUPS, ONE_PASS, UNIFORM, CellRecord, calibration_label, calibration_mode,
                                 describe_scope)
from . import plots
from .load import cell_date

from acbench.core.stats import is_sparsity_budget
from .tables import (Column, Display, file_slug, allocation_k, budget_title, compute_of, is_number, matched_compute,
                     rank_table, section_order)

from acbench.leaderboard.formatting import (MATCHED_COMPUTE, _num, _ppl_label, frontier_line, item_set_warning,
                                            markdown_table, param_ratio_warning, significance_note, speed_notes)


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
