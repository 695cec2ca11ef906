"""The N:M activation-sparsity study (arXiv 2509.22166) on our models, from stored cells:
`python -m acbench.studies.nm_sparsity RESULTS_DIR` prints the README's tables and the three claims with paired intervals.

Produce the cells with (per model):
  bench run --model M --tasks ppl-token lama --methods act-sparse --sparsity 2:4 4:8 8:16 16:32 0.5
  bench run --model M --tasks ppl-token lama --sparsity 2:4 16:32 --methods act-sparse:score=wina \
      act-sparse:score=fisher act-sparse:mitigation=variance act-sparse:mitigation=shift
  bench run --model M --tasks ppl-token lama --methods wanda magnitude-prune --sparsity 2:4 8:16
  bench run --model M --tasks ppl-token lama --methods pca fasc-kfac --rank 0.5 --budget params
"""

from __future__ import annotations

import sys

from tabulate import tabulate

from acbench.leaderboard.load import read_result_set
from acbench.core.significance import compare


def cells_by_row(root):
    out: dict = {}
    for c in read_result_set(root).cells:
        out.setdefault(c.cell.model, {})[(c.cell.method, c.cell.budget, c.cell.task)] = c
    return out


def fmt_d(d) -> str:
    if not d:
        return ""
    star = " *" if d["p"] < 0.05 else ""
    return f"{d['diff']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}] p={d['p']:.2g}{star}"


def study(root) -> str:
    md = []
    for model, cells in sorted(cells_by_row(root).items()):
        dense = {t: c for (m, b, t), c in cells.items() if m == "dense"}
        # patterns in order of M (2:4 before 16:32), unstructured after them
        order = lambda mb: (mb[0], int(mb[1].split(":")[1]) if ":" in mb[1] else 10**6, mb[1])
        rows = sorted({(m, b) for (m, b, t) in cells if m != "dense"}, key=order)
        body = [["dense", "", f"{dense['ppl-token'].metrics['ppl']:.2f}", "",
                 f"{dense['lama'].metrics['p@1']:.3f}" if "lama" in dense else "", "", "1.000"]]
        for m, b in rows:
            ppl, lama = cells.get((m, b, "ppl-token")), cells.get((m, b, "lama"))
            comp = (ppl or lama).compression or {}
            body.append([m, b, f"{ppl.metrics['ppl']:.2f}" if ppl else "",
                         fmt_d(compare(dense["ppl-token"], ppl)) if ppl else "",
                         f"{lama.metrics['p@1']:.3f}" if lama else "",
                         fmt_d(compare(dense["lama"], lama)) if lama and "lama" in dense else "",
                         f"{comp.get('compute_ratio', float('nan')):.3f}"])
        md += [f"### {model}", "", tabulate(body, headers=["method", "budget", "ppl-token", "Δ NLL vs dense [95%] p",
                                                           "LAMA P@1", "Δ P@1 vs dense [95%] p", "compute ratio"],
                                            tablefmt="github", disable_numparse=True), ""]
        ppl = lambda m, b: cells.get((m, b, "ppl-token"))
        lama = lambda m, b: cells.get((m, b, "lama"))
        claims = []
        d0 = dense["ppl-token"].metrics["ppl"]
        a, z = ppl("act-sparse", "2:4"), ppl("act-sparse", "16:32")
        if a and z:
            ratio = (a.metrics["ppl"] - d0) / (z.metrics["ppl"] - d0)
            claims.append(f"- (ppl(2:4) - dense) / (ppl(16:32) - dense) = {ratio:.2f} (paper: about 2.7); "
                          f"Δ NLL 16:32 vs 2:4: {fmt_d(compare(a, z))}")
        u = ppl("act-sparse", "unstructured")
        if z and u:
            claims.append(f"- 16:32 vs unstructured 0.5, Δ NLL (16:32 - unstructured): {fmt_d(compare(u, z))}")
        order = [(b, ppl("act-sparse", b).metrics["ppl"]) for b in ("2:4", "4:8", "8:16", "16:32", "unstructured")
                 if ppl("act-sparse", b)]
        if order:
            claims.append("- ordering at density 0.5 (abs, none): " + " > ".join(f"{b} {v:.2f}" for b, v in order))
        for pattern in ("2:4", "8:16"):
            act = ppl("act-sparse", pattern)
            for w in ("wanda", "magnitude-prune"):
                if act and ppl(w, pattern):
                    acc = (f"; Δ LAMA P@1 = {fmt_d(compare(lama(w, pattern), lama('act-sparse', pattern)))}"
                           if lama(w, pattern) and lama("act-sparse", pattern) else "")
                    claims.append(f"- activation vs weight at {pattern}: Δ NLL act-sparse - {w} = "
                                  f"{fmt_d(compare(ppl(w, pattern), act))}{acc}")
        for pattern in ("8:16", "16:32"):
            for lr in ("fasc-kfac", "pca"):
                if ppl("act-sparse", pattern) and ppl(lr, "params"):
                    claims.append(f"- families at compute 0.5: Δ NLL act-sparse {pattern} - {lr} (params 0.5) = "
                                  f"{fmt_d(compare(ppl(lr, 'params'), ppl('act-sparse', pattern)))}")
        md += ["Claims (paired over the 16 perplexity windows; * = p < 0.05):", "", *claims, ""]
    return "\n".join(md)


if __name__ == "__main__":
    from acbench.core.log import console_lines

    with console_lines():  # a script: acbench's lines on its stdout
        print(study(sys.argv[1] if len(sys.argv) > 1 else "results"))
