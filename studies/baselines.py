"""The 2025 baselines against the methods before them, at their papers' budgets and in their authors' calibration,
on both embedded models. `python -m acbench.studies.baselines` writes docs/baselines.md from the cells the reproductions
study stores (`python -m acbench.studies.reproductions` computes the missing ones: one set of cells serves both pages).

Each family at the budget its papers report: activation sparsity at density 0.5 (WINA, R-Sparse, LaRoSa, CATS
against act-sparse and TEAL; CATS sparsifies the MLP activation only, so its compute stays well above 0.5); weight
sparsity at 50 % unstructured and 2:4 (SparseGPT against Wanda and magnitude); low-rank at parameter ratios 0.8 and
0.9, the papers' 20 % and 10 % compression (SVD-LLM V2 against SVD-LLM's whitened SVD, per matrix as its
code compresses and with one basis per input group as acbench's whitened-svd, ASVD, PCA and FASC-KFAC).
Each method is calibrated as its authors state (`--calibration authors`), the others at the run's default.
Quality is token perplexity, the papers' headline, on the default run's 16 windows of 256 tokens (the papers' own
2,048-token protocol, their recipes and their accuracy claims are docs/reproductions.md's): the paired difference of
per-window mean NLL, new minus old, on the same windows (negative favours the new method), with its interval, its verdict after Holm's correction across
the page's comparisons (docs/decisions.md), and the difference it could have missed."""

from __future__ import annotations

import sys
from pathlib import Path

from tabulate import tabulate

from acbench.core.meta_analysis import holm
from acbench.core.record import DENSE, CellRecord, calibration_label
from acbench.core.significance import compare, verdict

MODELS = ("smollm2-135m", "gemma-3-270m")
ROOT = Path("studies/cells/reproductions")
TASK = "ppl-token"
# the page reads the 16 windows of 256 tokens it was measured on (the reproductions study also stores 2,048-token ones)
TASK_OPTIONS = {"seq_len": 256, "max_windows": 16, "scored": None}
MARGIN = 0.02  # nats of mean NLL: the ppl-token task's default margin
DESTROYED = 5.0  # a row whose perplexity is this many times dense's: the budget destroys the model
ACTIVATION_OLD, ACTIVATION_NEW = ("act-sparse", "teal"), ("wina", "r-sparse", "larosa", "cats")
WEIGHT_OLD, WEIGHT_NEW = ("wanda", "magnitude-prune"), ("sparsegpt",)
# SVD-LLM in its code's per-matrix form, and acbench's whitened-svd, one basis per input group
LOW_RANK_OLD = ("whitened-svd:per_site=true", "whitened-svd", "asvd", "pca", "fasc-kfac")
LOW_RANK_NEW = ("svd-llm-v2",)
# (budget as the pages name it, new methods, older methods)
SECTIONS = (("density 0.5", ACTIVATION_NEW, ACTIVATION_OLD), ("density 0.5", WEIGHT_NEW, WEIGHT_OLD),
            ("2:4", WEIGHT_NEW, WEIGHT_OLD), ("params 0.8", LOW_RANK_NEW, LOW_RANK_OLD),
            ("params 0.9", LOW_RANK_NEW, LOW_RANK_OLD))


def sides() -> list[tuple[str, str]]:
    """Every (method, budget) the page reads, for the reproductions study to compute."""
    return list(dict.fromkeys((m, b) for b, new, old in SECTIONS for m in (*new, *old)))


def comparisons(cells: list[CellRecord], models) -> list[dict]:
    """Every (model, section, new, old) pair both of whose cells are stored, with its paired difference; Holm's
    correction across all of them, and each one's verdict from the corrected p."""
    from acbench.studies import Side, find

    out = []
    for model in models:
        dense = find(cells, model, Side(DENSE, ""), TASK, TASK_OPTIONS)
        for budget, new, old in SECTIONS:
            for n in new:
                a = find(cells, model, Side(n, budget), TASK, TASK_OPTIONS)
                for o in old:
                    b = find(cells, model, Side(o, budget), TASK, TASK_OPTIONS)
                    d = compare(b, a) if a and b else None
                    if d is not None:
                        out.append({"model": model, "budget": budget, "new": a, "old": b, "dense": dense, "d": d,
                                    "detectable": d["detectable"]})
    for r, q in zip(out, holm([r["d"]["p"] for r in out])):
        r["holm_p"] = q
        r["verdict"] = verdict({**r["d"], "p": q}, MARGIN, False)
    return out


def _ppl(c: CellRecord, dense: CellRecord | None) -> str:
    ppl = c.metrics.get("ppl")
    if not isinstance(ppl, (int, float)):
        return "?"
    gone = dense is not None and ppl > DESTROYED * dense.metrics["ppl"]
    return f"{ppl:,.2f}" + (" (destroyed)" if gone else "")


def _compute(c: CellRecord) -> str:
    v = (c.compression or {}).get("compute_ratio")
    return f"{v:.3f}" if isinstance(v, (int, float)) else ""


def tables(rows: list[dict], models) -> list[str]:
    lines = []
    for model in models:
        mine = [r for r in rows if r["model"] == model]
        if not mine:
            lines += [f"### {model}", "", "Not yet measured.", ""]
            continue
        dense = mine[0]["dense"]
        lines += [f"### {model}", "", f"Dense perplexity {dense.metrics['ppl']:.2f}." if dense else "", ""]
        body = []
        for r in mine:
            a, b, d = r["new"], r["old"], r["d"]
            word = r["verdict"] + (f" (could miss {r['detectable']:.3f})" if r["verdict"] == "undecided"
                                   and r["detectable"] is not None else "")
            body.append([r["budget"], a.cell.method, b.cell.method, _ppl(a, dense), _ppl(b, dense),
                         f"{_compute(a)} / {_compute(b)}", f"{d['diff']:+.3f} [{d['ci95'][0]:+.3f}, "
                         f"{d['ci95'][1]:+.3f}]", f"{d['p']:.2g}", f"{r['holm_p']:.2g}", word,
                         calibration_label(a.calibration) or "", calibration_label(b.calibration) or ""])
        lines += [tabulate(body, headers=["budget", "new", "vs", "ppl new", "ppl old", "compute new / old",
                                          "Δ NLL new − old [95 %]", "p", "Holm p", "verdict", "new calibrated on",
                                          "old calibrated on"], tablefmt="github", disable_numparse=True), ""]
        done = {(r["budget"], r["new"].cell.method, r["old"].cell.method) for r in mine}
        pending = [f"{n} vs {o} ({b})" for b, new, old in SECTIONS for n in new for o in old if (b, n, o) not in done]
        if pending:
            lines += [f"Not yet measured ({len(pending)}): {'; '.join(pending)}.", ""]
    return lines


def render(cells: list[CellRecord], root: Path, models=MODELS) -> str:
    envs = sorted((c.env for c in cells if c.env), key=lambda e: str(e.get("date", "")))
    commits = ", ".join(dict.fromkeys(str(e.get("git_commit", "?"))[:7] for e in envs)) or "?"
    rows = comparisons(cells, models)
    return "\n".join([
        "# The 2025 baselines at their papers' budgets, in their authors' calibration", "",
        f"Generated by `python -m acbench.studies.baselines` from the cells under `{root}/` (acbench commit(s) {commits}); "
        "do not edit by hand.", "", __doc__.split("\n\n", 1)[1].replace("\n", " "), "",
        f"{len(rows)} comparisons; *verdict* reads the Holm-corrected p (better, worse, equivalent within "
        f"{MARGIN} nats, or undecided with what it could miss); a perplexity above {DESTROYED:g} times dense's is "
        "marked destroyed, and a comparison between destroyed models says little about the methods. The "
        "calibration columns give each cell's windows and mode and, where its method states them, its authors'.",
        "", *tables(rows, models)])


def main(argv=None) -> int:
    from acbench.core.io import atomic_write_text
    from acbench.leaderboard.load import read_result_set

    from acbench.studies import refuse_bad_models, refuse_unwritable

    from acbench.studies import StudyParser

    ap = StudyParser(prog="python -m acbench.studies.baselines", description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--root", default=str(ROOT), help="the reproductions study's cells (default %(default)s)")
    ap.add_argument("--doc", default="docs/baselines.md")
    a = ap.parse_args(argv)
    refuse_unwritable(ap, a.doc, {"--root": a.root})
    refuse_bad_models(ap, a.models)
    root = Path(a.root)
    cells = read_result_set(root, every_setting=True).cells if root.is_dir() else []
    try:
        atomic_write_text(Path(a.doc), render(cells, root, a.models))
    except OSError as e:
        print(f"error: cannot write {a.doc} ({e.strerror or e}): pass a writable --doc", file=sys.stderr)
        return 2
    print(f"wrote {a.doc}")
    return 0


if __name__ == "__main__":
    from acbench.core.log import console_lines

    with console_lines():  # a script: acbench's lines on its stdout
        sys.exit(main())
