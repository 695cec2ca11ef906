"""The FASC paper's headline claim as a study: at a given rank, Fisher-aligned subspaces (fasc-kfac, fasc) keep more
knowledge than variance-based ones (pca, whitened-svd), on both embedded models at several ranks. `make claims`
(python -m acbench.studies.claims) computes the missing cells with `acbench.sweep` and writes docs/claims.md and its
figure from the stored cells.

Sized to decide. LAMA is scored on every probe of its source, evaluated until decided (docs/decisions.md): once
against pca and once against whitened-svd, the reference scoring the whole set and each claimant stopping at the
first block where its confidence sequence decides. MMLU (cloze form) is compared only on a model whose dense score
leaves room above chance for the claimed effect (6 points), on the whole set and until decided as LAMA; a model
without that room reads so and is left out of the verdict. Perplexity is scored on fixed windows.

Each benchmark is one family of per-model tests, corrected by Holm's step-down procedure. The sequences of a family
of m comparisons run at 0.05 / m, so a comparison stopped as decided stays decided after the correction; their
anytime-valid p-values (the least level at which the sequence excludes zero) enter Holm's procedure beside the
fixed-n p-values of perplexity. The verdict counts the models ("holds in k of n"); the common-effect (fixed) pooled
difference is shown beside it, labelled so: two models cannot estimate the between-model variance a random-effects
verdict needs (random effects from three models on), and no verdict rests on it."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tabulate import tabulate

from acbench.core.meta_analysis import RANDOM_EFFECTS_MIN_K, common_effect, dersimonian_laird, holm, paired_effect
from acbench.core.record import DENSE, CellRecord
from acbench.core.significance import (ALPHA, above_chance, anytime_p, compare, fixed_items_needed, item_scores,
                                       sequence_detectable, sequence_items_needed, until_decided)

MODELS = ("gemma-3-270m", "smollm2-135m")
RANKS = (0.9, 0.75, 0.5)
CLAIMANTS = ("fasc-kfac", "fasc")
BASELINES = ("pca", "whitened-svd")
# task -> (label, metric shown, higher is better)
TASKS = {"mmlu": ("MMLU (cloze, acc_norm)", "acc_norm", True), "lama": ("LAMA P@1", "p@1", True),
         "ppl-token": ("perplexity", "ppl", False)}
SEQUENTIAL_TASKS = ("lama", "mmlu")  # evaluated until decided; perplexity on fixed windows
PAPER_GAP = "6-8 points of MMLU and LAMA accuracy at 50 % rank (Mistral-7B, Llama-3-8B)"
CLAIMED = (0.06, 0.08)  # the paper's effect, accuracy as a fraction
TARGET = 0.04  # the difference the whole budget should detect (80 % power): half the smallest claimed effect
MMLU_ALL = 0  # --mmlu-limit 0: every question of the source


@dataclass(frozen=True)
class Settings:
    models: tuple[str, ...] = MODELS
    ranks: tuple[float, ...] = RANKS
    mmlu_limit: int = MMLU_ALL  # questions per subject (0: all) for the dense room check and the comparisons
    lama_source: str = "embedded"  # LAMA's probes: embedded, or a release a user brings (lama:DIR:RELATIONS, ...)
    output: str = "studies/cells/claims"  # committed with the page, so that it can be regenerated
    doc: str = "docs/claims.md"


def family_size(s: Settings, models=None) -> int:
    """The per-model tests of one benchmark's family: models x ranks x claimants x baselines."""
    return len(s.models if models is None else models) * len(s.ranks) * len(CLAIMANTS) * len(BASELINES)


def sequence_level(s: Settings, models=None) -> float:
    """The level each of the family's sequences runs at (Bonferroni's share of 0.05): a comparison stopped as
    decided is then significant after Holm's correction over the family."""
    return ALPHA / family_size(s, models)


def _mmlu_options(s: Settings) -> dict:
    return {"mmlu_format": "cloze", "mmlu_limit": s.mmlu_limit}


def ppl_keywords(s: Settings) -> dict:
    """The perplexity cells: `bench run --model M... --methods fasc-kfac fasc pca whitened-svd --rank R... --tasks
    ppl-token --no-latency --output DIR` (fixed windows)."""
    return {"model": list(s.models), "methods": [*CLAIMANTS, *BASELINES], "rank": list(s.ranks),
            "tasks": ["ppl-token"], "measure_latency": False, "output": s.output}


def room_keywords(s: Settings, model: str) -> dict:
    """The dense MMLU cell on the study's question set: does the model leave room above chance for the claim?"""
    return {"model": model, "methods": ["dense"], "tasks": ["mmlu"], **_mmlu_options(s), "measure_latency": False,
            "output": s.output}


def sequential_keywords(s: Settings, task: str, baseline: str, models: list[str]) -> dict:
    """One benchmark against one baseline, until decided: `bench run --methods fasc-kfac fasc <baseline> --rank R...
    --tasks <task> --until-decided --reference <baseline> --until-decided-alpha 0.05/m` (LAMA: every probe of
    --lama-source; MMLU: cloze, --mmlu-limit questions per subject, 0 for all)."""
    options = {"lama_source": s.lama_source} if task == "lama" else _mmlu_options(s)
    return {"model": list(models), "methods": [*CLAIMANTS, baseline], "rank": list(s.ranks), "tasks": [task],
            **options, "until_decided": True, "reference": baseline,
            "until_decided_alpha": sequence_level(s, models), "measure_latency": False, "output": s.output}


def compute_cells(s: Settings) -> list[CellRecord]:
    """Every cell the study reads, computed where missing and read back where stored (acbench.sweep): perplexity;
    LAMA until decided against each baseline; each model's dense MMLU, which decides where MMLU is compared; then
    MMLU until decided where there is room. Each sweep stores its cells as they are computed: a study stopped
    part-way resumes where it stopped."""
    import acbench

    def run(**keywords) -> list[CellRecord]:
        # the statistics cache kept: one calibration per model serves every sweep of the study
        return [CellRecord.from_json(c) for c in acbench.sweep(**keywords, report=False, cache=True)]

    cells = run(**ppl_keywords(s))
    for baseline in BASELINES:  # LAMA first: the cheapest decision, and a part stopped early has it
        cells += run(**sequential_keywords(s, "lama", baseline, list(s.models)))
    for m in s.models:
        cells += run(**room_keywords(s, m))
    roomy = [m for m in s.models if room(index(cells), m)["room"]]
    for baseline in BASELINES if roomy else ():
        cells += run(**sequential_keywords(s, "mmlu", baseline, roomy))
    return cells


# ------------------------------------------------------------------------------------------- reading cells


def reference_of(c: CellRecord) -> str | None:
    """The baseline an until-decided cell was compared with; None for a cell evaluated whole."""
    spec = until_decided(c)
    return spec.get("reference") if spec else None


def index(cells: list[CellRecord]) -> dict[tuple, CellRecord]:
    """{(model, method, rank, task, reference): cell}; dense under rank None, a cell evaluated whole under reference
    None."""
    return {(c.cell.model, c.cell.method, c.cell.rank, c.cell.task, reference_of(c)): c for c in cells
            if not c.cell.is_analysis}


def pair(cells: dict, model: str, rank: float, task: str, claimant: str, baseline: str):
    """(baseline's cell, claimant's cell) of one comparison: the until-decided pair run against this baseline for
    LAMA and MMLU, the whole-set pair for perplexity."""
    ref = baseline if task in SEQUENTIAL_TASKS else None
    return cells.get((model, baseline, rank, task, ref)), cells.get((model, claimant, rank, task, ref))


def dense_cell(cells: dict, model: str, task: str) -> CellRecord | None:
    """The dense model's whole-set cell of a task (the MMLU room check's; LAMA's from the run against pca)."""
    for ref in (None, *BASELINES):
        c = cells.get((model, DENSE, None, task, ref))
        if c is not None:
            return c
    return None


def room(cells: dict, model: str) -> dict:
    """Room for the claimed effect on MMLU: a dense score above chance (one-sided binomial test) by at least the
    smallest claimed effect. {"room": bool, "above": points or None, "acc", "chance"}; no room where the dense cell is missing."""
    dense = cells.get((model, DENSE, None, "mmlu", None))
    a = above_chance(dense) if dense is not None else None
    if a is None:
        return {"room": False, "above": None, "acc": None, "chance": None, "n": 0}
    above = a["acc"] - a["chance"]
    # room: significantly above chance, and by at least the smallest effect claimed (a model at chance has nothing
    # to lose; one 3 points above it cannot lose 6)
    return {"room": bool(a["above"]) and above >= CLAIMED[0], "above": above, "acc": a["acc"], "chance": a["chance"], "n": a["n"]}


def above_chance_models(cells: dict, models, task: str) -> list[str]:
    """The models a benchmark's comparisons are read on: all for perplexity; for LAMA those whose dense score is
    above chance; for MMLU those with room for the claimed effect above chance."""
    if task == "mmlu":
        return [m for m in models if room(cells, m)["room"]]
    out = []
    for m in models:
        dense = dense_cell(cells, m, task)
        if dense is None:
            continue
        verdict_ = above_chance(dense)
        if verdict_ is None or verdict_["above"]:
            out.append(m)
    return out


def differences_of(ref: CellRecord, other: CellRecord) -> tuple[str, np.ndarray] | None:
    a, b = item_scores(ref), item_scores(other)
    if not a or not b or a[0] != b[0]:
        return None
    n = min(len(a[1]), len(b[1]))
    return a[0], np.asarray(b[1][:n], dtype=np.float64) - np.asarray(a[1][:n], dtype=np.float64)


def sequential_extent(shown: dict, kind: str, d: np.ndarray) -> dict:
    """What a comparison evaluated until decided spent and could see: its anytime-valid p, the difference its whole
    budget detects (80 % power, at its level), the items a fixed-n test at the same level would need to detect that
    same difference (what evaluating a fixed count, decided in advance, would have cost instead), and, where the
    whole budget cannot detect TARGET, the budget that would."""
    alpha, budget = shown["alpha"], shown["budget"]
    whole = sequence_detectable(kind, d, budget, alpha)
    need = sequence_items_needed(kind, d, alpha, TARGET) if kind == "accuracy" and whole is not None \
        and whole > TARGET else None
    return {"p": anytime_p(kind, d, budget), "whole_detectable": whole,
            "fixed_items": fixed_items_needed(kind, d, whole, alpha) if whole else None, "items_for_target": need}


def comparison(cells: dict, models, rank: float, task: str, claimant: str, baseline: str) -> dict:
    """claimant - baseline per model (paired; until decided for LAMA and MMLU, with what that spent), the
    common-effect pooled difference (two or more models; random effects from RANDOM_EFFECTS_MIN_K), and the
    verdict with Holm's correction across these models (write_doc corrects across each benchmark's family)."""
    per = {}
    for m in above_chance_models(cells, models, task):
        ref, other = pair(cells, m, rank, task, claimant, baseline)
        shown = compare(ref, other) if ref and other else None
        if shown is None:
            continue
        kind, d = differences_of(ref, other)
        diff, var = paired_effect([0.0] * len(d), list(d))  # d is already other - ref, item by item
        entry = {"shown": shown, "diff": diff, "var": var, "detectable": shown["detectable"], "p": shown["p"]}
        if shown.get("budget") is not None:  # until decided
            entry.update(sequential_extent(shown, kind, d))
            entry["detectable"] = entry["whole_detectable"]
        per[m] = entry
    # models not compared because a cell is missing (not because they are at chance or without room)
    pending = [m for m in models if m not in per and (dense_cell(cells, m, task) is None or (
        m in above_chance_models(cells, [m], task) and None in pair(cells, m, rank, task, claimant, baseline)))]
    unmeasured = not per and bool(pending)
    out = {"rank": rank, "task": task, "claimant": claimant, "baseline": baseline, "per_model": per,
           "common": None, "pooled": None, "interval": None, "detectable": None, "unmeasured": unmeasured,
           "pending": len(pending)}
    if len(per) >= 2:
        effects, variances = [p["diff"] for p in per.values()], [p["var"] for p in per.values()]
        out["common"] = common_effect(effects, variances)
        out["estimate"], out["interval"] = out["common"]["estimate"], out["common"]["ci95"]
        if len(per) >= RANDOM_EFFECTS_MIN_K:
            out["pooled"] = dersimonian_laird(effects, variances)
    elif per:
        (only,) = per.values()
        out["estimate"], out["interval"] = only["shown"]["diff"], only["shown"]["ci95"]
    found = [p["detectable"] for p in per.values() if p["detectable"] is not None]
    out["detectable"] = max(found) if found else None
    for p, q in zip(per.values(), holm([p["p"] for p in per.values()])):
        p["holm_p"] = q
    out["verdict"] = verdict(out, TASKS[task][2])
    return out


def verdict(r: dict, higher: bool) -> str:
    """From each model's Holm-adjusted p and direction: 'holds in k of n', 'reversed in k of n', both when models
    disagree, else 'not detected' (with what it could miss); 'no room' (MMLU) or 'at chance' when no model can be
    compared."""
    per = r["per_model"]
    if not per:
        if r.get("unmeasured"):
            return "not measured yet"
        return "no room above chance" if r["task"] == "mmlu" else "at chance"
    claimed = sum(p["holm_p"] < ALPHA and (p["shown"]["diff"] > 0) == higher for p in per.values())
    against = sum(p["holm_p"] < ALPHA and p["shown"]["diff"] != 0 and (p["shown"]["diff"] > 0) != higher
                  for p in per.values())
    parts = ([f"holds in {claimed} of {len(per)}"] if claimed else []) + \
        ([f"reversed in {against} of {len(per)}"] if against else [])
    waiting = f"; {r['pending']} more not measured yet" if r.get("pending") else ""
    if parts:
        return ", ".join(parts) + waiting
    miss = r.get("detectable")
    return "not detected" + (f" (could miss {fmt_float(miss, r['task'])})" if miss is not None else "") + waiting


def correct_per_benchmark(rows: list[dict]) -> dict[str, int]:
    """Holm's correction across each benchmark's per-model tests (one family per benchmark), each row's verdict
    re-read from it; returns {task: tests in its family}."""
    sizes = {}
    for task in TASKS:
        tests = [p for r in rows if r["task"] == task for p in r["per_model"].values()]
        for p, q in zip(tests, holm([p["p"] for p in tests])):
            p["holm_p"] = q
        sizes[task] = len(tests)
    for r in rows:
        r["verdict"] = verdict(r, TASKS[r["task"]][2])
    return sizes


def scale(task: str) -> float:
    return 100.0 if TASKS[task][2] else 1.0  # accuracy in points, perplexity as Δ mean NLL (nats)


def fmt(x: float, task: str) -> str:
    return f"{x * scale(task):+.1f}" if TASKS[task][2] else f"{x:+.4f}"


def fmt_ci(est, ci, task: str, p=None) -> str:
    p_txt = f", p={p:.2g}" if p is not None else ""
    return f"{fmt(est, task)} [{fmt(ci[0], task)}, {fmt(ci[1], task)}{p_txt}]"


def fmt_float(x: float, task: str) -> str:
    return f"{x * scale(task):.1f}" if TASKS[task][2] else f"{x:.4f}"


def per_model_text(p: dict, task: str) -> str:
    shown = p["shown"]
    text = fmt_ci(shown["diff"], shown["ci95"], task, p["p"]) + f", Holm {p['holm_p']:.2g}"
    if shown.get("budget") is not None:
        ended = shown.get("decision") or "budget spent"
        text += f"; {shown['n']:,} of {shown['budget']:,}, {ended}"
    return text


def absent_text(cells: dict, model: str, task: str) -> str:
    if dense_cell(cells, model, task) is None:
        return "not measured yet"
    if task == "mmlu":
        r = room(cells, model)
        if r["above"] is not None and not r["room"]:
            return f"no room ({fmt(r['above'], task)} over chance" + (")" if above_chance(
                cells[(model, DENSE, None, "mmlu", None)])["above"] else ", not significant)")
    return "at chance"


def verdict_rows(rows: list[dict], models, cells: dict) -> list[list[str]]:
    body = []
    for r in rows:
        task, per = r["task"], r["per_model"]
        compared = set(above_chance_models(cells, models, task))
        texts = [per_model_text(per[m], task) if m in per else "not measured yet" if m in compared else
                 absent_text(cells, m, task) for m in models]
        common = r["common"]
        # after a data-chosen stop a fixed-n interval is not one: the sequential rows' common effect is its estimate
        pooled = "" if not common else fmt_ci(common["estimate"], common["ci95"], task, common["p"]) \
            if task not in SEQUENTIAL_TASKS else f"{fmt(common['estimate'], task)} (estimate only)"
        body.append([f"{r['rank']:g}", TASKS[task][0], f"{r['claimant']} − {r['baseline']}", *texts, pooled,
                     fmt_float(r["detectable"], task) if r["detectable"] is not None else "",
                     r["verdict"]])
    return body


def spent_rows(rows: list[dict]) -> list[list[str]]:
    """One row per comparison evaluated until decided: the items it spent against the budget, how it ended, the
    difference the whole budget detects, the items a fixed-n test at the same level needs to detect that difference,
    and the budget that would detect TARGET where this one does not."""
    body = []
    for r in rows:
        for m, p in r["per_model"].items():
            shown = p["shown"]
            if shown.get("budget") is None:
                continue
            need = p.get("items_for_target")
            body.append([f"{r['rank']:g}", TASKS[r["task"]][0], f"{r['claimant']} − {r['baseline']}", m,
                         f"{shown['n']:,} of {shown['budget']:,}", shown.get("decision") or "budget spent",
                         fmt_float(p["whole_detectable"], r["task"]) if p["whole_detectable"] is not None else "",
                         f"{p['fixed_items']:,}" if p.get("fixed_items") else "",
                         "" if p["whole_detectable"] is None or p["whole_detectable"] <= TARGET else
                         f"{need:,}" if need else "over 200,000"])
    return body


def spent_totals(rows: list[dict]) -> dict:
    """Items the claimants scored until decided, the items scoring each on its whole budget would have taken, and
    the items fixed-n tests at the same levels would have needed for the same detectable differences."""
    spent = budget = fixed = 0
    for r in rows:
        for p in r["per_model"].values():
            if p["shown"].get("budget") is not None:
                spent += p["shown"]["n"]
                budget += p["shown"]["budget"]
                fixed += p.get("fixed_items") or 0
    return {"spent": spent, "budget": budget, "fixed": fixed}


AT_CHANCE = "†"  # beside an accuracy not significantly above its items' chance


def shown_cell(cells: dict, model: str, method: str, rank, task: str) -> CellRecord | None:
    """The cell a score table and figure show: dense's whole-set cell; a baseline's whole-set cell (its own run
    until decided, where it is the reference); a claimant's run that scored the most items (a prefix of the set)."""
    if method == DENSE:
        return dense_cell(cells, model, task)
    if task not in SEQUENTIAL_TASKS:
        return cells.get((model, method, rank, task, None))
    if method in BASELINES:
        return cells.get((model, method, rank, task, method))
    found = [cells.get((model, method, rank, task, b)) for b in BASELINES]
    found = [c for c in found if c is not None]
    return max(found, key=lambda c: len(c.records or []), default=None)


def score_table(cells: dict, models, ranks) -> list[list[str]]:
    body = []
    for m in models:
        for method in (DENSE, *CLAIMANTS, *BASELINES):
            row = [m, method]
            for task, (_, metric, higher) in TASKS.items():
                for rank in ranks:  # dense: its one score under every rank, the reference of each
                    c = shown_cell(cells, m, method, None if method == DENSE else rank, task)
                    v = c.metrics.get(metric) if c else None
                    chance = above_chance(c) if c and higher else None
                    mark = AT_CHANCE if chance and not chance["above"] else ""
                    items = f" ({len(c.records):,})" if c and until_decided(c) and c.records and \
                        until_decided(c)["items"] < until_decided(c)["budget"] else ""
                    row.append("" if v is None else f"{100 * v:.1f}{mark}{items}" if higher else f"{v:.2f}")
            body.append(row)
    return body


def figure(cells: dict, models, ranks, path: Path) -> Path:
    from acbench.core.figures import pyplot, save_figure

    plt = pyplot()
    fig, axes = plt.subplots(len(models), len(TASKS), figsize=(4.2 * len(TASKS), 3.3 * len(models)), squeeze=False)
    for i, m in enumerate(models):
        for j, (task, (label, metric, higher)) in enumerate(TASKS.items()):
            ax = axes[i][j]
            for method in (*CLAIMANTS, *BASELINES):
                shown = [(r, shown_cell(cells, m, method, r, task)) for r in ranks]
                xs = [r for r, c in shown if c is not None]
                ys = [c.metrics[metric] * (100 if higher else 1) for _, c in shown if c is not None]
                ax.plot(xs, ys, marker="o", label=method, linestyle="-" if method in CLAIMANTS else "--")
            dense = dense_cell(cells, m, task)
            if dense is not None:
                ax.axhline(dense.metrics[metric] * (100 if higher else 1), color="black", linewidth=1, label="dense")
                chance = above_chance(dense)
                if chance is not None:
                    ax.axhline(100 * chance["chance"], color="grey", linestyle=":", linewidth=1, label="chance")
            if not higher:
                ax.set_yscale("log")
            ax.set_xlabel("rank ratio")
            ax.set_ylabel(label if higher else f"{label} (log)")
            ax.set_title(f"{m}: {label}", fontsize=9)
            ax.invert_xaxis()  # less rank to the right: the loss grows left to right
            ax.grid(alpha=0.3)
            if i == 0 and j == 0:
                ax.legend(fontsize=7)
    return save_figure(fig, path)


def summary_lines(rows: list[dict], families: dict[str, int]) -> list[str]:
    """One sentence per benchmark: where the claim holds, where it is reversed, where it is not detected, and what
    its comparisons could detect against the claimed 6-8 points."""
    out = []
    for task, (label, _, higher) in TASKS.items():
        mine = [r for r in rows if r["task"] == task]
        parts = []
        for state in ("holds", "reversed", "not detected", "no room", "at chance", "not measured"):
            hits = [r for r in mine if r["verdict"].startswith(state)]
            if hits:
                parts.append(f"{state} for " + ", ".join(f"{r['claimant']} − {r['baseline']} at {r['rank']:g}"
                                                        for r in hits))
        unit = "points" if higher else "nats of mean NLL"
        detect = [r["detectable"] for r in mine if r["detectable"] is not None]
        power = (f"; 80 % power for differences of {fmt_float(min(detect), task)} to "
                 f"{fmt_float(max(detect), task)} {unit}" if detect else "")
        if detect and higher:
            power += (f" (the claim's smallest, {100 * CLAIMED[0]:.0f} points, is "
                      + ("within reach of every comparison" if max(detect) <= CLAIMED[0] else
                         "beyond the reach of some") + f"; the target of {100 * TARGET:.0f} points is "
                      + ("reached" if max(detect) <= TARGET else "not reached by every comparison") + ")")
        out.append(f"- **{label}** ({families.get(task, 0)} per-model tests): " + "; ".join(parts) + power + ".")
    lost = [(r, m) for r in rows for m, p in r["per_model"].items() if p["p"] < ALPHA <= p["holm_p"]]
    out.append("- Holm's correction within each benchmark: "
               + ("; ".join(f"{TASKS[r['task']][0]} {r['claimant']} − {r['baseline']} at {r['rank']:g} on {m} "
                            f"(p = {r['per_model'][m]['p']:.2g})" for r, m in lost)
                  + " significant alone, not after it." if lost else
                  "every test significant alone stays significant after it."))
    return out


def compute_time(cells: list[CellRecord]) -> tuple[float, dict]:
    """Seconds of compression and evaluation summed over the cells, plus each model's longest calibration (the
    sweep calibrates once per model and statistics; every cell repeats that time); and one cell's machine."""
    total, calib = 0.0, {}
    for c in cells:
        t = c.timings or {}
        total += sum(float(t.get(k, 0.0)) for k in ("compress_s", "evaluate_s"))
        calib[c.cell.model] = max(calib.get(c.cell.model, 0.0), float(t.get("calibrate_s", 0.0)))
    from acbench.studies import thread_counts

    env = {**next((c.env for c in cells if c.env), {}), "cpu_threads": thread_counts(cells)}
    return total + sum(calib.values()), env


def dense_chance_lines(by: dict, models) -> list[str]:
    out = []
    for m in models:
        for task in ("mmlu", "lama"):
            d = dense_cell(by, m, task)
            a = above_chance(d) if d else None
            if a:
                room_txt = ""
                if task == "mmlu":
                    r = room(by, m)
                    room_txt = (f"; {100 * r['above']:.1f} points over chance against the claimed "
                                f"{100 * CLAIMED[0]:.0f}-{100 * CLAIMED[1]:.0f}: "
                                + ("room, compared" if r["room"] else "no room, left out of the verdict"))
                p = f"p = {a['p']:.2g}" if a["p"] > 0 else "p < 1e-300"
                out.append(f"{m} {TASKS[task][0]}: {100 * a['acc']:.1f} % on {a['n']:,} items against chance "
                           f"{100 * a['chance']:.1f} % (one-sided {p}: "
                           f"{'above chance' if a['above'] else 'at chance'}{room_txt})")
    return out


# ------------------------------------------------------------------------------- the claim's own conditions

def _paper_side():
    from acbench.studies.protocols import NOT_LOCATED, Protocol, Reported
    from acbench.studies.reproductions import FASC_ACC, LLAMA3_8B, MISTRAL_7B

    protocol = Protocol(MISTRAL_7B, FASC_ACC, "rank 0.5", "the FASC paper (arXiv 2601.07197): 50 % rank",
                        "parameters", (Reported(PAPER_GAP, f"the FASC paper (arXiv 2601.07197); its table "
                                                           f"{NOT_LOCATED}"),))
    return protocol, (MISTRAL_7B, LLAMA3_8B), NOT_LOCATED


def calibration_text(c: CellRecord) -> str:
    from acbench.studies.protocols import text_name

    spec = (c.calibration or {}).get("spec") or {}
    mode = spec.get("mode") or "one-pass"
    return (f"{spec.get('samples')} x {spec.get('seq_len')} tokens of {text_name(spec.get('source', 'wiki'))}, "
            f"{mode}" if spec else "not recorded")


def evaluation_text(cells: dict, model: str) -> str:
    parts = []
    lama = dense_cell(cells, model, "lama")
    if lama is not None:
        source = (lama.task_config or {}).get("source", "embedded")
        parts.append(f"LAMA P@1 on {len(lama.records or []):,} probes ({source}), until decided")
    mmlu = dense_cell(cells, model, "mmlu")
    if mmlu is not None:
        parts.append(f"MMLU cloze acc_norm on {len(mmlu.records or []):,} questions"
                     + ("" if room(cells, model)["room"] else " (dense only: no room)"))
    return "; ".join(parts) or "not measured yet"


def conditions(cells: dict, models, rank: float = 0.5) -> tuple[list[list[str]], list[str]]:
    """The claim's conditions as data: (a table of field, the paper, each model's run, read from its cells) and the
    differences studies.protocols computes between the paper's protocol and each model's LAMA pair at the paper's
    rank (each difference once, with the models it applies to)."""
    from acbench.studies.protocols import differences, precision, tuning

    protocol, paper_models, unknown = _paper_side()
    names = ", ".join(f"{p.name} ({p.parameters / 1e9:.1f}B)" for p in paper_models)
    table = {"model": [names], "precision": [", ".join(sorted({p.precision for p in paper_models}))],
             "tuning": [", ".join(sorted({p.tuning for p in paper_models}))],
             "rank": ["50 % rank (the paper's headline level)"],
             "calibration": [f"{unknown}"],
             "evaluation": [f"accuracy on {protocol.evaluation.tasks} (items and prompts {unknown})"]}
    found: dict[str, list[str]] = {}
    for m in models:
        ref, other = pair(cells, m, rank, "lama", CLAIMANTS[0], BASELINES[0])
        fp = (other or ref).model_fingerprint if (other or ref) else {}
        n = (fp or {}).get("parameters")
        table["model"].append(f"{m} ({n / 1e6:.0f}M)" if isinstance(n, int) else m)
        table["precision"].append(precision(fp or {}) if fp else "")
        table["tuning"].append(tuning(fp or {}) if fp else "")
        ranks = sorted({c.cell.rank for c in cells.values() if c.cell.model == m and c.cell.rank}, reverse=True)
        table["rank"].append(f"rank ratios {', '.join(f'{r:g}' for r in ranks)}: k = round(r x d_in) kept per input "
                             "group, every group, uniform")
        table["calibration"].append(calibration_text(other) if other else "")
        table["evaluation"].append(evaluation_text(cells, m))
        if ref and other:
            for d in differences(protocol, [other, ref]):
                found.setdefault(d.line(), []).append(m)
    rows = [[field, *values] for field, values in table.items()]
    lines = [f"{line} ({', '.join(ms)})" for line, ms in found.items()]
    return rows, lines


def model_names(s: Settings, cells: list[CellRecord]) -> tuple[str, ...]:
    """The models as their cells name them: the names given where the cells use them (the embedded models), else
    the results folders the cells were filed under, in order (a model given as a path or hub id)."""
    found = tuple(dict.fromkeys(c.cell.model for c in cells))
    return s.models if not found or set(s.models) <= set(found) else found


def intro_lines(s: Settings, cells: list[CellRecord], by: dict) -> list[str]:
    seconds, env = compute_time(cells)
    ppl = next((c for c in cells if c.cell.task == "ppl-token"), None)
    models_txt = " and ".join(s.models)
    return [
        "# The FASC paper's claim, tested on the embedded models",
        "",
        f"Generated by `make claims` (`python -m acbench.studies.claims`) from the cells under `{s.output}/`; do not "
        "edit by hand. The claim: at the same rank, Fisher-aligned subspaces keep more of what a model knows than "
        f"variance-based ones; the paper reports {PAPER_GAP}. Here: fasc-kfac and fasc against pca and "
        f"whitened-svd on {models_txt}, at rank ratios {', '.join(f'{r:g}' for r in s.ranks)} (every input group "
        "compressed, uniform ranks), on LAMA (every probe of its source, evaluated until decided), MMLU in cloze "
        f"form (0-shot, acc_norm; {'every question' if not s.mmlu_limit else f'{s.mmlu_limit} per subject'}, "
        "until decided, on a model with room above chance for the claim) and perplexity "
        f"({len(ppl.records) if ppl else 0} windows per model, fixed).",
        "",
        f"Compute: {seconds / 60:.0f} minutes of calibration, compression and evaluation summed over the cells "
        f"(each model's calibration counted once) on {env.get('cpu_threads', '?')} threads of "
        f"{env.get('cpu_model', 'an unnamed CPU')} ({env.get('device', 'cpu')}), acbench commit "
        f"{str(env.get('git_commit', '?'))[:7]}, {str(env.get('date', '?'))[:10]}.",
        "",
        "Dense: " + ("; ".join(dense_chance_lines(by, s.models)) or "not measured yet") + ".",
        "",
    ]


def verdict_lines(s: Settings, cells: list[CellRecord], by: dict, rows: list[dict], families: dict) -> list[str]:
    # the levels the stored sequences ran at, as their cells record them
    levels = {t: sorted({float(until_decided(c).get("alpha", ALPHA)) for c in cells
                         if c.cell.task == t and until_decided(c)}) for t in SEQUENTIAL_TASKS}
    return [
        "## Verdict",
        "",
        "Each difference is the claimant's score minus the baseline's, paired on the same items (accuracy in "
        "points; perplexity as the difference of mean per-window NLL, where negative is better), on each model "
        "whose dense score is above chance (MMLU: with room for the claimed effect above chance). LAMA and MMLU "
        "are evaluated until decided (docs/decisions.md): each baseline scores the whole set, and each claimant "
        "stops at the first of 20 blocks where its confidence sequence excludes zero. A benchmark's per-model "
        "tests form one family, corrected by Holm's step-down procedure (Holm 1979); its sequences run at 0.05 "
        "divided by the family's size (" + ("; ".join(f"{TASKS[t][0]}: {', '.join(f'{a:.2g}' for a in got)}"
                                                     for t, got in levels.items() if got) or "none stored yet") +
        "), so that a comparison stopped as decided is decided after the correction too. Their interval is that "
        "sequence at the items the claimant scored, and their p the anytime-valid one (the least level at which "
        "the sequence excludes zero); perplexity's are fixed-n (paired t). The verdict counts the models: "
        "\"holds in k of n\" where k models show the claim after the correction. The common-effect difference "
        "(fixed, inverse-variance) summarises the models under the assumption that they share one effect; with "
        "two models the between-model variance cannot be estimated, so it is labelled fixed-effect and no "
        "verdict rests on it (random effects need three or more models); after a stop chosen by the data it is "
        "an estimate, not an interval. \"detectable\" is the largest of the models' differences their whole "
        "budget detects with 80 % power: for a sequence, its half-width at the budget plus z_0.8 standard errors "
        "at its level (docs/decisions.md).",
        "",
        *summary_lines(rows, families),
        "",
        tabulate(verdict_rows(rows, s.models, by),
                 headers=["rank", "benchmark", "difference", *[f"{m} [interval]" for m in s.models],
                          "common effect (fixed)", "detectable", "verdict"],
                 tablefmt="github", disable_numparse=True),
        "",
    ]


def spent_lines(rows: list[dict]) -> list[str]:
    totals = spent_totals(rows)
    return [
        "## What evaluating until decided spent",
        "",
        f"The claimants scored {totals['spent']:,} items until decided, where their whole budgets hold "
        f"{totals['budget']:,}; fixed-n tests at the same level, each sized in advance to detect the difference "
        f"its comparison's whole budget detects, would have needed {totals['fixed']:,} (Connor 1987). A sequence "
        "read after every block is wider than a fixed-n interval at the same count, so a comparison that runs to "
        "its budget spends more items than the fixed-n test sized for the same difference; one decided early can "
        "spend fewer. Where a whole budget cannot "
        f"detect {100 * TARGET:.0f} points (the "
        "target: half the smallest claimed effect), the last column gives the budget a sequence at the same level "
        "would need, from the spread of the differences observed (repeated): LAMA's own release "
        "(`--lama-source`, below) holds tens of thousands of probes.",
        "",
        tabulate(spent_rows(rows), headers=["rank", "benchmark", "difference", "model", "items", "ended",
                                            "detectable (whole budget)", "fixed-n items, same level",
                                            f"budget to detect {100 * TARGET:.0f} points"],
                 tablefmt="github", disable_numparse=True) if spent_rows(rows) else "No comparison evaluated until "
        "decided is stored yet.",
        "",
    ]


def score_lines(s: Settings, by: dict, fig: Path) -> list[str]:
    return [
        "## Scores",
        "",
        f"MMLU and LAMA in %, perplexity as is; dense's one score stands under every rank; a claimant's score is on "
        f"the items it scored until decided (their count in brackets where fewer than the set). {AT_CHANCE}: at "
        "chance (not above the items' chance level by a one-sided binomial test at 5 %): such a score keeps no "
        "knowledge this test can see, and a difference between two of them says nothing about knowledge kept.",
        "",
        tabulate(score_table(by, s.models, s.ranks),
                 headers=["model", "method", *[f"{t} {r:g}" for t in ("MMLU", "LAMA", "ppl") for r in s.ranks]],
                 tablefmt="github", disable_numparse=True),
        "",
        f"![accuracy and perplexity against rank, per method and model](plots/{fig.name})",
        "",
    ]


def condition_lines(s: Settings, by: dict) -> list[str]:
    cond_rows, cond_lines = conditions(by, s.models)
    return [
        "## The claim's conditions and acbench's",
        "",
        "What the paper ran, as far as it could be located, and what each model's run recorded in its cells:",
        "",
        tabulate(cond_rows, headers=["", "the paper", *s.models], tablefmt="github", disable_numparse=True),
        "",
        "Every difference between the paper's protocol and the runs at its rank (0.5), computed from the cells by "
        "the comparison the reproductions page uses (docs/reproductions.md):",
        "",
        *([f"- {line}" for line in cond_lines] or ["- none computed yet: no LAMA pair at rank 0.5 is stored"]),
        "",
        "## Any fact set",
        "",
        "LAMA's own release (T-REx, tens of thousands of probes) runs the same study where a user has its files: "
        "`python -m acbench.studies.claims --lama-source lama:DIR:RELATIONS --output DIR2 --doc PAGE.md` (the "
        "`--lama-source` forms are in docs/tasks.md; `examples/sources/lama/` holds a small copy in that layout).",
    ]


def write_doc(s: Settings, cells: list[CellRecord]) -> Path:
    from dataclasses import replace

    from acbench.core.io import atomic_write_text

    s = replace(s, models=model_names(s, cells))
    by = index(cells)
    rows = [comparison(by, s.models, r, t, c, b) for r in s.ranks for t in TASKS for c in CLAIMANTS
            for b in BASELINES]
    families = correct_per_benchmark(rows)
    doc = Path(s.doc)
    fig = figure(by, s.models, s.ranks, doc.parent / "plots" / f"{doc.stem}.png")
    lines = [*intro_lines(s, cells, by), *verdict_lines(s, cells, by, rows, families), *spent_lines(rows),
             *score_lines(s, by, fig), *condition_lines(s, by)]
    atomic_write_text(doc, "\n".join(lines) + "\n")
    return doc


def matches(c: CellRecord, s: Settings) -> bool:
    """Whether a stored cell is one this study's settings ask for (a folder may also hold earlier protocols'
    cells: LAMA on a capped set, MMLU at another count, a run against another level): read by its task settings."""
    cfg, task = c.task_config or {}, c.cell.task
    if task == "ppl-token":
        return until_decided(c) is None
    if task == "lama":
        spec = until_decided(c)
        return (cfg.get("source", "embedded") == s.lama_source and cfg.get("per_relation") is None
                and spec is not None and spec.get("reference") in BASELINES)
    if task == "mmlu":
        want = None if not s.mmlu_limit else s.mmlu_limit
        if cfg.get("format") != "cloze" or cfg.get("limit") != want:
            return False
        spec = until_decided(c)
        return spec is None and c.cell.method == DENSE or spec is not None and spec.get("reference") in BASELINES
    return False


def stored_cells(s: Settings) -> list[CellRecord]:
    """The cells under s.output this study's settings ask for (`--report-only`: the page from them, nothing run)."""
    from acbench.leaderboard.load import read_result_set

    if not Path(s.output).is_dir():
        return []
    cells = [c for c in read_result_set(s.output, every_setting=True).cells
             if (c.cell.rank in s.ranks or c.cell.method == DENSE) and matches(c, s)]
    named = [c for c in cells if c.cell.model in s.models]
    # a model given as a path or hub id files its cells under a folder of its own name: then every model's are read
    return named if named else cells


def _rank(text: str) -> float:
    try:
        r = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number: give rank ratios in (0, 1]") from None
    if not 0 < r <= 1:
        raise argparse.ArgumentTypeError(f"{text}: a rank ratio lies in (0, 1]")
    return r


def _limit(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of questions per subject") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"{n}: give a number of questions per subject, or 0 for every question")
    return n


def parse(argv=None) -> tuple[Settings, bool]:
    """(the study's settings, report only)."""
    from acbench.studies import StudyParser

    ap = StudyParser(prog="python -m acbench.studies.claims", description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), help="models (bench run's --model)")
    ap.add_argument("--ranks", nargs="+", type=_rank, default=list(RANKS), help="rank ratios in (0, 1]")
    ap.add_argument("--mmlu-limit", type=_limit, default=MMLU_ALL,
                    help="MMLU questions per subject (default 0: every question)")
    ap.add_argument("--lama-source", default=Settings.lama_source,
                    help="LAMA's probes: embedded (default), lama:DIR:RELATIONS (LAMA's own release), "
                         "qa_wikidata:FILE (docs/tasks.md)")
    ap.add_argument("--output", default=Settings.output, help="the results folder of the study's cells")
    ap.add_argument("--doc", default=Settings.doc, help="the page to write (its figure goes to plots/ beside it)")
    ap.add_argument("--report-only", action="store_true", help="write the page from the stored cells; run nothing")
    a = ap.parse_args(argv)
    if len(set(a.ranks)) != len(a.ranks):
        ap.error("--ranks names a rank twice: give each once")
    from acbench.core.errors import UserError
    from acbench.studies import refuse_bad_models, refuse_unwritable
    from acbench.tasks.data.lama_data import load_lama

    try:  # read now, by content: hours of cells never end in a malformed probe file
        load_lama(a.lama_source)
    except UserError as e:
        ap.error(f"--lama-source {a.lama_source!r}: {e}")
    # before the sweep: an hour's cells never end in "cannot write the page"
    refuse_unwritable(ap, a.doc, {"--doc's figure folder": Path(a.doc).parent / "plots", "--output": a.output})
    refuse_bad_models(ap, a.models)
    return Settings(models=tuple(a.models), ranks=tuple(sorted(a.ranks, reverse=True)), mmlu_limit=a.mmlu_limit,
                    lama_source=a.lama_source, output=a.output, doc=a.doc), a.report_only


def main(argv=None) -> int:
    from acbench.core.errors import UserError

    s, report_only = parse(argv)
    start = time.perf_counter()
    try:
        cells = stored_cells(s) if report_only else compute_cells(s)
        doc = write_doc(s, cells)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: cannot write {s.doc} or its figure ({e.strerror or e}): pass a writable --doc", file=sys.stderr)
        return 2
    print(f"wrote {doc} ({(time.perf_counter() - start) / 60:.1f} minutes)")
    return 0


if __name__ == "__main__":
    from acbench.core.log import console_lines

    with console_lines():  # a script: acbench's lines on its stdout
        sys.exit(main())
