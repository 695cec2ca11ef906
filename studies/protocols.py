"""A published claim's protocol as data, and its differences from what acbench ran, computed from the cells.

A `Protocol` holds what the paper ran, each part with the place it is stated (a table or figure of the paper, or a
file of the authors' code): the model (size in parameters, precision, base or instruct), the evaluation (metric,
data, window length, tokens scored per window, BOS convention), the budget, the basis of the comparison (same
density, compute or parameters) and each method's recipe (calibration size comes from the method's own
`authors_calibration`). `differences` reads the same fields off the two cells of a row and lists every one that
differs, as `Difference`s: what acbench ran, what the authors ran, and whether acbench can close it offline. A row
with none is the only one a contradiction may call an open question.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from acbench.core.record import DENSE, UNIFORM, CellRecord, calibration_mode

NOT_LOCATED = "not located in the paper or its code"  # a number quoted earlier whose place could not be found
COMPUTE_GAP = 0.05  # compute (or density, parameter) ratios further apart than this are not "the same"


@dataclass(frozen=True)
class PaperModel:
    name: str
    parameters: float
    precision: str  # float16, bfloat16
    tuning: str  # base | instruct
    source: str


@dataclass(frozen=True)
class Evaluation:
    metric: str  # perplexity | accuracy
    data: str
    tasks: str  # the tasks (accuracy) or the text (perplexity) the number is on
    window: int | None  # tokens per window (perplexity)
    scored: int | None  # tokens scored per window: window - 1 for non-overlapping windows
    bos: str | None  # stream (one BOS opens the text) | window (one per window or sample)
    source: str


@dataclass(frozen=True)
class Recipe:
    """One setting of a method's recipe as its authors run it. `setting`: the acbench method setting (or
    "allocation", or "" where acbench has no such setting) and `value` the authors' value in its terms."""

    method: str
    setting: str
    value: object
    what: str
    source: str


@dataclass(frozen=True)
class Reported:
    text: str
    source: str  # table, figure or code file; NOT_LOCATED where it could not be found


@dataclass(frozen=True)
class Protocol:
    model: PaperModel
    evaluation: Evaluation
    # the paper's levels in acbench's words: "density 0.6" (40 % sparsity), "params 0.8", or the two a claim
    # compares ("density 0.5", "2:4")
    budget: str | tuple[str, ...]
    budget_source: str
    basis: str  # density | compute | parameters | dense (a method against the dense model)
    reported: tuple[Reported, ...]
    recipes: tuple[Recipe, ...] = ()

    @property
    def levels(self) -> tuple[str, ...]:
        return (self.budget,) if isinstance(self.budget, str) else tuple(self.budget)

    def problems(self) -> list[str]:
        """Fields left empty (a claim must carry every one, each with a source)."""
        out = []
        for part in (self.model, self.evaluation):
            out += [f"{type(part).__name__}.{k}" for k, v in part.__dict__.items()
                    if v in ("", None) and k not in ("window", "scored", "bos")]
        if self.evaluation.metric == "perplexity" and not (self.evaluation.window and self.evaluation.scored
                                                           and self.evaluation.bos):
            out.append("Evaluation.window/scored/bos (a perplexity protocol)")
        if self.basis not in BASES:
            out.append(f"basis {self.basis!r}")
        if not self.reported or any(not r.text or not r.source for r in self.reported):
            out.append("reported (each number with its source)")
        out += [f"recipe {r.method}.{r.setting or r.what}" for r in self.recipes if not r.source or not r.what]
        if not self.budget or not self.budget_source:
            out.append("budget")
        return out


BASES = ("density", "compute", "parameters", "dense")


@dataclass(frozen=True)
class Difference:
    part: str  # model, calibration, evaluation, budget, recipe, basis, outcome
    acbench: str
    authors: str
    closable: bool  # acbench could run it as the authors did, offline
    note: str = ""

    def line(self) -> str:
        return f"{self.part}: {self.acbench}; the authors {self.authors}" + (f" ({self.note})" if self.note else "")


# ------------------------------------------------------------------------------------------- the acbench side


def quantization(fingerprint: dict) -> str | None:
    """The GGUF quantization the model's weights came from (Q4_1, Q4_K_M), from its file name; None otherwise."""
    if fingerprint.get("source") != "gguf":
        return None
    found = re.search(r"(?i)\b(q\d_[0-9a-z_]+?|q\d_\d|f16|bf16|f32)(?=\.gguf$)", str(fingerprint.get("file", "")))
    return found.group(1).upper() if found else "of unknown type"


def tuning(fingerprint: dict) -> str:
    """instruct where the model's file or alias says so (Instruct, -it), else base."""
    name = f"{fingerprint.get('file', '')} {fingerprint.get('alias', '')} {fingerprint.get('id', '')}".lower()
    return "instruct" if re.search(r"instruct|[-_]it\b|chat", name) else "base"


def precision(fingerprint: dict) -> str:
    q = quantization(fingerprint)
    held = fingerprint.get("loaded_dtype") or fingerprint.get("dtype") or "?"
    return f"{held} dequantised from 4-bit GGUF {q}" if q and q.startswith("Q4") else \
        (f"{held} from GGUF {q}" if q else held)


def _millions(n: float) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def model_differences(protocol: Protocol, cell: CellRecord) -> list[Difference]:
    fp = cell.model_fingerprint or {}
    paper = protocol.model
    out = []
    n = fp.get("parameters")
    if isinstance(n, int) and n > 0:
        if not math.isclose(n, paper.parameters, rel_tol=0.1):
            out.append(Difference("model size", f"{_millions(n)} parameters", f"{paper.name}, "
                                  f"{_millions(paper.parameters)}", False, f"{paper.parameters / n:.0f}x larger"
                                  if paper.parameters > n else f"{n / paper.parameters:.1f}x smaller"))
    else:
        out.append(Difference("model size", "parameter count not recorded in the cell", f"{paper.name}, "
                              f"{_millions(paper.parameters)}", False))
    ours = precision(fp)
    if quantization(fp) or not ours.startswith(paper.precision):
        out.append(Difference("model precision", ours, paper.precision, False))
    if tuning(fp) != paper.tuning:
        out.append(Difference("model tuning", tuning(fp), paper.tuning, False))
    return out


TEXT_NAMES = {"wiki": "acbench's Wikipedia sample", "wikitext2": "WikiText-2", "c4": "C4"}


def text_name(source) -> str:
    source = str(source)
    return TEXT_NAMES.get(source, source.removeprefix("file:"))


def evaluation_differences(protocol: Protocol, cell: CellRecord) -> list[Difference]:
    ev, cfg = protocol.evaluation, cell.task_config or {}
    out = []
    if cell.cell.task.startswith("ppl"):
        if ev.metric != "perplexity":
            out.append(Difference("metric", "perplexity", f"accuracy on {ev.tasks}", False,
                                  "the accuracy rows test it on LAMA and MMLU"))
        window, scored = cfg.get("seq_len"), cfg.get("scored") or (cfg.get("seq_len") or 1) - 1
        if ev.metric == "perplexity" and (window, scored) != (ev.window, ev.scored):
            out.append(Difference("evaluation windows", _windows(window, scored), _windows(ev.window, ev.scored), True))
        bos = cfg.get("bos") or cell.bos  # the task's resolved protocol (the run's may read "auto")
        if ev.metric == "perplexity" and bos != ev.bos:
            out.append(Difference("BOS", str(bos), str(ev.bos), True))
        if ev.metric == "perplexity" and text_name(cfg.get("source", "wiki")) != ev.data:
            out.append(Difference("evaluation text", text_name(cfg.get("source", "wiki")), ev.data, False))
    else:
        task = {"lama": "LAMA (cloze fact recall)", "mmlu": "MMLU"}.get(cell.cell.task, cell.cell.task)
        fmt = cfg.get("format")
        task += " in cloze form" if fmt == "cloze" else ""
        theirs = f"{ev.metric} on {ev.tasks}"
        if ev.metric != "accuracy":
            out.append(Difference("metric", f"accuracy on {task}", theirs, False))
        else:
            out.append(Difference("task set", task, ev.tasks, False, "their task set is not available offline"))
    return out


def _windows(window, scored) -> str:
    if window is None:
        return "no windows"
    return f"{window}-token windows" if scored == window - 1 else f"{window}-token windows, the last {scored} scored"


def calibration_differences(cell: CellRecord) -> list[Difference]:
    """A side's calibration against its method's authors' (size, mode, the text, a short calibration)."""
    cal = cell.calibration or {}
    spec, authors = cal.get("spec") or {}, cal.get("authors")
    if not isinstance(authors, dict):
        return []
    m = cell.cell.method
    out = []
    got, theirs = spec.get("samples", 0) * spec.get("seq_len", 0), authors["samples"] * authors["seq_len"]
    shape = f"{spec.get('samples')} x {spec.get('seq_len')}"
    if (spec.get("samples"), spec.get("seq_len")) != (authors["samples"], authors["seq_len"]):
        out.append(Difference(f"{m} calibration", f"{shape} ({got:,} tokens)", f"{authors['samples']} x "
                              f"{authors['seq_len']} ({theirs:,})", True))
    if calibration_mode(cal) != authors.get("mode"):
        out.append(Difference(f"{m} calibration mode", calibration_mode(cal), str(authors.get("mode")), True))
    if not str(authors.get("data")).startswith(text_name(spec.get("source", "wiki"))):
        out.append(Difference(f"{m} calibration text", text_name(spec.get("source", "wiki")),
                              str(authors.get("data")), False))
    if cal.get("short"):
        out.append(Difference(f"{m} calibration", f"short for {cal['short']['groups']} groups", "complete", True))
    return out


def setting_of(cell: CellRecord, setting: str):
    """The value a cell's method ran `setting` at: its allocation, or a method setting (its default where the
    stored settings leave it out, as a setting added later at its default is)."""
    if setting == "allocation":
        return cell.cell.allocation or UNIFORM
    stored = (cell.compression or {}).get("method_settings") or {}
    if setting in stored:
        return stored[setting]
    from acbench import methods

    try:
        return getattr(methods.get_method(methods.base_name(cell.cell.method)).Settings(), setting, None)
    except KeyError:
        return None


def recipe_differences(protocol: Protocol, cell: CellRecord) -> list[Difference]:
    from acbench import methods

    base = methods.base_name(cell.cell.method)
    out = []
    for r in protocol.recipes:
        if r.method != base:
            continue
        if not r.setting:
            out.append(Difference(f"{base} recipe", "not available in acbench", r.what, False))
            continue
        got = setting_of(cell, r.setting)
        if str(got).lower() != str(r.value).lower():
            out.append(Difference(f"{base} {r.setting}", str(got), f"{r.value} ({r.what})", True))
    return out


def ratio(cell: CellRecord, key: str) -> float | None:
    if cell.cell.method == DENSE:
        return 1.0
    v = (cell.compression or {}).get(key)
    return float(v) if isinstance(v, (int, float)) else None


BASIS_KEY = {"density": "density", "compute": "compute_ratio", "parameters": "param_ratio"}


def basis_of(a: CellRecord, b: CellRecord) -> list[str]:
    """The bases the two sides share: same compute, density or parameters (each within COMPUTE_GAP)."""
    out = []
    for basis, key in BASIS_KEY.items():
        x, y = ratio(a, key), ratio(b, key)
        if x is not None and y is not None and abs(x - y) <= COMPUTE_GAP:
            out.append(basis)
    return out


def budget_differences(protocol: Protocol, cells: list[CellRecord]) -> list[Difference]:
    """The sides' budgets, as their cells record them, against the paper's levels, and the basis they are compared
    on."""
    from acbench.studies import budget_label

    out = []
    off = sorted({budget_label(c) for c in cells if c.cell.method != DENSE} - set(protocol.levels))
    if off:
        out.append(Difference("budget", ", ".join(off), " and ".join(protocol.levels), True))
    if protocol.basis != "dense" and len(cells) == 2:
        shared = basis_of(*cells)
        if protocol.basis not in shared:
            key = BASIS_KEY[protocol.basis]
            got = ", ".join(f"{c.cell.method} {ratio(c, key):.2f}" if ratio(c, key) is not None else
                            f"{c.cell.method} ?" for c in cells)
            out.append(Difference("comparison basis", f"{protocol.basis} differs ({got})" +
                                  (f"; same {' and '.join(shared)}" if shared else "; neither compute nor density "
                                   "matched"), f"same {protocol.basis}", True))
    return out


def differences(protocol: Protocol, cells: list[CellRecord]) -> list[Difference]:
    """Every field where the row's cells differ from the paper's protocol. `cells`: the cell of each side of the
    row (the dense model's for a side that is dense)."""
    found = model_differences(protocol, cells[0]) + evaluation_differences(protocol, cells[0])
    for c in cells:
        found += calibration_differences(c) + recipe_differences(protocol, c)
    found += budget_differences(protocol, cells)
    seen, out = set(), []
    for d in found:  # a side-independent difference (the model, the text) once
        if d.line() not in seen:
            seen.add(d.line())
            out.append(d)
    return out

