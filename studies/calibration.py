"""How much calibration each method needs: every method of both families on both embedded models, at the papers'
budgets (low-rank parameter ratio 0.8 and 0.9, their 20 % and 10 % compression; sparsity density 0.5, and SparseGPT
and Wanda at 2:4 too) and, for low-rank, at rank ratio 0.9, where these small models survive (a parameter ratio
of 0.9 keeps about half of each group's rank here), at calibration sizes from 4,096 to 262,144 tokens (windows of 2,048), one-pass and (where a method can
be) sequential. Quality is the token perplexity of the default run's evaluation windows, paired across sizes.

`python -m acbench.studies.calibration` computes what is missing, one part at a time, and writes docs/calibration.md and
its plots from every stored cell. A part is one model at one size in one mode (`--models`, `--tokens`, `--modes`
choose which); its cells go to `studies/cells/calibration/<mode>-<windows>x<length>/<model>/`, which is committed
with them, so the study runs over several sittings and the page always shows what has been measured so far."""

from __future__ import annotations

import math
import sys
from collections import Counter
from pathlib import Path

from acbench.core.record import DENSE, SEQUENTIAL, CellRecord, ONE_PASS

from acbench.studies import budget_label, ranks_clipped_to_one, recorded_fallbacks, thread_counts

MODELS = ("smollm2-135m", "gemma-3-270m")
SEQ_LEN = 2048
TOKENS = (4096, 16384, 65536, 262144)  # 2, 8, 32 and 128 windows of 2,048: SparseGPT's and Wanda's is the last
LOW_RANK = ("pca", "whitened-svd", "svd-llm-v2", "asvd", "fwsvd", "espace-nl", "fasc-kfac", "fasc", "svd", "random")
SPARSITY = ("act-sparse", "teal", "wina", "r-sparse", "larosa", "cats", "wanda", "sparsegpt", "magnitude-prune")
RANKS = (0.8, 0.9)  # parameter ratios
RANK_RATIO = 0.9  # a rank ratio (k = 0.9 of each group's width): deployed merged, the rank truncation alone
DENSITY = "0.5"
N_M = ("wanda", "sparsegpt")  # at 2:4 as well, their papers' other budget
PATTERN = "2:4"
# Sequential calibration runs again for every variant; beyond this size only the methods whose authors calibrate
# sequentially (SparseGPT, Wanda) get it: at 262,144 tokens SparseGPT's took 3,793 s of one core on SmolLM2, so the
# other 12 variants would take SmolLM2 alone about 13 hours
SEQUENTIAL_ALL_UP_TO = 16384
TASKS = ("ppl-token",)
ROOT = Path("studies/cells/calibration")
# within this many nats of mean NLL of the largest size measured: saturated (perplexity within 2 %)
SATURATED = 0.02


def part_folder(root: Path, mode: str, tokens: int) -> Path:
    return root / f"{mode}-{tokens // SEQ_LEN}x{SEQ_LEN}"


def sequential_methods(names) -> list[str]:
    """Those of `names` that sequential calibration can serve (activation statistics, no allocation across
    groups), and read statistics at all."""
    from acbench import methods

    from acbench.deploy.compression import sequential_problem

    out = []
    for n in names:
        comp = methods.build(n)
        if comp.required_stats() and sequential_problem(comp) is None:
            out.append(n)
    return out


def calibrated(names) -> list[str]:
    from acbench import methods

    return [n for n in names if methods.build(n).required_stats()]


def authors_sequential(names) -> list[str]:
    """Those of `names` whose authors' declared calibration is sequential."""
    from acbench import methods

    return [n for n in names if getattr(type(methods.build(n)).authors_calibration, "mode", None) == SEQUENTIAL]


def part_methods(mode: str, tokens: int) -> tuple[list[str], list[str], list[str]]:
    """The low-rank, sparsity and N:M methods of one part."""
    low, sparse = list(LOW_RANK), list(SPARSITY)
    if not (mode == ONE_PASS and tokens == TOKENS[0]):  # a data-free method's cells do not depend on calibration:
        low, sparse = calibrated(low), calibrated(sparse)  # measured once, in the first part
    if mode == SEQUENTIAL:
        low, sparse = sequential_methods(low), sequential_methods(sparse)
        if tokens > SEQUENTIAL_ALL_UP_TO:
            low, sparse = authors_sequential(low), authors_sequential(sparse)
    return low, sparse, [m for m in N_M if m in sparse]


def part_size(mode: str, tokens: int) -> int:
    """How many cells a whole part stores: each low-rank method at every parameter ratio and the rank ratio, each
    sparsity method at the density, the N:M ones at the pattern too, and dense."""
    low, sparse, n_m = part_methods(mode, tokens)
    return len(low) * (len(RANKS) + 1) + len(sparse) + len(n_m) + 1


def part_state(n: int, mode: str, tokens: int) -> str:
    """'' for a whole part, else how much of it is stored (a part stopped before its end shows what it has)."""
    whole = part_size(mode, tokens)
    return "" if n >= whole else f" (part: {n} of its {whole} cells)"


def run_part(model: str, tokens: int, mode: str, root: Path, progress: bool = True) -> list[dict]:
    """One part: the model's cells at one calibration size in one mode (missing ones only). Its sweeps keep their
    one-pass statistics in the statistics cache, so the second low-rank sweep reads the first's (a sweep's own
    temporary statistics made each calibrate again: at 262,144 tokens, 1.5 h of one core on SmolLM2), and a part
    stopped after its calibration resumes from them. The sparsity sweeps, whose calibration reads no gradient,
    come first."""
    import acbench

    low, sparse, n_m = part_methods(mode, tokens)
    common = {"model": model, "tasks": list(TASKS), "measure_latency": False, "report": False,
              "output": str(part_folder(root, mode, tokens)), "calib_samples": tokens // SEQ_LEN,
              "calib_seq_len": SEQ_LEN, "calibration_mode": mode, "progress": progress, "cache": True}
    cells = []
    if sparse:
        cells += acbench.sweep(methods=sparse, sparsity=[DENSITY], **common)
    if n_m:
        cells += acbench.sweep(methods=n_m, sparsity=[PATTERN], **common)
    if low:
        cells += acbench.sweep(methods=low, rank=list(RANKS), budget="params", **common)
        cells += acbench.sweep(methods=low, rank=[RANK_RATIO], budget="rank", **common)
    return cells


def stored(root: Path) -> list[tuple[str, int, CellRecord]]:
    """(mode, tokens, cell) of every cell stored under the study's folders, read as the leaderboard reads them."""
    from acbench.leaderboard.load import read_result_set

    out = []
    for folder in sorted(root.glob("*-*x*")):
        mode, _, size = folder.name.rpartition("-")
        if mode not in (ONE_PASS, SEQUENTIAL):
            continue
        windows, _, length = size.partition("x")
        for c in read_result_set(folder).cells:
            out.append((mode, int(windows) * int(length), c))
    return out


def series(cells) -> dict:
    """{(model, family, budget): {(method, mode): {tokens: cell}}}; dense under each model."""
    from acbench import methods

    out: dict = {}
    for mode, tokens, c in cells:
        if c.cell.method == DENSE:
            out.setdefault((c.cell.model, DENSE, ""), {}).setdefault((DENSE, ONE_PASS), {})[tokens] = c
            continue
        family = methods.family_of(c.cell.method)
        data_free = not methods.build(c.cell.method).required_stats()
        # a data-free method's cell is the same at every size: one line, drawn flat
        out.setdefault((c.cell.model, family, budget_label(c)), {}).setdefault(
            (c.cell.method, "data-free" if data_free else mode), {})[tokens] = c
    return out


def nll(c: CellRecord) -> float:
    return math.log(c.metrics["ppl"])


def ppl(c: CellRecord) -> str:
    """A perplexity as the leaderboard prints it: two decimals, three significant digits from 1e5 on."""
    v = c.metrics["ppl"]
    return f"{v:.3g}" if abs(v) >= 1e5 else f"{v:.2f}"


def saturation(points: dict[int, CellRecord]) -> str:
    """The smallest size from which every size up to the best one (lowest mean NLL) is within SATURATED nats of it
    ("-" with one size). A larger size worse than the best by more than that is named: measured against the largest
    size alone, a row whose largest size came out worse read "not by <largest>", as if it wanted more calibration
    (Gemma-3-270m's low-rank rows at the parameter budgets, 65,536 -> 262,144 tokens)."""
    sizes = sorted(points)
    if len(sizes) < 2:
        return "-"
    v = {t: nll(points[t]) for t in sizes}
    best = min(sizes, key=lambda t: (v[t], t))
    first = best
    for t in reversed([t for t in sizes if t < best]):
        if v[t] - v[best] > SATURATED:
            break
        first = t
    worse = [t for t in sizes if t > best and v[t] - v[best] > SATURATED]
    label = f"not by {best:,}" if first == best == sizes[-1] else f"{first:,}"
    if worse:
        label += f"; {worse[-1]:,} worse by {v[worse[-1]] - v[best]:.3f} nats"
    return label


def table(rows_of: dict, model: str, family: str) -> list[str]:
    from tabulate import tabulate

    sizes = sorted({t for (m, f, _), by in rows_of.items() if m == model and f == family
                    for pts in by.values() for t in pts})
    rows = []
    for (m, f, budget), by in sorted(rows_of.items()):
        if m != model or f != family:
            continue
        for (method, mode), pts in sorted(by.items()):
            flat = mode == "data-free"
            cells = [ppl(next(iter(pts.values()))) if flat else (ppl(pts[t]) if t in pts else "") for t in sizes]
            seconds = [pts[t].timings.get("calibrate_s") for t in sorted(pts)]
            rows.append([budget, method, mode] + cells + ["" if flat else saturation(pts),
                         "" if flat or seconds[-1] is None else f"{seconds[-1]:.0f}"])
    if not rows:
        return []
    return [tabulate(rows, headers=["budget", "method", "mode"] + [f"{t:,}" for t in sizes] +
                     ["saturates at", "calibration s (largest)"], tablefmt="github", disable_numparse=True), ""]


def plot(rows_of: dict, model: str, family: str, path: Path) -> Path | None:
    """Perplexity against calibration tokens, one line per method and mode (data-free methods flat, dashed)."""
    from acbench.core.figures import pyplot, save_figure

    plt = pyplot()
    budgets = sorted({b for (m, f, b) in rows_of if m == model and f == family})
    if not budgets:
        return None
    fig, axes = plt.subplots(1, len(budgets), figsize=(5.5 * len(budgets), 4.2), squeeze=False)
    dense = rows_of.get((model, DENSE, ""), {}).get((DENSE, ONE_PASS), {})
    for ax, budget in zip(axes[0], budgets):
        for (method, mode), pts in sorted(rows_of[(model, family, budget)].items()):
            xs = sorted(pts)
            ys = [pts[t].metrics["ppl"] for t in xs]
            label = method if mode == ONE_PASS else f"{method} ({mode})"
            if mode == "data-free":  # the same at every size: a flat line across the axis
                ax.axhline(ys[0], ls="--", lw=0.9, label=label, color=f"C{len(ax.lines) % 10}")
                continue
            ax.plot(xs, ys, ":" if mode == SEQUENTIAL else "-", marker="o" if len(xs) > 1 else "s", label=label)
        if dense:
            ax.axhline(next(iter(dense.values())).metrics["ppl"], color="k", lw=0.8, label="dense")
        ax.set(xscale="log", yscale="log", xlabel="calibration tokens", ylabel="perplexity (ppl-token)",
               title=f"{model}: {family}, {budget}")
        ax.legend(fontsize=7)
    return save_figure(fig, path)


def cost_lines(cells) -> list[str]:
    """What each size cost, from the cells: calibration seconds (one-pass: once per part, shared by its methods;
    sequential: per variant, its solves excluded) and, for sequential, the hidden states it held."""
    from tabulate import tabulate

    from acbench.core.units import human

    one, seq, ran, peaks, with_logits = {}, {}, {}, {}, False
    for mode, tokens, c in cells:
        t, cal = c.timings or {}, c.calibration or {}
        if c.cell.method == DENSE or t.get("calibrate_s") is None:
            continue
        key = (c.cell.model, tokens)
        ran.setdefault(key, []).append(c)
        if mode == ONE_PASS:  # the part's shared calibration: its largest (it holds every method's statistics)
            one[key] = max(one.get(key, 0.0), t["calibrate_s"]) if cal.get("cached") is False else one.get(key, 0.0)
        else:
            seq.setdefault(key, []).append((t["calibrate_s"], cal.get("held_bytes")))
        high = calibration_peak(cal)
        if high is not None:
            peaks[(*key, mode)] = max(peaks.get((*key, mode), 0), high)
            with_logits |= mode == SEQUENTIAL and str((c.env or {}).get("date", "")) < CAPTURE_STOPS_AT_HEAD
    peak = {k: human(v) for k, v in peaks.items()}
    rows = [[m, f"{tok:,}", f"{one[(m, tok)]:.0f}" if (m, tok) in one else "", peak.get((m, tok, ONE_PASS), ""),
             f"{sum(s for s, _ in seq[(m, tok)]) / len(seq[(m, tok)]):.0f}" if (m, tok) in seq else "",
             human(max(b or 0 for _, b in seq[(m, tok)])) if (m, tok) in seq else "",
             peak.get((m, tok, SEQUENTIAL), ""), thread_counts(ran[(m, tok)])]
            for m, tok in sorted(set(one) | set(seq))]
    if not rows:
        return []
    return ["## What each size costs", "",
            "Measured on the machine the cells name, in processes given the threads shown (parts run side by side "
            "take one core each, and a busy machine slows them). One-pass: the part's one calibration, which holds "
            "every method's statistics (gradients included) and is cached. Sequential: one variant's calibration, "
            "its solves excluded; it runs again for every budget and method.", "",
            "Peak: the process's peak memory over the calibration (resident set on a CPU, the model and dense "
            "reference included; sequential: the variant's calibration and solves together), the largest of the "
            "part's cells. Blank where the part's cells predate its recording." + (
                " The sequential peaks of cells made before the capture forward stopped at the LM head "
                f"({CAPTURE_STOPS_AT_HEAD[:10]}) include one batch of its logits (2 x 2,048 tokens x the vocabulary "
                "x 4 bytes: 4.3 GB on Gemma-3-270m, 0.8 GB on SmolLM2)." if with_logits else ""), "",
            tabulate(rows, headers=["model", "tokens", "one-pass calibration s", "one-pass peak",
                                    "sequential s per variant", "sequential hidden states held", "sequential peak",
                                    "threads"], tablefmt="github", disable_numparse=True), ""]


# when sequential calibration's capture forward stopped computing a batch of logits it never read (UTC)
CAPTURE_STOPS_AT_HEAD = "2026-12-07T01:12:00Z"


def calibration_peak(cal: dict) -> int | None:
    """The peak memory (bytes) a cell's calibration record holds, or None: a cell from before it was recorded, or
    one whose calibration came from the cache (it cost none)."""
    peak = cal.get("peak")
    value = peak.get("bytes") if isinstance(peak, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def fallback_summary(c: CellRecord) -> str:
    """A cell's recorded fallbacks counted by kind; a rank clipped to 1 names its group (all but removed)."""
    counts = Counter(str(f.get("fallback") or " ".join(str(f[k]) for k in ("op", "kind") if f.get(k)) or "unnamed")
                     for f in recorded_fallbacks(c))
    to_one = ranks_clipped_to_one(c)
    return ", ".join(f"{n} {label}" for label, n in sorted(counts.items())) + \
        (f": {', '.join(to_one)} to rank 1" if to_one else "")


# why a size can move SVD-LLM V2 across its own rule: printed where a cell has a rank clipped to 1
V2_RULE = ("SVD-LLM V2 weighs each matrix of a type by 1 / log L, L its least truncation loss summed over the "
           "calibration tokens (so L grows about as the square root of their number): a type with an L at most 1 "
           "keeps uniform ranks, and a matrix whose L has just passed 1 takes a weight near infinity, its rank "
           "clipped to 1 (the k shown is the rule's). A larger calibration can therefore move a matrix from the first "
           "case to the second.")


def fallback_lines(rows_of: dict) -> list[str]:
    """The fallbacks each row's cells record, size by size: where a row's quality moves against its calibration,
    the cause is often here (a rank the allocation clipped, a whitening that fell back to damping)."""
    from tabulate import tabulate

    rows, clipped = [], False
    for (model, _, budget), by in sorted(rows_of.items()):
        for (method, mode), pts in sorted(by.items()):
            said = {t: fallback_summary(c) for t, c in sorted(pts.items())}
            if any(said.values()):
                rows.append([model, budget, method, mode, "; ".join(f"{t:,}: {s or 'none'}" for t, s in said.items())])
                clipped |= method == "svd-llm-v2" and any(ranks_clipped_to_one(c) for c in pts.values())
    if not rows:
        return []
    return ["## Fallbacks recorded, by size", "", "Counted from each cell's compression record.", "",
            tabulate(rows, headers=["model", "budget", "method", "mode", "fallbacks, by calibration tokens"],
                     tablefmt="github", disable_numparse=True), "", *([V2_RULE, ""] if clipped else [])]


def render(cells, doc: Path, plots: Path, asked: dict) -> dict[Path, str]:
    """{page: text}: the study's page (parts, fallbacks, costs) and one page per model."""
    rows_of = series(cells)
    envs = sorted((c.env for _, _, c in cells if c.env), key=lambda e: str(e.get("date", "")))
    commits = ", ".join(dict.fromkeys(str(e.get("git_commit", "?"))[:7] for e in envs)) or "?"
    measured = sorted({(c.cell.model, mode, tokens) for mode, tokens, c in cells})
    held = Counter((c.cell.model, mode, tokens) for mode, tokens, c in cells)
    generated = (f"Generated by `python -m acbench.studies.calibration` from the cells under `{ROOT}/` (acbench commit(s) "
                 f"{commits}); do not edit by hand. Protocols and sizes: docs/calibration-protocols.md.")
    lines = ["# How much calibration each method needs", "", generated, "",
             __doc__.split("\n\n")[0].replace("\n", " "), "",
             f"Saturates at: the smallest size from which every size up to the row's best (lowest perplexity) is "
             f"within {SATURATED} nats of mean NLL ({math.exp(SATURATED) - 1:.0%}) of it; \"not by\" the largest "
             "size when that one is best and the size before is further off. A larger size that came out worse than "
             "the best by more than the margin is named with its distance: more calibration did not help that row. "
             "Data-free methods read no calibration: one cell, drawn flat.", "",
             f"Sequential calibration runs again for every variant (its cost per variant: the last table), so beyond "
             f"{SEQUENTIAL_ALL_UP_TO:,} tokens only the methods whose authors calibrate sequentially get it "
             f"({', '.join(authors_sequential(sequential_methods(SPARSITY + LOW_RANK)))}); the others stop at "
             f"{SEQUENTIAL_ALL_UP_TO:,} in that mode.", "",
             "Parts measured (model, mode, tokens): " + ("; ".join(f"{m} {mo} {t:,}" + part_state(held[m, mo, t],
                                                                                               mo, t)
                                                                   for m, mo, t in measured) or "none yet") + ".",
             "Parts not yet measured: " + ("; ".join(f"{m} {mo} {t:,}" for m in asked["models"] for mo in asked["modes"]
                                                     for t in asked["tokens"] if (m, mo, t) not in measured)
                                           or "none") + ".", ""]
    pages = {model_page(doc, m): m for m in dict.fromkeys(c.cell.model for _, _, c in cells)}
    if pages:
        lines += ["Per model, quality against calibration size (a table and a plot per family): " +
                  ", ".join(f"[{m}]({page.name})" for page, m in pages.items()) + ".", ""]
    lines += fallback_lines(rows_of) + cost_lines(cells)
    return {doc: "\n".join(lines) + "\n",
            **{page: model_lines(rows_of, m, page, plots, generated) for page, m in pages.items()}}


def model_page(doc: Path, model: str) -> Path:
    """One model's tables and plots, beside the study's page (one page for both models ran past 150 lines)."""
    return doc.with_name(f"{doc.stem}-{model}.md")


def model_lines(rows_of: dict, model: str, page: Path, plots: Path, generated: str) -> str:
    dense = rows_of.get((model, DENSE, ""), {}).get((DENSE, ONE_PASS), {})
    lines = [f"# How much calibration each method needs: {model}", "", generated, "",
             f"Dense perplexity {next(iter(dense.values())).metrics['ppl']:.2f}." if dense else "", ""]
    for family in ("low-rank", "sparsity"):
        body = table(rows_of, model, family)
        if not body:
            continue
        fig = plot(rows_of, model, family, plots / f"calibration_{model}_{family}.png")
        lines += [f"## {family}", "", *body]
        if fig is not None:
            lines += [f"![{model} {family}]({Path(fig).relative_to(page.parent).as_posix()})", ""]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from acbench.core.errors import UserError
    from acbench.core.io import atomic_write_text

    from acbench.studies import StudyParser

    ap = StudyParser(prog="python -m acbench.studies.calibration", description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--tokens", nargs="+", type=int, default=list(TOKENS),
                    help=f"calibration sizes, multiples of {SEQ_LEN} (default {' '.join(map(str, TOKENS))})")
    ap.add_argument("--modes", nargs="+", default=[ONE_PASS, SEQUENTIAL], choices=[ONE_PASS, SEQUENTIAL])
    ap.add_argument("--root", default=str(ROOT), help=f"where the parts' cells are kept (default {ROOT})")
    ap.add_argument("--doc", default="docs/calibration.md")
    ap.add_argument("--report-only", action="store_true", help="write the page from the stored cells, compute nothing")
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    a = ap.parse_args(argv)
    bad = [t for t in a.tokens if t < SEQ_LEN or t % SEQ_LEN]
    if bad:
        ap.error(f"--tokens {bad[0]}: give a multiple of {SEQ_LEN} (whole windows of {SEQ_LEN} tokens)")
    from acbench.studies import refuse_bad_models, refuse_unwritable

    refuse_unwritable(ap, a.doc, {"--root": a.root})
    refuse_bad_models(ap, a.models)
    root, doc = Path(a.root), Path(a.doc)
    if not a.report_only:
        try:
            for model in a.models:  # smallest parts first: each is committed-sized and a stop loses one part at most
                for tokens in sorted(a.tokens):
                    for mode in a.modes:
                        print(f"part: {model}, {mode}, {tokens:,} tokens", flush=True)
                        run_part(model, tokens, mode, root, progress=not a.quiet)
        except UserError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    # the page lists every part of the whole study still missing, whichever parts this call ran
    plan = {"models": list(dict.fromkeys([*MODELS, *a.models])), "modes": [ONE_PASS, SEQUENTIAL],
            "tokens": sorted(set(TOKENS) | set(a.tokens))}
    for page, text in render(stored(root), doc, doc.parent / "plots", plan).items():
        atomic_write_text(page, text)
        print(f"wrote {page}")
    return 0


if __name__ == "__main__":
    from acbench.core.log import console_lines

    with console_lines():  # a script: acbench's lines on its stdout
        sys.exit(main())
