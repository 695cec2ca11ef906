"""The 2025 baselines against the methods before them, at matched compute (multiply-adds per token half of dense's),
on both embedded models: `python -m studies.baselines` computes the missing cells (bench.sweep) and writes
docs/baselines.md from the stored cells.

Each family at compute 0.5: activation sparsity at density 0.5 (act-sparse, TEAL, act-sparse:score=wina; WINA as its
authors run it, R-Sparse), LaRoSa there and at the density whose compute, its rotations included, is 0.5 (the
rows with the lower density); CATS at density 0.5 of the MLP activation (attention and gate stay dense, so its
compute is well above 0.5 and cannot reach it) against TEAL and act-sparse at CATS's own compute; weight sparsity at
density 0.5 (Wanda, SparseGPT); low-rank at parameter ratio 0.5 (pca, whitened-svd, fasc-kfac, SVD-LLM V2). Every
comparison is paired on the same items within a model: LAMA P@1 (McNemar's exact interval) and perplexity (Δ mean
per-window NLL, bootstrap interval), the new method minus the old one."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tabulate import tabulate

from core.record import DENSE, CellRecord
from core.significance import above_chance, compare

MODELS = ("gemma-3-270m", "smollm2-135m")
COMPUTE = 0.5
ACTIVATION_OLD = ("act-sparse", "teal", "act-sparse:score=wina")
ACTIVATION_NEW = ("wina", "r-sparse", "larosa", "cats")
CATS_OLD = ("teal", "act-sparse")  # CATS against these at its own compute (it cannot reach 0.5)
WEIGHT_OLD, WEIGHT_NEW = ("wanda", "magnitude-prune"), ("sparsegpt",)
LOW_RANK_OLD, LOW_RANK_NEW = ("pca", "whitened-svd", "fasc-kfac"), ("svd-llm-v2",)
TASKS = ("lama", "ppl-token")


def matched_density(model: str, method: str, compute: float = COMPUTE) -> float:
    """The density at which `method`'s compute ratio (as bench plan prices it) is `compute`, to 1e-3 (bisection)."""
    from bench.measure.costs import estimate_costs
    from core.stats import SparsitySpec

    def ratio(d: float) -> float:
        p = SparsitySpec(density=d)
        return estimate_costs(model, [method], [], sparsity=[p]).sparse[method][p.label]["compute_ratio"]

    lo, hi = 0.01, 1.0
    while hi - lo > 1e-3:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ratio(mid) < compute else (lo, mid)
    return round(lo, 3)


def compute_of(model: str, method: str, density: float) -> float:
    """`method`'s compute ratio at `density` on `model`, as bench plan prices it, to 3 decimals."""
    from bench.measure.costs import estimate_costs
    from core.stats import SparsitySpec

    p = SparsitySpec(density=density)
    return round(estimate_costs(model, [method], [], sparsity=[p]).sparse[method][p.label]["compute_ratio"], 3)


def sweep(models, output: str) -> list[CellRecord]:
    import bench

    cells = []
    common = {"model": list(models), "tasks": list(TASKS), "measure_latency": False, "output": output,
              "report": False}
    cells += bench.sweep(methods=[*ACTIVATION_OLD, *ACTIVATION_NEW, *WEIGHT_OLD, *WEIGHT_NEW],
                         sparsity=[str(COMPUTE)], **common)
    for m in models:  # LaRoSa's matched density is the model's own; the older methods at CATS's compute too
        cells += bench.sweep(**{**common, "model": [m]}, methods=["larosa"],
                             sparsity=[str(matched_density(m, "larosa"))])
        cells += bench.sweep(**{**common, "model": [m]}, methods=list(CATS_OLD),
                             sparsity=[str(compute_of(m, "cats", COMPUTE))])
    cells += bench.sweep(methods=[*LOW_RANK_OLD, *LOW_RANK_NEW], rank=[COMPUTE], budget="params", **common)
    return [CellRecord.from_json(c) for c in cells]


def _fmt(d) -> str:
    if not d:
        return ""
    star = " *" if d["p"] < 0.05 else ""
    return f"{d['diff']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]{star}"


def tables(cells: list[CellRecord]) -> list[str]:
    """Per model (as its cells name it, in the order they come), each new method against the older ones of its
    family."""
    models = list(dict.fromkeys(c.cell.model for c in cells))
    by, ranks = {}, {}
    for c in cells:
        if c.cell.method == DENSE or c.cell.rank == COMPUTE:
            by[(c.cell.model, c.cell.method, c.cell.task)] = c
        else:  # LaRoSa at its matched density, the older methods at CATS's
            by[(c.cell.model, f"{c.cell.method}@{c.cell.rank:g}", c.cell.task)] = c
            ranks.setdefault(c.cell.model, []).append(f"{c.cell.method}@{c.cell.rank:g}")
    lines = []
    for model in models:
        dense = {t: by.get((model, DENSE, t)) for t in TASKS}
        chance = above_chance(dense["lama"]) if dense["lama"] else None
        lines += [f"### {model}", "",
                  f"Dense: LAMA P@1 {dense['lama'].metrics['p@1']:.3f}" if dense["lama"] else "Dense: no LAMA cell",
                  f"({'above' if chance and chance['above'] else 'at'} chance {chance['chance']:.3f}), "
                  f"perplexity {dense['ppl-token'].metrics['ppl']:.2f}." if chance and dense["ppl-token"] else "", ""]
        rows = []
        matched = tuple(sorted(set(ranks.get(model, []))))
        at_cats = tuple(k for k in matched if k.partition("@")[0] in CATS_OLD)
        rotated = tuple(k for k in matched if k not in at_cats)
        for new_set, old_set in (([n for n in ACTIVATION_NEW if n != "cats"] + list(rotated), ACTIVATION_OLD),
                                 (("cats",), at_cats), (WEIGHT_NEW, WEIGHT_OLD), (LOW_RANK_NEW, LOW_RANK_OLD)):
            for new in new_set:
                n_lama, n_ppl = by.get((model, new, "lama")), by.get((model, new, "ppl-token"))
                if not (n_lama and n_ppl):
                    continue
                comp = n_ppl.compression or {}
                for old in old_set:
                    o_lama, o_ppl = by.get((model, old, "lama")), by.get((model, old, "ppl-token"))
                    if not (o_lama and o_ppl):
                        continue
                    rows.append([new, f"{n_ppl.cell.rank:g}", f"{comp.get('compute_ratio', float('nan')):.3f}",
                                 f"{n_lama.metrics['p@1']:.3f}", f"{n_ppl.metrics['ppl']:.2f}", old,
                                 f"{(o_ppl.compression or {}).get('compute_ratio', float('nan')):.3f}",
                                 f"{o_lama.metrics['p@1']:.3f}", f"{o_ppl.metrics['ppl']:.2f}",
                                 _fmt(compare(o_lama, n_lama)), _fmt(compare(o_ppl, n_ppl))])
        lines += [tabulate(rows, headers=["new", "budget", "compute", "P@1", "ppl", "vs", "compute", "P@1", "ppl",
                                          "Δ P@1 new − old [95 %]", "Δ NLL new − old [95 %]"],
                           tablefmt="github", disable_numparse=True), ""]
    return lines


def main(argv=None) -> int:
    from core.errors import UserError
    from core.io import atomic_write_text

    ap = argparse.ArgumentParser(prog="python -m studies.baselines", description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--output", default="studies/cells/baselines")  # committed with the page
    ap.add_argument("--doc", default="docs/baselines.md")
    a = ap.parse_args(argv)
    if not Path(a.doc).name.endswith(".md"):
        ap.error(f"--doc {a.doc!r}: give a markdown file (.md)")
    from studies import output_problem

    problem = output_problem(a.doc, "--doc") or output_problem(a.output, "--output", folder=True)
    if problem:  # before the sweep, not after it
        ap.error(problem)
    try:
        cells = sweep(a.models, a.output)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    envs = sorted((c.env for c in cells if c.env), key=lambda e: str(e.get("date", "")))
    env = envs[-1] if envs else {}
    # cells computed at different times name each commit they came from, oldest first
    commits = ", ".join(dict.fromkeys(str(e.get("git_commit", "?"))[:7] for e in envs)) or "?"
    text = ["# The 2025 baselines at matched compute", "",
            f"Generated by `python -m studies.baselines` from the cells under `{a.output}/` (acbench commit(s) "
            f"{commits}; latest {str(env.get('date', '?'))[:10]}, {env.get('cpu_threads', '?')} "
            "threads); do not edit by hand.", "", __doc__.split("\n\n", 1)[1].replace("\n", " "), "",
            "`*` marks p < 0.05; a positive Δ P@1 and a negative Δ NLL favour the new method. Compute is the "
            "multiply-adds per token over dense's, as the cell records it.", "", *tables(cells)]
    try:
        atomic_write_text(Path(a.doc), "\n".join(text) + "\n")
    except OSError as e:
        print(f"error: cannot write {a.doc} ({e.strerror or e}): pass a writable --doc", file=sys.stderr)
        return 2
    print(f"wrote {a.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
