"""The plan of a sweep: which result cells a run still lacks, and what each needs to be computed.

`plan(run, model, overwrite)` is a pure function of the run, the model's identity and the results tree on disk:
it loads nothing, computes nothing, and its `Cell`s are what every executor schedules (the local one in this
process, Ray over a cluster).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from acbench import methods
from acbench.core.record import ALL_GROUPS, ANALYSIS_CELL, DENSE, UNIFORM, CellId, variant_name
from acbench.core.stats import SPARSITY_FAMILY, RankSpec, SparsitySpec

from acbench.deploy.allocation import SPARSITY_RULES
from acbench.runner.config import DEFAULT_SOLVE_DTYPE, Run
from acbench.results.store import cell_path, cell_status, settings_hash


@dataclass(frozen=True)
class ModelInfo:
    """What the plan needs of a model, known before its weights load."""

    name: str  # the results folder it is filed under
    fingerprint: dict
    n_blocks: int


@dataclass(frozen=True)
class Cell:
    """One result file to compute: its identity, where it goes, and how the model is compressed for it."""

    id: CellId
    path: Path
    budget: RankSpec | SparsitySpec | None = None  # None: the dense model
    why: str = "missing"  # "missing", or what is wrong with the file there now

    @property
    def variant(self) -> tuple:
        """The compressed model this cell evaluates: cells of one variant share one compression."""
        return (self.id.method, self.budget, self.id.allocation)

    @property
    def label(self) -> str:
        if self.id.method == DENSE:
            return DENSE
        return f"{variant_name(self.id.method, self.id.allocation)} @ {self.budget.label}"


def task_key(task) -> str:
    return settings_hash(task.name, task.version, task.settings_dict())


def analysis_key(run: Run, analysis, fingerprint) -> str:
    used = {t: task_key(run.task(t)) for t in analysis.uses_tasks}
    # a float32 solve precision enters the key (the analysis compresses); the default leaves older keys as they were
    precision = [] if run.config.solve_dtype == DEFAULT_SOLVE_DTYPE else [{"solve_dtype": run.config.solve_dtype}]
    return settings_hash(analysis.name, analysis.version, analysis.settings_dict(), used,
                         run.calibration.as_dict(), fingerprint, run.config.budget, *precision)


def analysis_method(name: str) -> str:
    """The `method` of an analysis cell ("rho-analysis"): its folder beside the methods' in the results tree."""
    return f"{name}-analysis"


def variants(run: Run) -> list[tuple[str, RankSpec | SparsitySpec, str]]:
    """(method, budget, allocation) of every compressed model of the run: a rank ratio and rule per low-rank method
    (uniform and the rank rules), a pattern and rule per sparsity one (uniform; a density rule at unstructured
    densities only, since an N:M pattern is one pattern in every group)."""
    out = []
    for m in run.methods:
        if methods.family_of(m) == SPARSITY_FAMILY:
            # `all` may bring a method to a pattern it keeps none of (teal to 2:4): no cell there
            out += [(m, p, rule) for p in run.patterns if methods.pattern_problem(m, p, run.method_options(m)) is None
                    for rule in run.allocate
                    if rule == UNIFORM or (rule in SPARSITY_RULES and not p.structured
                                           and methods.get_method(methods.base_name(m)).takes_group_density)]
        else:
            out += [(m, r, rule) for r in run.ranks for rule in run.allocate if rule not in SPARSITY_RULES]
    return out


def variant_cell_id(run: Run, model: ModelInfo, method: str, budget, rule: str, task: str) -> CellId:
    """The identity of one compressed variant's cell on one task (the run resolved for the model's blocks)."""
    sparse = isinstance(budget, SparsitySpec)
    scope = run.selection.scope
    key = settings_hash(task_key(run.tasks[task]), run.method_key(method, rule, scope, budget), model.fingerprint)
    return CellId(model.name, method, budget.ratio, budget.budget if sparse else run.config.budget, task, key,
                  allocation=rule, scope=scope)


def path_of(run: Run, i: CellId) -> Path:
    return cell_path(run.output, i.model, i.method, i.rank, i.budget, i.task, i.key, allocation=i.allocation,
                     scope=i.scope if i.method != DENSE else ALL_GROUPS)


def plan(run: Run, model: ModelInfo, overwrite: bool | None = None) -> list[Cell]:
    """Every cell of the run that is not stored and valid (all of them with `overwrite`), in the order a local
    executor computes them: the dense model's, then each variant's, then the analyses'."""
    overwrite = run.config.overwrite if overwrite is None else overwrite
    run = run.for_blocks(model.n_blocks)  # a prepared run is resolved already: this checks it is for this model
    wanted = []
    for name, task in run.tasks.items():
        key = settings_hash(task_key(task), None, model.fingerprint)
        wanted.append(Cell(CellId(model.name, DENSE, None, run.config.budget, name, key), Path()))
    for m, budget, rule in variants(run):
        for name in run.tasks:
            wanted.append(Cell(variant_cell_id(run, model, m, budget, rule, name), Path(), budget))
    if run.ranks:  # analyses run at rank ratios
        for name, analysis in run.analyses.items():
            key = analysis_key(run, analysis, model.fingerprint)
            for r in run.ranks:
                cell = CellId(model.name, analysis_method(name), r.ratio, run.config.budget, name, key,
                              kind=ANALYSIS_CELL)
                wanted.append(Cell(cell, Path(), r))
    out = []
    for c in wanted:
        path = path_of(run, c.id)
        why = "overwrite" if overwrite else cell_status(path)
        if why is not None:
            out.append(Cell(c.id, path, c.budget, why))
    return out
