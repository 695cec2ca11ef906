"""The leaderboard's "Across models" section: for each budget two or more models were run at, each method's paired
difference to the reference pooled over the models, and the methods ranked over every (model, task) scenario.

Built only from stored cells, as the per-model tables are: the per-model differences here are the ones those
tables print, and a task a model is at chance on is left out of that model's accuracy verdicts, as recovery % leaves
it out there."""

from __future__ import annotations

from pathlib import Path

from tabulate import tabulate

from acbench.core.meta_analysis import (RANDOM_EFFECTS_MIN_K, cliques, common_effect, dersimonian_laird, friedman, holm,
                                nemenyi_cd, paired_effect, scenario_ranks, stratified_mcnemar, win_rates)
from acbench.core.record import ALL_GROUPS, CellRecord
from acbench.core.significance import ALPHA, compare, item_keys, same_items, verdict

from . import plots
from .tables import (Column, file_slug, budget_title, chance_table, fmt_decision, fmt_interval, is_number,
                     metric_columns, section_order)

MIN_CD_BLOCKS = 3  # the critical-difference figure needs at least this many (model, task) scenarios


def _paired(ref: CellRecord | None, cell: CellRecord | None):
    """(kind, reference scores, scores) of two cells scored on the same items in the same order, else None."""
    if ref is None or cell is None:
        return None
    pair = same_items(ref, cell)
    return pair if pair is not None and len(pair[1]) >= 2 else None


def shared_sections(grouped: dict) -> dict[tuple, list[str]]:
    """{(budget, rank): models} for every budget (all groups compressed) that two or more models were run at."""
    at: dict[tuple, list[str]] = {}
    for model in sorted(grouped):
        for budget, rank, scope in grouped[model]["ranks"]:
            if scope == ALL_GROUPS:
                at.setdefault((budget, rank), []).append(model)
    return {k: v for k, v in sorted(at.items(), key=lambda kv: section_order((*kv[0], ALL_GROUPS)))
            if len(v) >= 2}


def at_chance(grouped: dict, models: list[str], columns: list[Column]) -> set[tuple[str, str]]:
    """(model, task) pairs whose dense accuracy is not significantly above chance (as the per-model tables say)."""
    out = set()
    for model in models:
        for task, info in chance_table(grouped[model]["dense"], columns).items():
            if info is not None and not info["above"]:
                out.add((model, task))
    return out


def _better(diff: float, higher: bool) -> bool:
    return diff > 0 if higher else diff < 0


def pooled_rows(grouped: dict, key: tuple, models: list[str], columns: list[Column], ref: str,
                chance: set, margins=None) -> list[dict]:
    """Per (method, task): each model's paired difference to `ref` with its own verdict, the models where it is
    significantly better or worse after Holm's correction across them, the common-effect pooled difference, for
    accuracy the stratified exact test, and from RANDOM_EFFECTS_MIN_K models on the DerSimonian-Laird random-effects
    difference. A model whose cells cannot be paired, or that is at chance, is left out."""
    budget, rank = key
    sections = {m: grouped[m]["ranks"][(budget, rank, ALL_GROUPS)] for m in models}
    names = sorted({n for s in sections.values() for n in s} - {ref})
    rows = []
    for col in columns:
        if col.higher is None:
            continue
        for name in names:
            per = {}
            for model in models:
                if (model, col.task) in chance:
                    continue
                ref_cell = next((c for c in sections[model].get(ref, []) if c.cell.task == col.task), None)
                cell = next((c for c in sections[model].get(name, []) if c.cell.task == col.task), None)
                pair = _paired(ref_cell, cell)
                if pair:
                    diff, var = paired_effect(pair[1], pair[2])
                    shown = compare(ref_cell, cell)
                    per[model] = {"kind": pair[0], "ref": pair[1], "other": pair[2], "diff": diff, "var": var,
                                  "shown": shown, "verdict": verdict(shown, (margins or {}).get(col.task), col.higher),
                                  "detectable": shown["detectable"]}
            if len(per) < 2:
                continue
            effects, variances = [p["diff"] for p in per.values()], [p["var"] for p in per.values()]
            adjusted = holm([p["shown"]["p"] for p in per.values()])
            for p, q in zip(per.values(), adjusted):
                p["holm_p"] = q
            exact = (stratified_mcnemar([(p["ref"], p["other"]) for p in per.values()])
                     if all(p["kind"] == "accuracy" for p in per.values()) else None)
            rows.append({"method": name, "column": col, "per_model": per, "common": common_effect(effects, variances),
                         "pooled": dersimonian_laird(effects, variances) if len(per) >= RANDOM_EFFECTS_MIN_K else None,
                         "exact": exact, "better": sum(_better(p["diff"], col.higher) for p in per.values()),
                         "holds": sum(p["holm_p"] < ALPHA and _better(p["diff"], col.higher) for p in per.values()),
                         "reversed": sum(p["holm_p"] < ALPHA and not _better(p["diff"], col.higher) and p["diff"] != 0
                                         for p in per.values())})
    return rows


def holds_text(r: dict) -> str:
    """'better in 1 of 2 (Holm)', with the models where it is significantly worse when there are any."""
    text = f"better in {r['holds']} of {len(r['per_model'])}"
    return text + (f", worse in {r['reversed']}" if r["reversed"] else "")


def pooled_table(rows: list[dict], models: list[str], ref: str) -> str:
    """One row per (method, task); the random-effects columns only where some row pools RANDOM_EFFECTS_MIN_K
    models (a row with fewer says why in them)."""
    random = any(r["pooled"] is not None for r in rows)
    body = []
    for r in rows:
        per = r["per_model"]
        cells = []
        for m in models:
            shown = per[m]["shown"] if m in per else None
            cells.append(fmt_interval(shown["diff"], *shown["ci95"], shown["p"]) + " "
                         + fmt_decision(per[m]["verdict"], per[m]["detectable"]) if shown else "")
        signs = " ".join(("+" if _better(per[m]["diff"], r["column"].higher) else "=" if per[m]["diff"] == 0
                          else "−") if m in per else "·" for m in models)
        ce, pl, ex = r["common"], r["pooled"], r["exact"]
        kind = next(iter(per.values()))["kind"]
        line = [r["method"], r["column"].label + (" (Δ NLL)" if kind == "nll" else ""), *cells,
                f"{r['better']} of {len(per)} ({signs})", holds_text(r),
                fmt_interval(ce["estimate"], *ce["ci95"], ce["p"]),
                fmt_interval(ex["diff"], *ex["ci95"], ex["p"]) if ex else ""]
        if random:
            hk = pl and pl.get("hartung_knapp")
            line += [fmt_interval(pl["estimate"], *hk["ci95"], hk["p"]) if hk else
                     f"not estimable from {len(per)} models", f"{pl['tau2']:.2g} / {100 * pl['i2']:.0f} %" if pl
                     else ""]
        body.append(line)
    headers = ["method", "task", *[f"Δ vs {ref}: {m}" for m in models], "direction in", "significant (Holm)",
               "common-effect Δ (fixed)", "all items (stratified exact)",
               *(["random-effects Δ (DerSimonian-Laird, HKSJ interval)", "τ² / I²"] if random else [])]
    return tabulate(body, headers=headers, tablefmt="github", disable_numparse=True)


def scenarios(grouped: dict, key: tuple, models: list[str], columns: list[Column], chance: set):
    """([(scenario label, {method: value}, higher)], methods left out for missing a scenario, scenarios left out
    for mixed item sets): every (model, task) with a better direction and not at chance whose methods scored the
    same items, over the methods every one of them has."""
    budget, rank = key
    raw, mixed = [], []
    for model in models:
        section = grouped[model]["ranks"][(budget, rank, ALL_GROUPS)]
        for col in columns:
            if col.higher is None or (model, col.task) in chance:
                continue
            values, items = {}, set()
            for name, cells in section.items():
                c = next((c for c in cells if c.cell.task == col.task), None)
                v = c.metrics.get(col.metric) if c else None
                if is_number(v):
                    values[name] = float(v)
                    if c.records:
                        items.add(tuple(item_keys(c)))
            if len(items) > 1:  # a rerun at other sizes: its methods were scored on different items
                mixed.append(f"{model} / {col.label}")
            elif values:
                raw.append((f"{model} / {col.label}", values, col.higher))
    if not raw:
        return [], [], mixed
    common = set.intersection(*(set(v) for _, v, _ in raw))
    left = sorted(set().union(*(set(v) for _, v, _ in raw)) - common)
    return [(label, {m: v[m] for m in sorted(common)}, h) for label, v, h in raw], left, mixed


def ranking_lines(key: tuple, scen: list, left: list[str], title: str, plot_dir: Path, written: list) -> list[str]:
    """Win rate and mean rank per method, Friedman's test, and the critical-difference figure."""
    methods = sorted(scen[0][1]) if scen else []
    if len(methods) < 2:
        return []
    ranks = [scenario_ranks(v, h) for _, v, h in scen]
    wins = win_rates([(v, h) for _, v, h in scen])
    mean = {m: sum(r[m] for r in ranks) / len(ranks) for m in methods}
    order = sorted(methods, key=lambda m: (-wins[m], mean[m], m))
    body = [[m, f"{wins[m]:.3f}", f"{mean[m]:.2f}", *[f"{r[m]:g}" for r in ranks]] for m in order]
    md = [f"Ranking over {len(scen)} (model, task) scenarios: win rate (the share of the other methods beaten, a "
          "tie a half, averaged over scenarios; HELM's definition) and mean rank (1 = best, ties share ranks):", "",
          tabulate(body, headers=["method", "win rate", "mean rank", *[label for label, _, _ in scen]],
                   tablefmt="github", disable_numparse=True), ""]
    if left:
        md += [f"- left out of the ranking for lacking a scenario the others have: {', '.join(left)}", ""]
    if len(methods) < 3:
        md += ["- Friedman's test needs at least 3 methods; with 2, read the pooled differences above", ""]
        return md
    fr = friedman(ranks)
    cd = nemenyi_cd(len(methods), len(scen))
    verdict = "the mean ranks differ" if fr["p"] < ALPHA else "no difference between the mean ranks is shown"
    md += [f"- Friedman χ² = {fr['statistic']:.2f} (df {fr['df']}, n = {fr['n']} scenarios), p = {fr['p']:.2g}: "
           f"{verdict} at the {ALPHA:g} level; Nemenyi critical difference at {ALPHA:g}: {cd:.2f} mean ranks", ""]
    if len(scen) >= MIN_CD_BLOCKS:
        budget, rank = key
        p = plots.critical_difference(mean, cd, cliques(mean, cd), f"{title}: mean rank over {len(scen)} scenarios",
                                      plot_dir / f"across_models_cd_{file_slug(budget)}_{rank:g}.png")
        written.append(p)
        md += [f"![critical difference diagram](plots/{p.name})", ""]
    return md


def across_models_section(grouped: dict, ref: str, display, plot_dir: Path, written: list,
                          flat_rows: list) -> list[str]:
    """The section, or nothing when no budget was run on two or more models."""
    shared = shared_sections(grouped)
    if not shared:
        return []
    md = ["## Across models", "",
          f"- per method and task: each model's paired difference to `{ref}` with its own verdict (as its own table "
          "has it), the direction in each model, in how many models it is significantly better (or worse) after "
          "Holm's correction across the models, the common-effect (fixed, inverse-variance) pooled difference "
          "[95 % interval], which assumes the models share one true difference, and for accuracy every model's "
          "items at once (McNemar's exact test on the pooled discordant pairs, stratified by model). Random effects "
          f"(DerSimonian-Laird with the Hartung-Knapp-Sidik-Jonkman t interval, τ², I²) only from "
          f"{RANDOM_EFFECTS_MIN_K} models: with two, the between-model variance has one degree of freedom and "
          f"cannot be estimated, so no verdict rests on it. * marks p < {ALPHA}.", ""]
    for key, models in shared.items():
        cells = [c for m in models for cs in grouped[m]["ranks"][(*key, ALL_GROUPS)].values() for c in cs]
        columns = metric_columns(cells + [c for m in models for c in grouped[m]["dense"]], display)
        chance = at_chance(grouped, models, columns)
        title = budget_title(*key)
        md += [f"### {title}: {len(models)} models ({', '.join(models)})", ""]
        if chance:
            md += ["- at chance, so left out of the pooled verdicts and the ranking: "
                   + ", ".join(f"{t} on {m}" for m, t in sorted(chance)), ""]
        rows = pooled_rows(grouped, key, models, columns, ref, chance, getattr(display, "margins", None))
        if rows:
            md += [pooled_table(rows, models, ref), ""]
        else:
            md += [f"- no method can be paired with `{ref}` on the same items in two or more models", ""]
        for r in rows:
            ce, pl, ex = r["common"], r["pooled"], r["exact"]
            hk = pl["hartung_knapp"] if pl else None
            flat_rows.append({"model": "across models", "budget": key[0], "rank": key[1], "scope": ALL_GROUPS,
                              "method": r["method"], "task": r["column"].task, "reference": ref,
                              "models": len(r["per_model"]), "better in": r["better"],
                              "significantly better in (Holm)": r["holds"],
                              "significantly worse in (Holm)": r["reversed"],
                              "common Δ": ce["estimate"], "common Δ lo": ce["ci95"][0], "common Δ hi": ce["ci95"][1],
                              "common Δ p": ce["p"],
                              "pooled Δ": pl["estimate"] if pl else None, "pooled Δ lo": pl["ci95"][0] if pl else None,
                              "pooled Δ hi": pl["ci95"][1] if pl else None, "pooled Δ p": pl["p"] if pl else None,
                              "tau2": pl["tau2"] if pl else None, "I2": pl["i2"] if pl else None,
                              "stratified Δ": ex["diff"] if ex else None, "stratified p": ex["p"] if ex else None,
                              "Hartung-Knapp lo": hk["ci95"][0] if hk else None,
                              "Hartung-Knapp hi": hk["ci95"][1] if hk else None,
                              "Hartung-Knapp p": hk["p"] if hk else None})
        scen, left, mixed = scenarios(grouped, key, models, columns, chance)
        if mixed:
            md += ["- left out of the ranking, its methods scored on different items (a rerun at other sizes): "
                   + ", ".join(mixed), ""]
        md += ranking_lines(key, scen, left, title, plot_dir, written)
    return md
