"""The FASC paper's headline claim as a study: at a given rank, Fisher-aligned subspaces (fasc-kfac, fasc) keep more
knowledge than variance-based ones (pca, whitened-svd), measured on MMLU (cloze form), LAMA and perplexity, on both
embedded models at several ranks. `make claims` (python -m acbench.studies.claims) computes the missing cells with
`acbench.sweep` and writes docs/claims.md and its figure from the stored cells.

Each comparison is paired on the same items within a model (McNemar's exact test for accuracy, per-window NLL
differences for perplexity), over the models where dense is above chance. The verdict per (rank, benchmark, pair)
is each model's own, counted: "holds in k of n" where the claim is significant in k of the n models after Holm's
correction across every per-model test the study reports, "reversed in k of n" where the opposite is, else "not
detected" with the largest difference a model's comparison could have missed (80 % power, two-sided 5 %). Beside
it, the common-effect (fixed) pooled difference, labelled so: two models cannot estimate the between-model
variance a random-effects verdict needs (random effects from three models on)."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tabulate import tabulate

from acbench.core.meta_analysis import RANDOM_EFFECTS_MIN_K, common_effect, dersimonian_laird, holm, paired_effect
from acbench.core.record import DENSE, CellRecord
from acbench.core.significance import ALPHA, above_chance, compare, item_scores

MODELS = ("gemma-3-270m", "smollm2-135m")
RANKS = (0.9, 0.75, 0.5)
CLAIMANTS = ("fasc-kfac", "fasc")
BASELINES = ("pca", "whitened-svd")
# task -> (label, metric shown, higher is better)
TASKS = {"mmlu": ("MMLU (cloze, acc_norm)", "acc_norm", True), "lama": ("LAMA P@1", "p@1", True),
         "ppl-token": ("perplexity", "ppl", False)}
# MMLU questions per subject: 10 x 57 subjects = 570 per model (docs/claims.md states the power this buys)
MMLU_LIMIT = 10
PAPER_GAP = "6-8 points of MMLU and LAMA accuracy at 50 % rank (Mistral-7B, Llama-3-8B)"


@dataclass(frozen=True)
class Settings:
    models: tuple[str, ...] = MODELS
    ranks: tuple[float, ...] = RANKS
    mmlu_limit: int = MMLU_LIMIT
    output: str = "studies/cells/claims"  # committed with the page, so that it can be regenerated
    doc: str = "docs/claims.md"


def sweep_keywords(s: Settings) -> dict:
    """acbench.sweep's keywords for the study: `bench run --model M... --methods fasc-kfac fasc pca whitened-svd
    --rank R... --tasks mmlu lama ppl-token --mmlu-format cloze --mmlu-limit N --no-latency --output DIR`."""
    return {"model": list(s.models), "methods": [*CLAIMANTS, *BASELINES], "rank": list(s.ranks),
            "tasks": list(TASKS), "mmlu_format": "cloze", "mmlu_limit": s.mmlu_limit, "measure_latency": False,
            "output": s.output}


def compute_cells(s: Settings) -> list[CellRecord]:
    """Every cell the study reads: computed where missing, read back where stored (acbench.sweep)."""
    import acbench

    return [CellRecord.from_json(c) for c in acbench.sweep(**sweep_keywords(s))]


def index(cells: list[CellRecord]) -> dict[tuple, CellRecord]:
    """{(model, method, rank, task): cell}; the dense cells under rank None."""
    return {(c.cell.model, c.cell.method, c.cell.rank, c.cell.task): c for c in cells if not c.cell.is_analysis}


def above_chance_models(cells: dict, models, task: str) -> list[str]:
    """The models whose dense score on `task` can be compared: all for perplexity, for accuracy those significantly
    above chance (a model at chance has no knowledge to lose)."""
    out = []
    for m in models:
        dense = cells.get((m, DENSE, None, task))
        if dense is None:
            continue
        verdict = above_chance(dense)
        if verdict is None or verdict["above"]:
            out.append(m)
    return out


def comparison(cells: dict, models, rank: float, task: str, claimant: str, baseline: str) -> dict:
    """claimant - baseline per model (paired, with the difference it could detect), the common-effect pooled
    difference (two or more models; random effects from RANDOM_EFFECTS_MIN_K), and the verdict with Holm's
    correction across these models (write_doc corrects across the whole study instead)."""
    per = {}
    for m in above_chance_models(cells, models, task):
        ref, other = cells.get((m, baseline, rank, task)), cells.get((m, claimant, rank, task))
        shown = compare(ref, other) if ref and other else None
        if shown is None:
            continue
        diff, var = paired_effect(item_scores(ref)[1], item_scores(other)[1])
        per[m] = {"shown": shown, "diff": diff, "var": var, "detectable": shown["detectable"]}
    out = {"rank": rank, "task": task, "claimant": claimant, "baseline": baseline, "per_model": per,
           "common": None, "pooled": None, "interval": None, "detectable": None}
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
    for p, q in zip(per.values(), holm([p["shown"]["p"] for p in per.values()])):
        p["holm_p"] = q
    out["verdict"] = verdict(out, TASKS[task][2])
    return out


def verdict(r: dict, higher: bool) -> str:
    """From each model's Holm-adjusted p and direction: 'holds in k of n', 'reversed in k of n', both when models
    disagree, else 'not detected' (with what it could miss); 'at chance' when no model can be compared."""
    per = r["per_model"]
    if not per:
        return "at chance"
    claimed = sum(p["holm_p"] < ALPHA and (p["shown"]["diff"] > 0) == higher for p in per.values())
    against = sum(p["holm_p"] < ALPHA and p["shown"]["diff"] != 0 and (p["shown"]["diff"] > 0) != higher
                  for p in per.values())
    parts = ([f"holds in {claimed} of {len(per)}"] if claimed else []) + \
        ([f"reversed in {against} of {len(per)}"] if against else [])
    if parts:
        return ", ".join(parts)
    miss = r.get("detectable")
    return "not detected" + (f" (could miss {fmt_float(miss, r['task'])})" if miss is not None else "")


def correct_across_study(rows: list[dict]) -> int:
    """Holm's correction across every per-model test the study reports, each row's verdict re-read from it; returns
    the number of tests in that family."""
    tests = [p for r in rows for p in r["per_model"].values()]
    for p, q in zip(tests, holm([p["shown"]["p"] for p in tests])):
        p["holm_p"] = q
    for r in rows:
        r["verdict"] = verdict(r, TASKS[r["task"]][2])
    return len(tests)


def scale(task: str) -> float:
    return 100.0 if TASKS[task][2] else 1.0  # accuracy in points, perplexity as Δ mean NLL (nats)


def fmt(x: float, task: str) -> str:
    return f"{x * scale(task):+.1f}" if TASKS[task][2] else f"{x:+.4f}"


def fmt_ci(est, ci, task: str, p=None) -> str:
    p_txt = f", p={p:.2g}" if p is not None else ""
    return f"{fmt(est, task)} [{fmt(ci[0], task)}, {fmt(ci[1], task)}{p_txt}]"


def verdict_rows(rows: list[dict], models) -> list[list[str]]:
    body = []
    for r in rows:
        task, per = r["task"], r["per_model"]
        cells = [fmt_ci(per[m]["shown"]["diff"], per[m]["shown"]["ci95"], task, per[m]["shown"]["p"])
                 + f", Holm {per[m]['holm_p']:.2g}" if m in per else "at chance" for m in models]
        common = r["common"]
        body.append([f"{r['rank']:g}", TASKS[task][0], f"{r['claimant']} − {r['baseline']}", *cells,
                     fmt_ci(common["estimate"], common["ci95"], task, common["p"]) if common else "",
                     fmt_float(r["detectable"], task) if r["detectable"] is not None else "",
                     r["verdict"]])
    return body


def fmt_float(x: float, task: str) -> str:
    return f"{x * scale(task):.1f}" if TASKS[task][2] else f"{x:.4f}"


AT_CHANCE = "†"  # beside an accuracy not significantly above its items' chance


def score_table(cells: dict, models, ranks) -> list[list[str]]:
    body = []
    for m in models:
        for method in (DENSE, *CLAIMANTS, *BASELINES):
            row = [m, method]
            for task, (_, metric, higher) in TASKS.items():
                for rank in ranks:  # dense: its one score under every rank, the reference of each
                    c = cells.get((m, method, None if method == DENSE else rank, task))
                    v = c.metrics.get(metric) if c else None
                    chance = above_chance(c) if c and higher else None
                    mark = AT_CHANCE if chance and not chance["above"] else ""
                    row.append("" if v is None else f"{100 * v:.1f}{mark}" if higher else f"{v:.2f}")
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
                xs = [r for r in ranks if (m, method, r, task) in cells]
                ys = [cells[(m, method, r, task)].metrics[metric] * (100 if higher else 1) for r in xs]
                ax.plot(xs, ys, marker="o", label=method, linestyle="-" if method in CLAIMANTS else "--")
            dense = cells.get((m, DENSE, None, task))
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


def summary_lines(rows: list[dict], ranks) -> list[str]:
    """One sentence per benchmark: where the claim holds, where it is reversed, where it is not detected."""
    out = []
    for task, (label, _, higher) in TASKS.items():
        mine = [r for r in rows if r["task"] == task]
        parts = []
        for state in ("holds", "reversed", "not detected", "at chance"):
            hits = [r for r in mine if r["verdict"].startswith(state)]
            if hits:
                parts.append(f"{state} for " + ", ".join(f"{r['claimant']} − {r['baseline']} at {r['rank']:g}"
                                                        for r in hits))
        unit = "points" if higher else "nats of mean NLL"
        detect = [r["detectable"] for r in mine if r["detectable"] is not None]
        power = (f"; 80 % power for differences of {fmt_float(min(detect), task)} to "
                 f"{fmt_float(max(detect), task)} {unit}" if detect else "")
        out.append(f"- **{label}**: " + "; ".join(parts) + power + ".")
    lost = [(r, m) for r in rows for m, p in r["per_model"].items() if p["shown"]["p"] < ALPHA <= p["holm_p"]]
    tests = sum(len(r["per_model"]) for r in rows)
    out.append(f"- Holm's correction across the study's {tests} per-model tests: "
               + ("; ".join(f"{TASKS[r['task']][0]} {r['claimant']} − {r['baseline']} at {r['rank']:g} on {m} "
                            f"(p = {r['per_model'][m]['shown']['p']:.2g})" for r, m in lost)
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
            d = by.get((m, DENSE, None, task))
            a = above_chance(d) if d else None
            if a:
                out.append(f"{m} {TASKS[task][0]}: {100 * a['acc']:.1f} % against chance {100 * a['chance']:.1f} % "
                           f"(one-sided p = {a['p']:.2g}: {'above chance' if a['above'] else 'at chance'})")
    return out


def write_doc(s: Settings, cells: list[CellRecord]) -> Path:
    from acbench.core.io import atomic_write_text

    by = index(cells)
    rows = [comparison(by, s.models, r, t, c, b) for r in s.ranks for t in TASKS for c in CLAIMANTS
            for b in BASELINES]
    correct_across_study(rows)
    doc = Path(s.doc)
    fig = figure(by, s.models, s.ranks, doc.parent / "plots" / f"{doc.stem}.png")
    seconds, env = compute_time(cells)
    n_mmlu = {m: len(by[(m, DENSE, None, "mmlu")].records) for m in s.models if (m, DENSE, None, "mmlu") in by}
    lama = next((c for c in cells if c.cell.task == "lama"), None)
    ppl = next((c for c in cells if c.cell.task == "ppl-token"), None)
    dense_lines = dense_chance_lines(by, s.models)
    models_txt = " and ".join(s.models)
    lines = [
        "# The FASC paper's claim, tested on the embedded models",
        "",
        f"Generated by `make claims` (`python -m acbench.studies.claims`) from the cells under `{s.output}/`; do not edit by "
        "hand. The claim: at the same rank, Fisher-aligned subspaces keep more of what a model knows than "
        f"variance-based ones; the paper reports {PAPER_GAP}. Here: fasc-kfac and fasc against pca and "
        f"whitened-svd on {models_txt}, at rank ratios {', '.join(f'{r:g}' for r in s.ranks)} (every input group "
        f"compressed, uniform ranks), on MMLU in cloze form ({', '.join(f'{m}: {n}' for m, n in n_mmlu.items())} "
        f"questions, {s.mmlu_limit} per subject, 0-shot, acc_norm), LAMA "
        f"({len(lama.records) if lama else 0} probes per model) and perplexity "
        f"({len(ppl.records) if ppl else 0} windows per model).",
        "",
        f"Compute: {seconds / 60:.0f} minutes of calibration, compression and evaluation summed over the cells "
        f"(each model's calibration counted once) on {env.get('cpu_threads', '?')} threads of "
        f"{env.get('cpu_model', 'an unnamed CPU')} ({env.get('device', 'cpu')}), acbench commit "
        f"{str(env.get('git_commit', '?'))[:7]}, {str(env.get('date', '?'))[:10]}.",
        "",
        "Dense: " + "; ".join(dense_lines) + ".",
        "",
        "## Verdict",
        "",
        "Each difference is the claimant's score minus the baseline's, paired on the same items (accuracy in "
        "points, McNemar's exact interval; perplexity as the difference of mean per-window NLL, where negative is "
        "better), on each model whose dense score is above chance, with its p-value and its Holm-adjusted p "
        "(Holm's step-down correction across every per-model test on this page). The verdict counts the models: "
        "\"holds in k of n\" where k models show the claim after the correction. The common-effect difference "
        "(fixed, inverse-variance) summarises the models under the assumption that they share one effect; with "
        "two models the between-model variance cannot be estimated, so no verdict rests on a pooled interval "
        "(random effects need three or more models). \"detectable\" is the largest of the models' differences "
        "their comparisons had 80 % power to detect (two-sided, 5 %; docs/decisions.md). The item counts are "
        "fixed in advance, not evaluated until decided: each test here is read at its Holm-adjusted level, which "
        "a run that stops at its first decision at 5 % (`bench run --until-decided`, docs/decisions.md) does not "
        "give; so each \"not detected\" names what its fixed count could have missed.",
        "",
        *summary_lines(rows, s.ranks),
        "",
        tabulate(verdict_rows(rows, s.models),
                 headers=["rank", "benchmark", "difference", *[f"{m} [95 %]" for m in s.models],
                          "common effect [95 %]", "detectable", "verdict"],
                 tablefmt="github", disable_numparse=True),
        "",
        "## Scores",
        "",
        f"MMLU and LAMA in %, perplexity as is; dense's one score stands under every rank. {AT_CHANCE}: at chance "
        "(not above the items' chance level by a one-sided binomial test at 5 %): such a score keeps no knowledge "
        "this test can see, and a difference between two of them says nothing about knowledge kept.",
        "",
        tabulate(score_table(by, s.models, s.ranks),
                 headers=["model", "method", *[f"{t} {r:g}" for t in ("MMLU", "LAMA", "ppl") for r in s.ranks]],
                 tablefmt="github", disable_numparse=True),
        "",
        f"![accuracy and perplexity against rank, per method and model](plots/{fig.name})",
        "",
        "## How this departs from the paper",
        "",
        "- Models of 135M and 270M parameters, not 7-8B: they know less, so there is less knowledge for a method "
        "to keep, and the ranks at which each method keeps most of it differ from the paper's.",
        "- MMLU in the cloze form OLMES uses for small models (a model this size answers the letter form at "
        "chance), on a stratified sample of the test set; LAMA is acbench's embedded fact set (docs/tasks.md).",
        "- Rank ratio is the fraction of each input group's dimension kept, for every group (docs/methods.md); "
        "calibration is acbench's default (12 windows of 256 tokens of the embedded text).",
    ]
    atomic_write_text(doc, "\n".join(lines) + "\n")
    return doc


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
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n}: give at least 1 question per subject")
    return n


def parse(argv=None) -> Settings:
    from acbench.studies import StudyParser

    ap = StudyParser(prog="python -m acbench.studies.claims", description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), help="models (bench run's --model)")
    ap.add_argument("--ranks", nargs="+", type=_rank, default=list(RANKS), help="rank ratios in (0, 1]")
    ap.add_argument("--mmlu-limit", type=_limit, default=MMLU_LIMIT, help="MMLU questions per subject")
    ap.add_argument("--output", default=Settings.output, help="the results folder of the study's cells")
    ap.add_argument("--doc", default=Settings.doc, help="the page to write (its figure goes to plots/ beside it)")
    a = ap.parse_args(argv)
    if len(set(a.ranks)) != len(a.ranks):
        ap.error("--ranks names a rank twice: give each once")
    from acbench.studies import refuse_bad_models, refuse_unwritable

    # before the sweep: an hour's cells never end in "cannot write the page"
    refuse_unwritable(ap, a.doc, {"--doc's figure folder": Path(a.doc).parent / "plots", "--output": a.output})
    refuse_bad_models(ap, a.models)
    return Settings(models=tuple(a.models), ranks=tuple(sorted(a.ranks, reverse=True)), mmlu_limit=a.mmlu_limit,
                    output=a.output, doc=a.doc)


def main(argv=None) -> int:
    from acbench.core.errors import UserError

    s = parse(argv)
    start = time.perf_counter()
    try:
        cells = compute_cells(s)
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
