"""Every published ordering acbench's baselines come with, tested in their authors' conditions on both embedded
models: `python -m acbench.studies.reproductions` computes the missing cells (each method at its paper's calibration size
and mode, `--calibration authors`; a method whose authors state none at the run's default) and writes
docs/reproductions.md from every stored cell.

Each row is one claim on one model: the paper, its model and setting, its reported numbers and the ordering it
claims, and acbench's paired difference on the same items (perplexity: per-window mean NLL; LAMA: P@1), its 95 %
interval, its p-value before and after Holm's correction across every comparison on the page, the smallest
difference the comparison had 80 % power to detect, and a verdict: *reproduces* (the corrected test rejects zero on
the claimed side, or, for a claim that two methods are level, two one-sided tests put them within the margin),
*contradicts* (it rejects on the other side, or the level pair differs), or *not detected* (a difference up to the
detectable one could have been missed). Every contradiction names what in its
conditions differs from the authors' (calibration size, mode, a budget that destroys the model), or is an open
question where nothing does but the model's size. A part is one model's claims (`--models`); its cells go to
`studies/cells/reproductions/`, committed with them."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from acbench.core.meta_analysis import holm
from acbench.core.record import DENSE, CellRecord, calibration_mode
from acbench.core.significance import ALPHA, above_chance, compare

from acbench.studies import Side, find, ranks_clipped_to_one

MODELS = ("smollm2-135m", "gemma-3-270m")
ROOT = Path("studies/cells/reproductions")
TASKS = ("ppl-token", "lama")
# the margin within which two methods count as level: nats of mean NLL (perplexity within 2 %), points of P@1
MARGIN = {"ppl-token": 0.02, "lama": 0.02}
DESTROYED = 5.0  # a side whose perplexity is this many times dense's: the budget destroys the model


@dataclass(frozen=True)
class Claim:
    paper: str
    setting: str  # the authors' model and setting
    reported: str  # their numbers
    better: Side
    worse: Side  # for a level claim: the other side
    task: str = "ppl-token"
    level: bool = False  # the claim is that the two are level, not ordered


# SVD-LLM as its code compresses: each weight matrix on its own (acbench's whitened-svd shares one basis across
# the weights that read one input, q/k/v and gate/up, which at a parameter budget keeps more rank)
SVD_LLM = "whitened-svd:per_site=true"


def _s(method, budget):
    return Side(method, budget)


CLAIMS = (
    Claim("Wanda (Sun et al. 2024)", "LLaMA-7B, 50 % unstructured, WikiText-2", "SparseGPT 7.22, Wanda 7.26 "
          "(dense 5.68)", _s("sparsegpt", "density 0.5"), _s("wanda", "density 0.5"), level=True),
    Claim("Wanda (Sun et al. 2024)", "LLaMA-7B, 50 % unstructured, WikiText-2", "Wanda 7.26, magnitude 17.29",
          _s("wanda", "density 0.5"), _s("magnitude-prune", "density 0.5")),
    Claim("SparseGPT (Frantar and Alistarh 2023)", "LLaMA-7B 50 % (Wanda's table); OPT-175B ARC-e",
          "7.22 vs magnitude 17.29; ARC-e 69.65 vs 28.03", _s("sparsegpt", "density 0.5"),
          _s("magnitude-prune", "density 0.5")),
    Claim("SparseGPT (Frantar and Alistarh 2023)", "OPT-175B, ARC-e", "50 % unstructured 69.65, 2:4 67.08",
          _s("sparsegpt", "density 0.5"), _s("sparsegpt", "2:4")),
    Claim("Wanda (Sun et al. 2024)", "LLaMA-7B, 2:4 against unstructured 50 %", "2:4 costs more than 50 % "
          "unstructured", _s("wanda", "density 0.5"), _s("wanda", "2:4")),
    Claim("SVD-LLM V2 (Wang et al. 2025)", "LLaMA-7B, 20 % compression, WikiText-2", "V2 7.12, SVD-LLM 7.94 "
          "(dense 5.68)", _s("svd-llm-v2", "params 0.8"), _s(SVD_LLM, "params 0.8")),
    Claim("SVD-LLM V2 (Wang et al. 2025)", "V2 ahead at every ratio (10 % compression here)", "V2 ahead of SVD-LLM "
          "at 20-80 %", _s("svd-llm-v2", "params 0.9"), _s(SVD_LLM, "params 0.9")),
    Claim("SVD-LLM (Wang et al. 2025)", "LLaMA-7B, 20 % compression, WikiText-2", "SVD-LLM 7.94, ASVD 11.14",
          _s(SVD_LLM, "params 0.8"), _s("asvd", "params 0.8")),
    Claim("SVD-LLM V2 (Wang et al. 2025)", "LLaMA-7B, 20 % compression, WikiText-2", "V2 7.12, ASVD 11.14",
          _s("svd-llm-v2", "params 0.8"), _s("asvd", "params 0.8")),
    Claim("SVD-LLM (Wang et al. 2025)", "LLaMA-7B, 20 % compression, WikiText-2", "ASVD 11.14, SVD 20,061",
          _s("asvd", "params 0.8"), _s("svd", "params 0.8")),
    Claim("FASC (the paper acbench tests, docs/claims.md)", "knowledge retained at the same rank", "6-8 points "
          "of factual recall over PCA", _s("fasc", "rank 0.75"), _s("pca", "rank 0.75"), task="lama"),
    Claim("FASC (docs/claims.md)", "knowledge retained at the same rank", "ahead of whitened SVD",
          _s("fasc", "rank 0.75"), _s("whitened-svd", "rank 0.75"), task="lama"),
    Claim("TEAL (Liu et al. 2025)", "Llama-2/3, Mistral; calibrated thresholds for a magnitude top-k", "40-50 % "
          "model-wide sparsity with minimal degradation", _s("teal", "density 0.5"), _s("act-sparse", "density 0.5"),
          level=True),
    Claim("R-Sparse (Zhang et al. 2025)", "Llama-2-7B, 50 %, ten tasks", "R-Sparse 64.06 (dense 65.88); ahead of "
          "sparse-only (TEAL-like) in its ablation, 67.50 vs 66.25", _s("r-sparse", "density 0.5"),
          _s("teal", "density 0.5")),
    Claim("LaRoSa (Liu et al. 2025)", "LLaMA2-7B, 40 % sparsity", "+1.77 % over TEAL, perplexity gap 0.17",
          _s("larosa", "density 0.5"), _s("teal", "density 0.5")),
    Claim("CATS (Lee et al. 2024)", "Mistral-7B, Llama2-7B, 50 % MLP activation sparsity", "within 1-2 % of base",
          _s("cats", "density 0.5"), _s(DENSE, ""), level=True),
    Claim("LaRoSa (Liu et al. 2025)", "LLaMA2-7B, 40 % sparsity", "+17.14 % over CATS", _s("larosa", "density 0.5"),
          _s("cats", "density 0.5")),
    Claim("WINA (Chen et al. 2025)", "Qwen-2.5-7B and others, 25-65 %", "up to +2.94 % over TEAL",
          _s("wina", "density 0.5"), _s("teal", "density 0.5")),
    Claim("N:M study (arXiv 2509.22166)", "4-8B models, activation sparsity", "16:32 close to unstructured 50 %",
          _s("act-sparse", "16:32"), _s("act-sparse", "density 0.5"), level=True),
    Claim("N:M study (arXiv 2509.22166)", "4-8B models, activation sparsity", "16:32 about 2.7x better than 2:4",
          _s("act-sparse", "16:32"), _s("act-sparse", "2:4")),
)


def sides() -> dict[tuple, list[str]]:
    """{(budget keywords as a sorted tuple, tasks): methods} over every claim's sides and docs/baselines.md's (its
    page reads these cells too), dense aside: each method is scored only on the tasks its claims read (a sequential
    calibration of 262,144 tokens is not run twice)."""
    from acbench.studies.baselines import TASK as BASELINES_TASK, sides as baseline_sides

    wanted = [(side, claim.task) for claim in CLAIMS for side in (claim.better, claim.worse)]
    wanted += [(Side(m, b), BASELINES_TASK) for m, b in baseline_sides()]
    tasks: dict = {}
    for side, task in wanted:
        if side.method != DENSE:
            budget = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in
                                  side.sweep_budget().items()))
            tasks.setdefault((budget, side.method), set()).add(task)
    out: dict = {}
    for (budget, method), needed in tasks.items():
        out.setdefault((budget, tuple(t for t in TASKS if t in needed)), []).append(method)
    return out


def calibration_cost(method: str) -> int:
    """A sweep's order key: the tokens its authors' calibration reads, a sequential one counted four times (two
    block forwards per block, and no calibration shared with another method); 0 for the run's default."""
    from acbench import methods

    authors = methods.get_method(methods.base_name(method)).authors_calibration
    if not authors:
        return 0
    return authors.samples * authors.seq_len * (4 if authors.mode == "sequential" else 1)


def run_part(model: str, root: Path, progress: bool = True) -> None:
    """One model's cells: every claim's methods at their budgets, each in its authors' calibration; the cheapest
    calibrations first, so that a part stopped early has measured the most claims it could."""
    import acbench

    jobs = []
    for (key, tasks), names in sides().items():
        budget = {k: list(v) if isinstance(v, tuple) else v for k, v in key}
        common = {"model": model, "tasks": list(tasks), "measure_latency": False, "report": False,
                  "output": str(root), "progress": progress, **budget}
        for cost in sorted({calibration_cost(m) for m in names}):
            jobs.append((cost, [m for m in names if calibration_cost(m) == cost], common))
    # the statistics cache kept: whitened SVD's one-pass 524,288 tokens serve its three budgets (each its own sweep)
    for cost, names, common in sorted(jobs, key=lambda j: j[0]):
        acbench.sweep(methods=names, **({"calibration": "authors"} if cost else {}), cache=True, **common)


def conditions(c: CellRecord) -> list[str]:
    """What in a cell's calibration differs from its method's authors'."""
    cal = c.calibration or {}
    spec, authors = cal.get("spec") or {}, cal.get("authors")
    if not isinstance(authors, dict):
        return []
    out = []
    got, theirs = spec.get("samples", 0) * spec.get("seq_len", 0), authors["samples"] * authors["seq_len"]
    if got < theirs:
        out.append(f"{c.cell.method} calibrated on {got:,} tokens, its authors on {theirs:,}")
    if calibration_mode(cal) != authors.get("mode"):
        out.append(f"{c.cell.method} {calibration_mode(cal)}, its authors {authors.get('mode')}")
    if cal.get("short"):
        out.append(f"{c.cell.method}'s calibration short for {cal['short']['groups']} groups")
    return out


def verdict(claim: Claim, better: CellRecord, worse: CellRecord, dense: CellRecord | None, d: dict,
            p_holm: float) -> dict:
    """The paired difference `d` (compare(worse, better)) in the claimed direction (positive: the claim's better
    side is better), its interval, p before and after Holm's correction across the page, the detectable difference
    and the verdict, with the cause of a contradiction. Level claims: two one-sided tests (the 90 % interval inside
    the margin) reproduce them."""
    lower_better = claim.task == "ppl-token"
    sign = -1.0 if lower_better else 1.0  # an NLL that falls is an improvement
    diff, lo, hi = sign * d["diff"], *sorted(sign * x for x in d["ci95"])
    lo90, hi90 = sorted(sign * x for x in d.get("ci90", d["ci95"]))
    mde = d["detectable"]
    out = {"diff": diff, "ci95": (lo, hi), "p": d["p"], "p_holm": p_holm, "detectable": mde}
    margin = MARGIN[claim.task]
    decided = p_holm < ALPHA
    if claim.level and -margin < lo90 and hi90 < margin:
        out["verdict"] = f"reproduces (level within {margin:g})"
    elif claim.level and decided:
        out["verdict"] = "contradicts (they differ)"
    elif not claim.level and decided:
        out["verdict"] = "reproduces" if diff > 0 else "contradicts"
    else:
        out["verdict"] = f"not detected (could miss {mde:.3f})"
    if out["verdict"].startswith("contradicts"):
        out["cause"] = cause(claim, better, worse, dense)
    if claim.task == "lama" and dense is not None:
        chance = above_chance(dense)
        if chance and not chance["above"]:
            out["verdict"] += "; dense LAMA at chance"
    return out


COMPUTE_GAP = 0.05  # compute ratios further apart than this: the two sides do not cost the same


def cause(claim: Claim, better: CellRecord, worse: CellRecord, dense: CellRecord | None) -> str:
    found = conditions(better) + conditions(worse)
    for c in (better, worse):
        if clipped := ranks_clipped_to_one(c):
            found.append(f"{c.cell.method}'s allocation clipped {', '.join(clipped)} to rank 1")
    costs = [(c.cell.method, (c.compression or {}).get("compute_ratio")) for c in (better, worse)
             if c.cell.method != DENSE]
    if len(costs) == 2 and all(isinstance(v, (int, float)) for _, v in costs) and \
            abs(costs[0][1] - costs[1][1]) > COMPUTE_GAP:
        found.append("unequal compute (" + ", ".join(f"{m} {v:.2f}" for m, v in costs) + " of dense's)")
    if claim.task == "ppl-token" and dense is not None:
        base = dense.metrics["ppl"]
        gone = [c.cell.method for c in (better, worse)
                if c.cell.method != DENSE and c.metrics["ppl"] > DESTROYED * base]
        if gone:
            found.append(f"budget destroys the model ({', '.join(gone)} above {DESTROYED:g}x dense perplexity)")
    return "; ".join(found) if found else "open question: conditions as the authors'; the model is 25-50x smaller"


def rows(cells: list[CellRecord], models: list[str] | None = None) -> list[list[str]]:
    """One row per claim and model (default: the models the cells hold); Holm's correction across every
    comparison the page measures."""
    found = []
    models = models or list(dict.fromkeys(c.cell.model for c in cells))
    for claim in CLAIMS:
        for model in models:
            dense = find(cells, model, Side(DENSE, ""), claim.task)
            better = dense if claim.better.method == DENSE else find(cells, model, claim.better, claim.task)
            worse = dense if claim.worse.method == DENSE else find(cells, model, claim.worse, claim.task)
            d = compare(worse, better) if better is not None and worse is not None else None
            found.append((claim, model, dense, better, worse, d))
    adjusted = iter(holm([f[5]["p"] for f in found if f[5] is not None]))
    out = []
    for claim, model, dense, better, worse, d in found:
        relation = "level with" if claim.level else "better than"
        head = [claim.paper, claim.setting, claim.reported, f"{claim.better.label} {relation} "
                f"{claim.worse.label if claim.worse.method != DENSE else 'dense'}", claim.task, model]
        if better is None or worse is None:
            out.append(head + ["", "", "", "", "", "not yet measured", ""])
            continue
        if d is None:
            out.append(head + ["", "", "", "", "", "not paired (the cells scored different items)", ""])
            continue
        v = verdict(claim, better, worse, dense, d, next(adjusted))
        out.append(head + [f"{v['diff']:+.3f}", f"[{v['ci95'][0]:+.3f}, {v['ci95'][1]:+.3f}]", f"{v['p']:.2g}",
                           f"{v['p_holm']:.2g}", "" if v["detectable"] is None else f"{v['detectable']:.3f}",
                           v["verdict"], v.get("cause", "")])
    return out


def render(cells: list[CellRecord], root: Path) -> str:
    from tabulate import tabulate

    envs = sorted((c.env for c in cells if c.env), key=lambda e: str(e.get("date", "")))
    commits = ", ".join(dict.fromkeys(str(e.get("git_commit", "?"))[:7] for e in envs)) or "?"
    every = list(dict.fromkeys([*MODELS, *(c.cell.model for c in cells)]))  # measured or not yet
    table = tabulate(rows(cells, every), headers=["paper", "their setting", "they report", "claim", "task", "model",
                                           "Δ (claimed direction)", "95 % interval", "p", "Holm p", "detectable",
                                           "verdict",
                                           "cause of a contradiction"], tablefmt="github", disable_numparse=True)
    return "\n".join([
        "# Published orderings, tested in their authors' conditions", "",
        f"Generated by `python -m acbench.studies.reproductions` from the cells under `{root}/` (acbench commit(s) "
        f"{commits}); do not edit by hand.", "", __doc__.split("\n\n", 1)[1].replace("\n", " "), "",
        "Δ is in the claim's favour when positive: nats of mean NLL saved (perplexity) or points of P@1 gained "
        "(LAMA), by the claim's better side over its other side, on the same items. *Detectable*: the difference "
        "this comparison had 80 % power to detect (two-sided 5 %), from its measured paired spread and count. "
        f"Level margins: {MARGIN['ppl-token']} nats, {MARGIN['lama']} P@1.", "", table, ""])


def main(argv=None) -> int:
    from acbench.core.errors import UserError
    from acbench.core.io import atomic_write_text
    from acbench.leaderboard.load import read_result_set

    ap = argparse.ArgumentParser(prog="python -m acbench.studies.reproductions", description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--root", default=str(ROOT))
    ap.add_argument("--doc", default="docs/reproductions.md")
    ap.add_argument("--report-only", action="store_true", help="write the page from the stored cells, compute nothing")
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    a = ap.parse_args(argv)
    from acbench.studies import refuse_bad_models, refuse_unwritable

    refuse_unwritable(ap, a.doc, {"--root": a.root})
    refuse_bad_models(ap, a.models)
    root = Path(a.root)
    if not a.report_only:
        try:
            for model in a.models:
                print(f"part: {model}", flush=True)
                run_part(model, root, progress=not a.quiet)
        except UserError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    cells = read_result_set(root).cells if root.is_dir() else []
    atomic_write_text(Path(a.doc), render(cells, root))
    print(f"wrote {a.doc}")
    return 0


if __name__ == "__main__":
    from acbench.core.log import console_lines

    with console_lines():  # a script: acbench's lines on its stdout
        sys.exit(main())
