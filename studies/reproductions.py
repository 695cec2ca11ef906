"""Every published ordering acbench's baselines come with, tested on both embedded models in the protocol its paper
states wherever acbench can run it: `python -m acbench.studies.reproductions` computes the missing cells and writes
docs/reproductions.md from every stored cell.

Each claim carries its paper's protocol as data (studies/protocols.py), every part with the table, figure or code
file it is read from: the model (parameters, precision, base or instruct), the evaluation (metric, text, window
length, tokens scored per window, BOS), the budget and the basis of the comparison (same density, compute or
parameters), and each method's recipe; calibration sizes are each method's own `authors_calibration`. The cells
are measured that way: perplexity on 2,048-token windows of one token stream with one BOS at its start (TEAL's rows
on its sliding windows of 2,048 tokens of context and 512 scored), each method at its authors' calibration size and
mode and in its authors' recipe (TEAL's greedy densities and prefill half, magnitude pruning per layer as Wanda's
baseline, LaRoSa at 40 %, the N:M study's mitigations), and a claim its authors state in accuracy also on LAMA (all
1,354 probes) and MMLU in cloze form (285 questions). Each row gives acbench's paired difference on the same items
(perplexity: per-window mean NLL; accuracy: per item), its 95 % interval, its p-value before and after Holm's
correction across every comparison on the page, the smallest difference it had 80 % power to detect, and a
verdict: *reproduces* (the corrected test rejects zero on the claimed side, or, for a claim that two methods are
level, two one-sided tests put them within the margin), *contradicts* (it rejects on the other side, or the level
pair differs), or *not detected* (a difference up to the detectable one could have been missed). Its last column
lists every condition that still differs from the paper's protocol, computed from the two cells against the
claim's data (the model-size ratio from the parameter counts the cells record); only a contradiction with none
would read "open question". A part is one model's claims (`--models`); its cells go to
`studies/cells/reproductions/`, committed with them."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

from acbench.core.meta_analysis import holm
from acbench.core.record import DENSE, CellRecord
from acbench.core.significance import ALPHA, above_chance, compare

from acbench.studies import Side, find, ranks_clipped_to_one
from acbench.studies.protocols import (NOT_LOCATED, TEXT_NAMES, Difference, Evaluation, PaperModel, Protocol, Recipe,
                                       Reported, basis_of, differences)

MODELS = ("smollm2-135m", "gemma-3-270m")
ROOT = Path("studies/cells/reproductions")
LITERAL_ROOT = Path("studies/cells/reproductions-literal")  # --literal: the papers' texts from the hub
# the margin within which two methods count as level: nats of mean NLL (perplexity within 2 %), points of accuracy
MARGIN = {"ppl-token": 0.02, "lama": 0.02, "mmlu": 0.02}
DESTROYED = 5.0  # a side whose perplexity is this many times dense's: the budget destroys the model
# 2,048-token windows per perplexity cell: 65,504 scored tokens of the embedded text's 200,086 (SmolLM2; 191,937
# Gemma), about 2.5 minutes per cell on 2 CPU cores; enough for the level margin (0.02 nats) where a pair's
# per-window spread is at most 0.04 nats (the page states each row's detectable difference)
PPL_WINDOWS = 32
# the accuracy tasks acbench runs offline: LAMA on every embedded probe, MMLU in cloze form (each answer's text)
ACCURACY_OPTIONS = {"lama": {"per_relation": 0}, "mmlu": {"format": "cloze"}}
ACCURACY_TASKS = tuple(ACCURACY_OPTIONS)
LITERAL_WINDOWS = 100_000  # --literal: at most this many windows, i.e. all of the paper's test text


@dataclass(frozen=True)
class Claim:
    paper: str
    claim: str  # the ordering in words
    better: Side
    worse: Side  # for a level claim: the other side
    protocol: Protocol
    level: bool = False  # the claim is that the two are level, not ordered

    @property
    def tasks(self) -> tuple[str, ...]:
        """Perplexity in the paper's protocol, and for a claim its authors state in accuracy, the accuracy tasks
        acbench runs offline as well (the FASC claim is about knowledge: its accuracy tasks only)."""
        if self.protocol.evaluation.tasks.startswith("MMLU and LAMA"):
            return ACCURACY_TASKS
        return ("ppl-token",) + (ACCURACY_TASKS if self.protocol.evaluation.metric == "accuracy" else ())

    def task_options(self, task: str, literal: bool = False) -> dict:
        """The task settings the claim's cells are evaluated with: perplexity in the paper's windows (2,048
        tokens of one stream with one BOS where the paper scores accuracy), the accuracy tasks whole. `literal`:
        on the paper's own text where the hub has it (WikiText-2 test), every window of it."""
        if task != "ppl-token":
            return dict(ACCURACY_OPTIONS[task])
        ev = self.protocol.evaluation
        window, scored, bos = (ev.window, ev.scored, ev.bos) if ev.metric == "perplexity" else (2048, 2047, "stream")
        out = {"seq_len": window, "scored": None if scored == window - 1 else scored, "bos": bos,
               "max_windows": PPL_WINDOWS}
        text = hub_text(ev.data if ev.metric == "perplexity" else "WikiText-2")
        if literal and text:  # every window of the paper's text (WikiText-2 test holds about 140 of 2,048 tokens)
            out.update(source=text, max_windows=LITERAL_WINDOWS)
        return out


# the papers' texts the hub provides are protocols.TEXT_NAMES' (Alpaca and RefinedWeb are not read)
def hub_text(data: str) -> str | None:
    """The hub text source of a paper's data set ("C4 train segments" -> c4), or None where acbench reads none
    (the embedded Wikipedia sample is not a paper's set)."""
    return next((source for source, name in TEXT_NAMES.items() if source != "wiki" and data.startswith(name)), None)


def authors_text(method: str) -> str | None:
    """The hub text source of a method's authors' calibration set, or None."""
    from acbench import methods

    own = methods.get_method(methods.base_name(method)).authors_calibration
    return hub_text(own.data) if own else None


def as_stored(options: dict) -> dict:
    """Task options as a cell's task config holds them: LAMA stores "every probe" (per_relation 0) as null."""
    return {k: None if k == "per_relation" and v == 0 else v for k, v in options.items()}


def _s(method, budget, allocation="uniform"):
    return Side(method, budget, allocation)


# ------------------------------------------------------------------------ the papers' models and evaluations

LLAMA_7B = PaperModel("LLaMA-7B", 6.7e9, "float16", "base", "LLaMA paper (Touvron et al. 2023), Table 2")
LLAMA2_7B = PaperModel("Llama-2-7B", 6.7e9, "float16", "base", "Llama 2 paper (Touvron et al. 2023), Table 1")
OPT_175B = PaperModel("OPT-175B", 175e9, "float16", "base", "SparseGPT paper (Frantar and Alistarh 2023), OPT results")
MISTRAL_7B = PaperModel("Mistral-7B", 7.24e9, "float16", "base", "Mistral 7B paper (Jiang et al. 2023); CATS paper")
LLAMA3_8B = PaperModel("Llama-3-8B", 8.0e9, "float16", "base", "TEAL paper (its Llama-3-8B results)")
QWEN25_7B = PaperModel("Qwen-2.5-7B", 7.6e9, "bfloat16", "base", "WINA paper (Chen et al. 2025), its model list")
GEMMA3_4B_IT = PaperModel("Gemma3-4B-Instruct", 4.3e9, "bfloat16", "instruct",
                          "arXiv 2509.22166, its smallest model (Gemma 3 technical report: 4B)")

WIKITEXT_STREAM = "non-overlapping 2,048-token windows of WikiText-2 test as one stream, one BOS at its start"
WANDA_PPL = Evaluation("perplexity", "WikiText-2", "WikiText-2 test", 2048, 2047, "stream",
                       "locuslab/wanda lib/eval.py (eval_ppl_wikitext), main.py: " + WIKITEXT_STREAM)
SPARSEGPT_PPL = Evaluation("perplexity", "WikiText-2", "WikiText-2 test", 2048, 2047, "stream",
                           "IST-DASLab/sparsegpt llama.py (llama_eval), datautils.py: " + WIKITEXT_STREAM)
SVD_LLM_PPL = Evaluation("perplexity", "WikiText-2", "WikiText-2 test", 2048, 2047, "stream",
                         "AIoT-MLSys-Lab/SVD-LLM evaluater.py, utils/data_utils.py (get_test_data): " + WIKITEXT_STREAM)
TEAL_PPL = Evaluation("perplexity", "Alpaca", "250 Alpaca samples", 2560, 512, "window",
                      "FasterDecoding/TEAL teal/ppl_test.py, utils/eval_ppl.py: sliding windows of 2,048 tokens of "
                      "context and 512 scored, a BOS per sample")
NM_PPL = Evaluation("perplexity", "WikiText-2", "WikiText-2 test", 2048, 2047, "stream",
                    "arXiv 2509.22166 (WikiText-2 perplexity; its window length " + NOT_LOCATED + ", taken as the "
                    "2,048 of the papers it compares with)")


def _accuracy(tasks: str, source: str) -> Evaluation:
    return Evaluation("accuracy", tasks, tasks, None, None, None, source)


CATS_ACC = _accuracy("8 zero-shot lm-eval tasks", "CATS paper (Lee et al. 2024), its zero-shot table")
LAROSA_ACC = _accuracy("zero-shot lm-eval tasks (LaRoSa's average)", "LaRoSa paper (Liu et al. 2025), its zero-shot "
                       "accuracy table at 40 % sparsity")
R_SPARSE_ACC = _accuracy("ten zero-shot lm-eval tasks (average)", "R-Sparse paper (Zhang et al. 2025), its main table")
WINA_ACC = _accuracy("zero-shot lm-eval tasks (average)", "WINA paper (Chen et al. 2025), its main tables")
SPARSEGPT_ACC = _accuracy("ARC-easy (zero-shot)", "SparseGPT paper, its OPT-175B zero-shot table")
FASC_ACC = _accuracy("MMLU and LAMA", "the FASC paper acbench tests (docs/claims.md)")

# ------------------------------------------------------------------------------------------ the recipes

MAGNITUDE_PER_LAYER = Recipe("magnitude-prune", "comparison", "layer", "one threshold per weight matrix",
                             "locuslab/wanda lib/prune.py (prune_magnitude)")
TEAL_RECIPE = (Recipe("teal", "allocation", "greedy", "block-wise greedy densities across layers",
                      "FasterDecoding/TEAL teal/greedyopt.py"),
               Recipe("teal", "prefill_half", True, "the second half of each prefill sparsified only",
                      "FasterDecoding/TEAL utils/utils.py (SparsifyFn)"))
WINA_RECIPE = (Recipe("wina", "allocation", "greedy", "TEAL's greedy densities", "microsoft/wina README"),
               Recipe("wina", "", None, "an orthogonal transform of the weights (SVD of W_k and W_gate, with "
                      "residual adapters)", "microsoft/wina README"))
R_SPARSE_RECIPE = (Recipe("r-sparse", "search", True, "the rank / sparsity split searched on 16 x 4,096 C4 tokens",
                          "R-Sparse paper, its search (its released recipe as a file per model)"),
                   Recipe("r-sparse", "", None, "the split searched per matrix (acbench: per input group, one count "
                          "of kept channels for q, k, v)", "R-Sparse paper, its search"))

# the sides as their authors run them
TEAL = "teal:prefill_half=true"
R_SPARSE = "r-sparse:search=true"
MAGNITUDE = "magnitude-prune:comparison=layer"
# SVD-LLM as its code compresses: each weight matrix on its own (acbench's whitened-svd shares one basis across
# the weights that read one input, q/k/v and gate/up, which at a parameter budget keeps more rank)
SVD_LLM = "whitened-svd:per_site=true"

WANDA_PAPER, SPARSEGPT_PAPER = "Wanda (Sun et al. 2024)", "SparseGPT (Frantar and Alistarh 2023)"
SVD_LLM_PAPER, V2_PAPER = "SVD-LLM (Wang et al. 2025)", "SVD-LLM V2 (Wang et al. 2025)"
V2_TABLE = "SVD-LLM V2 paper, its LLaMA-7B WikiText-2 table at 20 % compression"
NM_PAPER = "N:M study (arXiv 2509.22166)"


def _wanda(budget="density 0.5", recipes=(), *reported) -> Protocol:
    return Protocol(LLAMA_7B, WANDA_PPL, budget, "Wanda paper, its LLaMA tables (50 % unstructured; 2:4)", "density",
                    tuple(reported), tuple(recipes))


def _svd_llm(budget, *reported) -> Protocol:
    return Protocol(LLAMA_7B, SVD_LLM_PPL, budget, "SVD-LLM / V2 papers: compression ratio 20 % (params 0.8)",
                    "parameters", tuple(reported))


def _nm(budget) -> Protocol:
    return Protocol(GEMMA3_4B_IT, NM_PPL, budget, "arXiv 2509.22166, its N:M patterns", "density",
                    (Reported("16:32 close to unstructured 50 %; about 2.7x the loss of 2:4 saved", "arXiv "
                              "2509.22166, its results on N:M patterns"),))


WANDA_726 = Reported("Wanda 7.26, dense 5.68 (LLaMA-7B, 50 %)", "locuslab/wanda README, its LLaMA results table")
TEAL_CLAIM = Reported("40-50 % model-wide sparsity with minimal degradation", "TEAL paper (Liu et al. 2025), "
                      "abstract and its perplexity tables")


def _larosa(worse: str) -> Protocol:
    reported = {"teal": Reported("+1.77 % average accuracy over TEAL; perplexity gap 0.17", "LaRoSa paper, "
                                 "its LLaMA2-7B table at 40 %"),
                "cats": Reported("+17.14 % average accuracy over CATS", "LaRoSa paper, its LLaMA2-7B table at 40 %")}
    return Protocol(LLAMA2_7B, LAROSA_ACC, "density 0.6", "LaRoSa paper: 40 % sparsity", "density",
                    (reported[worse],), TEAL_RECIPE)


CLAIMS = (
    Claim(WANDA_PAPER, "SparseGPT level with Wanda", _s("sparsegpt", "density 0.5"), _s("wanda", "density 0.5"),
          _wanda("density 0.5", (), WANDA_726, Reported("SparseGPT 7.22", NOT_LOCATED)), level=True),
    Claim(WANDA_PAPER, "Wanda ahead of magnitude (per layer)", _s("wanda", "density 0.5"),
          _s(MAGNITUDE, "density 0.5"),
          _wanda("density 0.5", (MAGNITUDE_PER_LAYER,), WANDA_726, Reported("magnitude 17.29", NOT_LOCATED))),
    Claim(SPARSEGPT_PAPER, "SparseGPT ahead of magnitude", _s("sparsegpt", "density 0.5"),
          _s(MAGNITUDE, "density 0.5"),
          Protocol(OPT_175B, SPARSEGPT_ACC, "density 0.5", "SparseGPT paper: 50 % unstructured", "density",
                   (Reported("ARC-e 69.65 against magnitude's 28.03", "SparseGPT paper, its OPT-175B zero-shot "
                             "table"),), (MAGNITUDE_PER_LAYER,))),
    Claim(SPARSEGPT_PAPER, "unstructured 50 % ahead of 2:4", _s("sparsegpt", "density 0.5"), _s("sparsegpt", "2:4"),
          Protocol(OPT_175B, SPARSEGPT_ACC, ("density 0.5", "2:4"), "SparseGPT paper: 50 % and 2:4", "density",
                   (Reported("ARC-e 69.65 (50 %) against 67.08 (2:4)", "SparseGPT paper, its OPT-175B zero-shot "
                             "table"),))),
    Claim(WANDA_PAPER, "unstructured 50 % ahead of 2:4", _s("wanda", "density 0.5"), _s("wanda", "2:4"),
          _wanda(("density 0.5", "2:4"), (), Reported("2:4 costs more than 50 % unstructured", "Wanda paper, its N:M "
                                            "table (LLaMA)"))),
    Claim(V2_PAPER, "V2 ahead of SVD-LLM at 20 %", _s("svd-llm-v2", "params 0.8"), _s(SVD_LLM, "params 0.8"),
          _svd_llm("params 0.8", Reported("V2 7.12, SVD-LLM 7.94 (dense 5.68)", V2_TABLE))),
    Claim(V2_PAPER, "V2 ahead of SVD-LLM at every ratio (10 % here)", _s("svd-llm-v2", "params 0.9"),
          _s(SVD_LLM, "params 0.9"),
          _svd_llm("params 0.9", Reported("V2 ahead of SVD-LLM at 20-80 % compression", "SVD-LLM V2 paper, its "
                                          "compression-ratio table"))),
    Claim(SVD_LLM_PAPER, "SVD-LLM ahead of ASVD at 20 %", _s(SVD_LLM, "params 0.8"), _s("asvd", "params 0.8"),
          _svd_llm("params 0.8", Reported("SVD-LLM 7.94", V2_TABLE), Reported("ASVD 11.14", NOT_LOCATED))),
    Claim(V2_PAPER, "V2 ahead of ASVD at 20 %", _s("svd-llm-v2", "params 0.8"), _s("asvd", "params 0.8"),
          _svd_llm("params 0.8", Reported("V2 7.12", V2_TABLE), Reported("ASVD 11.14", NOT_LOCATED))),
    Claim(SVD_LLM_PAPER, "ASVD ahead of plain SVD at 20 %", _s("asvd", "params 0.8"), _s("svd", "params 0.8"),
          _svd_llm("params 0.8", Reported("ASVD 11.14, SVD 20,061", NOT_LOCATED),
                   Reported("plain SVD far behind the activation-aware methods", "SVD-LLM paper, its main table"))),
    Claim("FASC (the paper acbench tests)", "FASC ahead of PCA at 50 % rank", _s("fasc", "rank 0.5"),
          _s("pca", "rank 0.5"),
          Protocol(MISTRAL_7B, FASC_ACC, "rank 0.5", "the FASC paper: 50 % rank", "parameters",
                   (Reported("6-8 points of MMLU and LAMA over PCA", "the FASC paper (docs/claims.md)"),))),
    Claim("FASC (the paper acbench tests)", "FASC ahead of whitened SVD at 50 % rank", _s("fasc", "rank 0.5"),
          _s("whitened-svd", "rank 0.5"),
          Protocol(MISTRAL_7B, FASC_ACC, "rank 0.5", "the FASC paper: 50 % rank", "parameters",
                   (Reported("ahead of variance-based subspaces", "the FASC paper (docs/claims.md)"),))),
    Claim("TEAL (Liu et al. 2025)", "TEAL's thresholds level with a top-k at the same density",
          _s(TEAL, "density 0.5", "greedy"), _s("act-sparse", "density 0.5"),
          Protocol(LLAMA3_8B, TEAL_PPL, "density 0.5", "TEAL paper: 40-50 % sparsity", "density", (TEAL_CLAIM,),
                   TEAL_RECIPE), level=True),
    Claim("R-Sparse (Zhang et al. 2025)", "R-Sparse ahead of sparse-only (TEAL-like)", _s(R_SPARSE, "density 0.5"),
          _s(TEAL, "density 0.5", "greedy"),
          Protocol(LLAMA2_7B, R_SPARSE_ACC, "density 0.5", "R-Sparse paper: 50 % sparsity", "density",
                   (Reported("R-Sparse 64.06 (dense 65.88); ablation 67.50 against sparse-only 66.25", NOT_LOCATED),
                    Reported("R-Sparse ahead of sparse-only activation pruning at 50 %", "R-Sparse paper, its "
                             "ablation")), R_SPARSE_RECIPE + TEAL_RECIPE)),
    Claim("LaRoSa (Liu et al. 2025)", "LaRoSa ahead of TEAL at 40 %", _s("larosa", "density 0.6"),
          _s(TEAL, "density 0.6", "greedy"), _larosa("teal")),
    Claim("CATS (Lee et al. 2024)", "CATS at 50 % level with the dense model", _s("cats", "density 0.5"),
          _s(DENSE, ""),
          Protocol(MISTRAL_7B, CATS_ACC, "density 0.5", "CATS paper: 50 % MLP activation sparsity", "dense",
                   (Reported("within 1-2 % of the base model's accuracy", "CATS paper, abstract and its zero-shot "
                             "table"),)), level=True),
    Claim("LaRoSa (Liu et al. 2025)", "LaRoSa ahead of CATS at 40 %", _s("larosa", "density 0.6"),
          _s("cats", "density 0.6"), _larosa("cats")),
    Claim("WINA (Chen et al. 2025)", "WINA ahead of TEAL", _s("wina", "density 0.5", "greedy"),
          _s(TEAL, "density 0.5", "greedy"),
          Protocol(QWEN25_7B, WINA_ACC, "density 0.5", "WINA paper: 25-65 % sparsity (50 % here)", "density",
                   (Reported("up to +2.94 % average accuracy over TEAL", "WINA paper, its main tables"),),
                   WINA_RECIPE + TEAL_RECIPE)),
    *(Claim(NM_PAPER, f"16:32 level with unstructured 50 %{label}", _s(m, "16:32"), _s(m, "density 0.5"),
            _nm(("16:32", "density 0.5")), level=True) for m, label in (("act-sparse", ""),
                                                       ("act-sparse:mitigation=variance", ", variance mitigation"),
                                                       ("act-sparse:mitigation=shift", ", shift mitigation"))),
    *(Claim(NM_PAPER, f"16:32 ahead of 2:4{label}", _s(m, "16:32"), _s(m, "2:4"), _nm(("16:32", "2:4")))
      for m, label in (("act-sparse", ""), ("act-sparse:mitigation=variance", ", variance mitigation"),
                       ("act-sparse:mitigation=shift", ", shift mitigation"))),
)


def _frozen(options: dict) -> tuple:
    return tuple(sorted(options.items()))


def sides(literal: bool = False) -> dict[tuple, list[str]]:
    """{(budget keywords as a sorted tuple, allocation, ((task, task options as a sorted tuple), ...)): methods}
    over every claim's sides and docs/baselines.md's (its page reads these cells too, at the default perplexity
    windows), dense aside. One sweep evaluates each task in one protocol, so a method whose claims read one task in
    two protocols gets two sweeps (a sequential calibration is run once per sweep: its tasks share it)."""
    from acbench.studies.baselines import TASK as BASELINES_TASK, sides as baseline_sides

    wanted = [(side, task, claim.task_options(task, literal)) for claim in CLAIMS for task in claim.tasks
              for side in (claim.better, claim.worse)]
    if not literal:  # the baselines' page reads the embedded text's cells only
        wanted += [(Side(m, b), BASELINES_TASK, {}) for m, b in baseline_sides()]
    per_method: dict = {}
    for side, task, options in wanted:
        if side.method == DENSE:
            continue
        budget = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in side.sweep_budget().items()))
        sweeps = per_method.setdefault((budget, side.allocation, side.method), [])
        evaluation = (task, _frozen(options))
        if any(evaluation in sweep for sweep in sweeps):
            continue
        free = next((sweep for sweep in sweeps if task not in {t for t, _ in sweep}), None)
        if free is None:
            sweeps.append(free := [])
        free.append(evaluation)
    out: dict = {}
    for (budget, allocation, method), sweeps in per_method.items():
        for sweep in sweeps:
            out.setdefault((budget, allocation, tuple(sorted(sweep))), []).append(method)
    return out


def calibration_cost(method: str) -> int:
    """A sweep's order key: the tokens its authors' calibration reads, a sequential one counted four times (two
    block forwards per block, and no calibration shared with another method); 0 for the run's default."""
    from acbench import methods

    comp = methods.build(method)
    authors = comp.authors_calibration
    if not authors or not comp.required_stats():  # none stated, or nothing read (plain r-sparse)
        return 0
    return authors.samples * authors.seq_len * (4 if authors.mode == "sequential" else 1)


def jobs(model: str, root: Path, progress: bool = True, literal: bool = False) -> list[tuple[int, list[str], dict]]:
    """The sweeps of one model's part, cheapest calibration first: (cost, methods, sweep keywords). `literal`: each
    method calibrated on its authors' set where the hub has it (C4, WikiText-2 train), the perplexity on
    WikiText-2 test where the paper scores it."""
    out = []
    for (key, allocation, evaluations), names in sides(literal).items():
        budget = {k: list(v) if isinstance(v, tuple) else v for k, v in key}
        options = {task: dict(o) for task, o in evaluations if o}
        common = {"model": model, "tasks": [task for task, _ in evaluations], "measure_latency": False,
                  "report": False, "output": str(root), "progress": progress, "allocate": [allocation], **budget,
                  **({"task_options": options} if options else {})}
        kinds = sorted({(calibration_cost(m), authors_text(m) if literal else None) for m in names},
                       key=lambda k: (k[0], k[1] or ""))
        for cost, text in kinds:
            same = [m for m in names if (calibration_cost(m), authors_text(m) if literal else None) == (cost, text)]
            out.append((cost, same, {**common, **({"calib_source": text} if text else {}),
                                     **calibration_keywords(same, cost, allocation)}))
    return sorted(out, key=lambda j: j[0])


def calibration_keywords(names: list[str], cost: int, allocation: str) -> dict:
    """How a sweep gives its methods their authors' calibration: `calibration="authors"`, or, under a greedy
    allocation (which splits the budget from the run's one shared calibration, and so refuses per-method ones),
    the authors' windows and length as the run's own (one-pass; TEAL's recipe)."""
    from acbench import methods

    if not cost:
        return {}
    if allocation == "uniform":
        return {"calibration": "authors"}
    own = {methods.get_method(methods.base_name(m)).authors_calibration for m in names}
    (one,) = own  # methods are grouped by cost; the greedy sides share TEAL's calibration
    return {"calib_samples": one.samples, "calib_seq_len": one.seq_len}


def run_part(model: str, root: Path, progress: bool = True, max_cost: int | None = None,
             literal: bool = False) -> None:
    """One model's cells: every claim's methods at their budgets, each in its authors' calibration and recipe,
    evaluated in the claim's protocol; the cheapest calibrations first, so that a part stopped early has measured
    the most claims it could (`max_cost`: only sweeps whose calibration reads at most this many tokens, a
    sequential one counted four times). Dense cells come with the sweeps (each task's reference)."""
    import acbench

    for cost, names, common in jobs(model, root, progress, literal):
        if max_cost is not None and cost > max_cost:
            continue
        # the statistics cache kept: one calibration serves every budget and protocol of its method
        acbench.sweep(methods=names, cache=True, **common)


def verdict(claim: Claim, task: str, d: dict, p_holm: float) -> dict:
    """The paired difference `d` (compare(worse, better)) in the claimed direction (positive: the claim's better
    side is better), its interval, p before and after Holm's correction across the page, the detectable difference
    and the verdict. Level claims: two one-sided tests (the 90 % interval inside the margin) reproduce them."""
    sign = -1.0 if task == "ppl-token" else 1.0  # an NLL that falls is an improvement
    diff, lo, hi = sign * d["diff"], *sorted(sign * x for x in d["ci95"])
    lo90, hi90 = sorted(sign * x for x in d.get("ci90", d["ci95"]))
    mde = d["detectable"]
    out = {"diff": diff, "ci95": (lo, hi), "p": d["p"], "p_holm": p_holm, "detectable": mde}
    margin = MARGIN[task]
    decided = p_holm < ALPHA
    if claim.level and -margin < lo90 and hi90 < margin:
        out["verdict"] = f"reproduces (level within {margin:g})"
    elif claim.level and decided:
        out["verdict"] = "contradicts (they differ)"
    elif not claim.level and decided:
        out["verdict"] = "reproduces" if diff > 0 else "contradicts"
    else:
        out["verdict"] = f"not detected (could miss {mde:.3f})"
    return out


def outcome_notes(task: str, cells: list[CellRecord], dense: CellRecord | None) -> list[str]:
    """What the results themselves add to a row (never a condition the authors set): a rank clipped to one, a
    budget that destroys the model, a dense model at chance."""
    found = []
    for c in cells:
        if clipped := ranks_clipped_to_one(c):
            found.append(f"{c.cell.method}'s allocation clipped {', '.join(clipped)} to rank 1")
    if task == "ppl-token" and dense is not None:
        base = dense.metrics["ppl"]
        gone = [c.cell.method for c in cells if c.cell.method != DENSE and
                not c.metrics.get("ppl", math.inf) <= DESTROYED * base]
        if gone:
            found.append(f"the budget destroys the model ({', '.join(gone)} above {DESTROYED:g}x dense perplexity)")
    if task != "ppl-token" and dense is not None:
        chance = above_chance(dense)
        if chance and not chance["above"]:
            found.append(f"the dense model is at chance on {task}")
    return found


@dataclass
class Row:
    claim: Claim
    model: str
    task: str
    dense: CellRecord | None
    better: CellRecord | None
    worse: CellRecord | None
    d: dict | None = None
    result: dict | None = None
    differences: list[Difference] | None = None
    notes: list[str] | None = None
    basis: list[str] | None = None  # what the two sides share: same density, compute, parameters

    @property
    def conditions(self) -> str:
        """Every condition that differs from the paper's protocol, computed from the cells, then what the results
        add; a contradiction with none of either is the only row that reads "open question"."""
        listed = [d.line() for d in self.differences or []] + list(self.notes or [])
        if listed:
            return "; ".join(listed)
        contradicts = bool(self.result and self.result["verdict"].startswith("contradicts"))
        return "open question: no recorded condition differs from the authors'" if contradicts else "none"


def measure(cells: list[CellRecord], models: list[str] | None = None, literal: bool = False) -> list[Row]:
    """One row per claim, model and task (default: the models the cells hold); Holm's correction across every
    comparison the page measures; each row's differences from its paper's protocol."""
    models = models or list(dict.fromkeys(c.cell.model for c in cells))
    out = []
    for claim in CLAIMS:
        for task in claim.tasks:
            options = as_stored(claim.task_options(task, literal))
            for model in models:
                dense = find(cells, model, Side(DENSE, ""), task, options)
                pick = lambda side: dense if side.method == DENSE else find(cells, model, side, task, options)
                row = Row(claim, model, task, dense, pick(claim.better), pick(claim.worse))
                if row.better is not None and row.worse is not None:
                    row.d = compare(row.worse, row.better)
                out.append(row)
    for r in out:  # a pair at neither the same compute, density nor parameters is refused, not tested
        if r.d is not None and r.claim.protocol.basis != "dense":
            r.basis = basis_of(r.better, r.worse)
            if not r.basis:
                r.d = None
    adjusted = iter(holm([r.d["p"] for r in out if r.d is not None]))
    for r in out:
        if r.d is not None:
            r.result = verdict(r.claim, r.task, r.d, next(adjusted))
        if r.better is not None and r.worse is not None:
            r.differences = differences(r.claim.protocol, [r.better, r.worse])
            r.notes = outcome_notes(r.task, [r.better, r.worse], r.dense)
    return out


def rows(cells: list[CellRecord], models: list[str] | None = None, literal: bool = False) -> list[list[str]]:
    """The page's table: one row per claim, model and task."""
    out = []
    for r in measure(cells, models, literal):
        relation = "level with" if r.claim.level else "better than"
        worse = r.claim.worse.label if r.claim.worse.method != DENSE else "dense"
        head = [r.claim.paper, r.claim.claim, f"{r.claim.better.label} {relation} {worse}", r.task, r.model]
        if r.better is None or r.worse is None:
            out.append(head + ["", "", "", "", "", "not yet measured", ""])
            continue
        if r.basis == []:
            out.append(head + ["", "", "", "", "", "refused: the sides share neither compute, density nor "
                               "parameters", r.conditions])
            continue
        if r.d is None:
            out.append(head + ["", "", "", "", "", "not paired (the cells scored different items)", ""])
            continue
        if r.basis:
            head[1] += f", at the same {' and '.join(r.basis)}"
        v = r.result
        out.append(head + [f"{v['diff']:+.3f}", f"[{v['ci95'][0]:+.3f}, {v['ci95'][1]:+.3f}]", f"{v['p']:.2g}",
                           f"{v['p_holm']:.2g}", "" if v["detectable"] is None else f"{v['detectable']:.3f}",
                           v["verdict"], r.conditions])
    return out


# the sides each claim was measured with before the authors' protocol (16 windows of 256 tokens, no recipe, LAMA on
# 15 probes per relation): the page lists the verdicts that moved
BEFORE_OPTIONS = {"ppl-token": {"seq_len": 256, "max_windows": 16, "scored": None}, "lama": {"per_relation": 15}}
BEFORE_METHOD = {TEAL: "teal", MAGNITUDE: "magnitude-prune", R_SPARSE: "r-sparse"}
BEFORE_BUDGET = {"density 0.6": "density 0.5", "rank 0.5": "rank 0.75"}


def before_side(side: Side) -> Side | None:
    if side.method.startswith("act-sparse:"):
        return None  # the mitigation variants are new rows
    return Side(BEFORE_METHOD.get(side.method, side.method), BEFORE_BUDGET.get(side.budget, side.budget))


def moved(cells: list[CellRecord], now: list[Row]) -> list[list[str]]:
    """The rows whose verdict changed from the former protocol's cells to this one's: claim, model, task, the
    verdict and Δ before, and now."""
    out = []
    for r in now:
        if r.task not in BEFORE_OPTIONS or r.result is None:
            continue
        sides = [before_side(s) for s in (r.claim.better, r.claim.worse)]
        if None in sides:
            continue
        options = BEFORE_OPTIONS[r.task]
        dense = find(cells, r.model, Side(DENSE, ""), r.task, options)
        b, w = (dense if s.method == DENSE else find(cells, r.model, s, r.task, options) for s in sides)
        if b is None or w is None:
            continue
        d = compare(w, b)
        if d is None:
            continue
        then = verdict(r.claim, r.task, d, d["p"])  # Holm's correction of the former page is not recomputed
        if then["verdict"].split(" (")[0] != r.result["verdict"].split(" (")[0]:
            out.append([r.claim.claim, r.model, r.task, f"{then['verdict']} (Δ {then['diff']:+.3f}, p {d['p']:.2g})",
                        f"{r.result['verdict']} (Δ {r.result['diff']:+.3f})"])
    return out


def sources() -> list[str]:
    """One line per paper's protocol: where each of its parts is stated, and the claims that read it."""
    grouped: dict = {}
    for c in CLAIMS:
        grouped.setdefault((c.paper, c.protocol), []).append(c.claim)
    out = []
    for (paper, p), claims in grouped.items():
        ev = p.evaluation
        parts = [f"model {p.model.name} ({p.model.parameters / 1e9:.1f}B, {p.model.precision}, {p.model.tuning}; "
                 f"{p.model.source})", f"evaluation {ev.metric} on {ev.tasks} ({ev.source})",
                 f"budget {' and '.join(p.levels)} ({p.budget_source}), compared " + ("with the dense model" if p.basis == "dense" else f"at the same {p.basis}")]
        parts += [f"{r.method} {r.what} ({r.source})" for r in p.recipes]
        parts += [f"reported: {r.text} ({r.source})" for r in p.reported]
        out.append(f"- **{paper}**, {'; '.join(claims)}: " + "; ".join(parts) + ".")
    return out


def render(cells: list[CellRecord], root: Path, literal: bool = False, models: list[str] | None = None) -> str:
    from tabulate import tabulate

    envs = sorted((c.env for c in cells if c.env), key=lambda e: str(e.get("date", "")))
    commits = ", ".join(dict.fromkeys(str(e.get("git_commit", "?"))[:7] for e in envs)) or "?"
    every = list(dict.fromkeys([*(models or MODELS), *(c.cell.model for c in cells)]))  # measured or not yet
    measured = measure(cells, every, literal)
    table = tabulate(rows(cells, every, literal), headers=["paper", "claim", "sides", "task", "model", "Δ (claimed direction)",
                                                  "95 % interval", "p", "Holm p", "detectable", "verdict",
                                                  "conditions that differ (computed from the cells)"],
                     tablefmt="github", disable_numparse=True)
    fixed = sorted({(d.part.split(" ")[-1] if d.part.startswith(("model", "evaluation text")) else d.part)
                    for r in measured for d in r.differences or [] if not d.closable and
                    d.part in ("model size", "model precision", "model tuning", "evaluation text")})
    changed = moved(cells, measured)
    lines = [
        "# Published orderings, each in its authors' protocol where acbench can run it", "",
        f"Generated by `python -m acbench.studies.reproductions` from the cells under `{root}/` (acbench commit(s) "
        f"{commits}); do not edit by hand.", "", __doc__.split("\n\n", 1)[1].replace("\n", " "), "",
        "Δ is in the claim's favour when positive: nats of mean NLL saved (perplexity) or points of accuracy gained "
        "(LAMA P@1, MMLU cloze), by the claim's better side over its other side, on the same items. *Detectable*: "
        "the difference this comparison had 80 % power to detect (two-sided 5 %), from its measured paired spread "
        f"and count. Level margins: {MARGIN['ppl-token']} nats, {MARGIN['lama']} points of accuracy. Perplexity: "
        f"{PPL_WINDOWS} windows of the embedded Wikipedia text's evaluation split in the paper's layout.", "",
        "**With the hub**: `python -m acbench.studies.reproductions --literal --models <the paper's model, e.g. "
        "meta-llama/Llama-2-7b-hf>` calibrates each method on its authors' set (C4 through `datasets`, WikiText-2 "
        "train) and scores perplexity on all of WikiText-2 test (cells in studies/cells/reproductions-literal/, page "
        "docs/reproductions-literal.md); the papers' accuracy sets run through the lm-eval bridge, e.g. `bench run "
        "--model <model> --methods cats --sparsity 0.5 --tasks lm-eval --task-option "
        "lm-eval.tasks=arc_easy,arc_challenge,hellaswag,piqa,winogrande,boolq,openbookqa,sciq`.", "",
        "**What acbench cannot close offline**, in every row it applies to: "
        + ("the model (" + ", ".join(fixed) + ": the embedded models are 4-bit GGUF files of 135M and 268M "
           "parameters, SmolLM2 instruct-tuned) and the texts (acbench's Wikipedia sample for the papers' "
           "WikiText-2, C4, Alpaca or RefinedWeb); with the hub, `--calib-source` / `--text-source` and "
           "`--literal` run the papers' sets" if fixed else "nothing measured yet") + ".", "",
        table, "", "## Verdicts that moved with the authors' protocol", "",
        ("Against the same claims measured on 16 windows of 256 tokens, without the recipes (LaRoSa at 50 %, FASC "
         "at rank 0.75):" if changed else "No verdict moved among the rows measured both ways."), ""]
    if changed:
        lines += [tabulate(changed, headers=["claim", "model", "task", "before", "now"], tablefmt="github",
                           disable_numparse=True), ""]
    lines += ["## Where each protocol is stated", ""] + sources() + [""]
    return "\n".join(lines)


def main(argv=None) -> int:
    from acbench.core.errors import UserError
    from acbench.core.io import atomic_write_text
    from acbench.leaderboard.load import read_result_set

    from acbench.studies import StudyParser

    ap = StudyParser(prog="python -m acbench.studies.reproductions", description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=None, help=f"default: {' '.join(MODELS)}")
    ap.add_argument("--root", default=None, help=f"the cells (default {ROOT}, or {LITERAL_ROOT} with --literal)")
    ap.add_argument("--doc", default=None, help="the page (default docs/reproductions.md, or "
                    "docs/reproductions-literal.md with --literal)")
    ap.add_argument("--literal", action="store_true", help="the papers' own texts from the hub: each method "
                    "calibrated on its authors' set (C4, WikiText-2 train) and perplexity on all of WikiText-2 test")
    ap.add_argument("--max-calibration-tokens", type=int, default=None, metavar="N",
                    help="compute only the sweeps whose calibration reads at most N tokens (a sequential one counted "
                         "four times); the rest wait for a later part")
    ap.add_argument("--report-only", action="store_true", help="write the page from the stored cells, compute nothing")
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    a = ap.parse_args(argv)
    from acbench.studies import refuse_bad_models, refuse_unwritable

    models = a.models if a.models is not None else list(MODELS)
    if a.root is None:
        a.root = str(LITERAL_ROOT if a.literal else ROOT)
    if a.doc is None:  # an empty --doc is refused below, not taken for the default
        a.doc = "docs/reproductions-literal.md" if a.literal else "docs/reproductions.md"
    if a.max_calibration_tokens is not None and a.max_calibration_tokens < 0:
        ap.error(f"--max-calibration-tokens {a.max_calibration_tokens}: give 0 or more tokens")
    refuse_unwritable(ap, a.doc, {"--root": a.root})
    refuse_bad_models(ap, models)
    root = Path(a.root)
    if not a.report_only:
        try:
            for model in models:
                print(f"part: {model}", flush=True)
                run_part(model, root, progress=not a.quiet, max_cost=a.max_calibration_tokens, literal=a.literal)
        except UserError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    cells = read_result_set(root, every_setting=True).cells if root.is_dir() else []
    atomic_write_text(Path(a.doc), render(cells, root, a.literal, models))
    print(f"wrote {a.doc}")
    return 0


if __name__ == "__main__":
    from acbench.core.log import console_lines

    with console_lines():  # a script: acbench's lines on its stdout
        sys.exit(main())
