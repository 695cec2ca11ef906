"""What the user typed (`RunConfig`: flags, a YAML file) and what the run does (`Run`: validated and resolved).

`resolve_run(config)` is the one boundary: every user error is found there, before any weights load,
and the `Run` it returns is frozen: methods expanded, budgets parsed, tasks and analyses built. The tokenizer's
BOS default is settled later by `Run.with_bos`, which returns a new Run (the config is never rewritten).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from acbench import methods
from acbench import tasks as task_registry
from acbench.core.errors import UserError, did_you_mean
from acbench.core.record import DENSE, UNIFORM
from acbench.core.registry import code_key
from acbench.core.settings import type_problems
from acbench.core.stats import CALIBRATION_MODES, LOW_RANK_FAMILY, SEQUENTIAL, SPARSITY_FAMILY, RankSpec, SparsitySpec
from acbench.core.units import parse_bytes
from acbench.tasks.base import RunShared, Task, UntilDecided

from acbench.deploy.allocation import LOW_RANK_RULES, RULES, SPARSITY_RULES, check_rules
from acbench.calibration.engine import CalibSpec, needed_stats
from acbench.model.sources import DEFAULT_MODEL
from acbench.runner.selection import ALL, Selection

# MMLU is one flag away (`--tasks mmlu ...`): 0-shot on a 270M model it sits at chance and costs LAMA probes
DEFAULT_TASKS = ("lama", "ppl-token", "rho")
BOS_PROTOCOLS = ("auto", "window", "stream", "none")
SOLVE_DTYPES = ("float64", "float32")
DEFAULT_SOLVE_DTYPE = "float64"


@dataclass(frozen=True)
class RunConfig:
    """Every setting of `bench run` as given; a task's own sizes are its `task_options` (the CLI's --lama-limit
    and friends are shortcuts into them)."""

    model: str = DEFAULT_MODEL
    methods: list[str] = field(default_factory=lambda: ["all"])
    # the two families' budgets: rank ratios (low-rank) and N:M patterns or densities (sparsity). Unset ranks are
    # [0.5] unless a sparsity is given (then []): `--methods all` runs the families whose budget is given.
    ranks: list[float] | None = None
    sparsity: list[str] | None = None
    budget: str = "rank"
    rank_align: int = 1
    # how k is split across the selected groups: uniform (each group at the run's ratio), fisher, variance
    allocate: list[str] = field(default_factory=lambda: ["uniform"])
    groups: list[str] | None = None  # group kinds to compress (acbench.model.groups.GROUP_KINDS); None: all
    blocks: str | None = None  # block indices and ranges to compress, e.g. "0-5,12"; None: all
    tasks: list[str] = field(default_factory=lambda: list(DEFAULT_TASKS))
    # calibration
    calib_source: str = "wiki"
    calib_samples: int = 12
    calib_seq_len: int = 256
    # one-pass (default: every block on the dense model, one calibration for every method) or sequential (blocks
    # calibrated and compressed in order, each on the compressed blocks' outputs)
    calibration_mode: str = "one-pass"
    # as-given (the sizes and mode above, for every method) or authors (each method at its paper's windows, length
    # and mode, from the same text; a method whose authors state none keeps the sizes above)
    calibration: str = "as-given"
    pair_tokens: int = 512
    seed: int = 0
    # BOS protocol for calibration windows and ppl-token: window | stream | none | auto (the tokenizer's default)
    bos: str = "auto"
    # execution
    device: str = "cpu"
    device_map: str | None = None  # "auto": accelerate places the blocks across the GPUs (a model larger than one)
    solve_device: str = "auto"  # where the solves run: auto (the device of the model's first parameter), cpu, cuda[:i]
    solve_dtype: str = "float64"  # the low-rank solves' precision: float64, or float32 (docs/large-models.md, Solve precision: its measured agreement)
    dtype: str = "float32"
    batch_size: int = 4
    stats_memory: str | None = None  # memory for calibration statistics per pass, e.g. "16GB" (default: half of free)
    output: str = "results"
    # executor: local (this process) or ray (cells spread over a Ray cluster's workers)
    executor: str = "local"
    ray_address: str | None = None  # None: a Ray instance on this machine; "auto" or HOST:PORT: a running cluster
    ray_timeout: float = 30.0  # seconds to reach --ray-address before giving up with one line
    retries: int = 2  # Ray: times a task whose worker died (or that raised a runtime error) is run again
    threads: int | None = None  # torch intra-op threads (default: the CPUs this process may use; Ray: its CPUs)
    overwrite: bool = False
    method_options: dict = field(default_factory=dict)  # {method: {setting: value}}
    task_options: dict = field(default_factory=dict)  # {task: {setting: value}}
    analysis_options: dict = field(default_factory=dict)  # {analysis: {setting: value}}, e.g. {"rho": {"units": 4}}
    measure_latency: bool = True
    latency_seconds: float = 8.0  # per variant: the cap on its rounds against dense (acbench.measure.latency.LatencySpec)
    report: bool = True
    # {task: margin}: the leaderboard calls two methods equivalent within it (two one-sided tests); unset tasks keep
    # their own default (acbench.results.leaderboard_display.check_margins)
    margin: dict = field(default_factory=dict)
    # evaluate the tasks that can (lama, ppl-token) block by block until each comparison with `reference` is
    # decided by a confidence sequence, or its budget is spent (docs/decisions.md)
    until_decided: bool = False
    reference: str | None = None  # None: DEFAULT_REFERENCE; set only with until_decided (alone it would do nothing)
    progress: bool = True

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in fields(cls)}

    def as_dict(self) -> dict:
        return asdict(self)


# how a method is calibrated (Run.calibration_of)
SHARED_CALIBRATION = "shared"  # the run's one calibration (its sizes, one-pass), computed once for every such method
OWN_CALIBRATION = "own"  # one-pass at sizes of its own (--calibration authors), computed once for the method
SEQUENTIAL_CALIBRATION = "sequential"  # block by block as it is compressed: no statistics before its deployment
NO_CALIBRATION = "none"  # it reads no statistics (an allocation rule reads the run's shared calibration)


@dataclass(frozen=True)
class MethodCalibration:
    """A method's calibration in a run: its kind (above), its spec (windows, length, mode), the statistics it
    reads."""
    kind: str
    spec: CalibSpec
    needs: frozenset


@dataclass(frozen=True)
class Run:
    """A validated run: what every later stage reads (plan, execute, the executors), never the raw config."""

    config: RunConfig
    methods: tuple[str, ...]
    ranks: tuple[RankSpec, ...]
    patterns: tuple[SparsitySpec, ...]
    allocate: tuple[str, ...]
    selection: Selection  # as typed until `for_blocks` resolves it against the model
    bos: str  # "auto" until `with_bos` settles it from the tokenizer
    tasks: Mapping[str, Task]  # the model tasks, sized for this run
    analyses: Mapping  # {name: Analysis}: the names of tasks that are analyses, built from the analyses registry
    stats_memory: int | None
    n_blocks: int | None = None  # the model's blocks, once `for_blocks` resolved the selection against them

    @property
    def output(self) -> Path:
        return Path(self.config.output)

    @property
    def shared(self) -> RunShared:
        return RunShared(seed=self.config.seed, batch_size=self.config.batch_size, bos=self.bos)

    def task(self, name: str, **overrides) -> Task:
        """A task as this run sizes it, with `overrides` on top (an analysis's smaller probes)."""
        options = {**self.config.task_options.get(name, {}), **overrides}
        task = task_registry.get_task(name).for_run(options, self.shared)
        if self.config.until_decided and not overrides:  # an analysis's own probes are evaluated whole
            from acbench.results.leaderboard_display import check_margins

            task = until_decided_task(task, self.config, check_margins(self.config.margin))
        return task

    def with_bos(self, bos: str) -> "Run":
        """The run under the tokenizer's resolved BOS protocol: one protocol for calibration and the tasks."""
        run = replace(self, bos=bos)
        return replace(run, tasks={name: run.task(name) for name in self.tasks})

    def for_blocks(self, n_blocks: int, kinds: tuple[str, ...] | None = None) -> "Run":
        """The run with its group selection checked against a model of `n_blocks` blocks and canonical (a selection
        of everything is the default scope): resolved once, when the model is opened, and read by the plan and the
        workers."""
        if self.n_blocks is not None:
            if self.n_blocks != n_blocks:
                raise ValueError(f"run resolved for {self.n_blocks} blocks, used on a model of {n_blocks}")
            return self
        return replace(self, selection=self.selection.resolve(n_blocks, kinds), n_blocks=n_blocks)

    def compressor(self, variant: str):
        """The Compressor of a method or variant under the run's --method-option values for its base name."""
        return methods.build(variant, self.config.method_options.get(methods.base_name(variant)))

    def method_options(self, variant: str) -> dict | None:
        return self.config.method_options.get(methods.base_name(variant))

    @property
    def calibration(self) -> CalibSpec:
        c = self.config
        return CalibSpec(samples=c.calib_samples, seq_len=c.calib_seq_len, seed=c.seed, pair_tokens=c.pair_tokens,
                         source=c.calib_source, bos=self.bos)

    def calibration_for(self, variant: str) -> CalibSpec:
        """The calibration a method's cells read: the run's (in --calibration-mode), or under --calibration authors
        its authors' windows, length and mode (the run's where they state none)."""
        spec = replace(self.calibration, mode=self.config.calibration_mode)
        if self.config.calibration == AUTHORS:
            own = self.compressor(variant).authors_calibration
            if own is not None:
                return replace(spec, samples=own.samples, seq_len=own.seq_len, mode=own.mode)
        return spec

    def calibration_of(self, variant: str) -> MethodCalibration:
        """How a method's cells are calibrated, decided here once for every consumer (a sweep's worker, `bench
        compress` and the Python calls, the cost estimates): see MethodCalibration."""
        spec, needs = self.calibration_for(variant), self.compressor(variant).required_stats()
        if not needs:
            kind = NO_CALIBRATION
        elif spec.mode == SEQUENTIAL:
            kind = SEQUENTIAL_CALIBRATION
        else:
            kind = SHARED_CALIBRATION if spec == self.calibration else OWN_CALIBRATION
        return MethodCalibration(kind, spec, frozenset(needs))

    def uses_stats(self, variant: str, allocation: str = UNIFORM) -> bool:
        return bool(self.compressor(variant).required_stats() or RULES[allocation])

    def stats_needs(self) -> frozenset[str]:
        """The statistics the sweep's shared calibration holds (the methods that read it, allocation rules,
        analyses): one calibration serves every such cell, whichever are missing, so a rerun and every worker read
        the same cache folder. A method with a calibration of its own (sequential, or its authors' sizes) is not
        in it."""
        return needed_stats([self.compressor(m) for m in self.methods
                             if self.calibration_of(m).kind == SHARED_CALIBRATION]).union(
            *(a.needs for a in self.analyses.values()), *(RULES[rule] for rule in self.allocate))

    def own_calibrations(self) -> dict[str, CalibSpec]:
        """{method: its calibration} for the methods that read statistics outside the shared calibration."""
        return {m: plan.spec for m in self.methods
                if (plan := self.calibration_of(m)).kind in (OWN_CALIBRATION, SEQUENTIAL_CALIBRATION)}

    def method_key(self, variant: str, allocation: str = UNIFORM, scope: str = ALL,
                   budget: RankSpec | SparsitySpec | None = None) -> dict:
        comp = self.compressor(variant)
        key = {"settings": comp.settings_dict(), "version": comp.version,
               "calibration": self.calibration_for(variant).as_dict() if comp.required_stats() or RULES[allocation]
               else None}
        code = code_key(type(comp))  # a plugin's code digest: an edit without a version bump still recomputes
        if code is not None:
            key["code"] = code
        if isinstance(budget, SparsitySpec):  # the pattern is the cell's budget; a rank alignment does not apply
            return {**key, "budget": budget.budget}
        key.update(budget=self.config.budget, align=self.config.rank_align)
        # Only a non-default allocation, selection or solve precision enters the key: older cells keep their keys.
        if allocation != UNIFORM:
            key["allocation"] = allocation
        if scope != ALL:
            key["scope"] = scope
        if self.config.solve_dtype != DEFAULT_SOLVE_DTYPE:
            key["solve_dtype"] = self.config.solve_dtype
        return key

    def describe(self) -> list[str]:
        """The run's opening log lines: what it computes, and at which sizes."""
        c = self.config
        what = (f"model {c.model}, methods {', '.join(self.methods) or 'none (dense only)'}"
                + (f", ranks {', '.join(r.label for r in self.ranks)} ({c.budget} budget"
                   + ("" if self.allocate == (UNIFORM,) else f"; allocation {', '.join(self.allocate)}") + ")"
                   if self.ranks else "")
                + (f", sparsity {', '.join(p.label for p in self.patterns)}" if self.patterns else "")
                + (f", tasks {', '.join(c.tasks)}" if c.tasks else ""))
        needs = self.stats_needs()
        calibration = ([f"calibration {c.calib_samples} x {c.calib_seq_len} tokens ({c.calib_source}, seed {c.seed}"
                        + (f", {c.pair_tokens} (x, g) pairs/group)" if "pairs" in needs else ")")]
                       if needs else [])  # a run that reads no statistics does not calibrate: no size to state
        calibration += [f"{m}: calibration {spec.samples} x {spec.seq_len} tokens, {spec.mode}"
                        + (" (its authors')" if c.calibration == AUTHORS and
                           self.compressor(m).authors_calibration is not None else "")
                        for m, spec in self.own_calibrations().items()]
        sizes = calibration + [n for t in self.tasks.values() if (n := t.size_note())]
        lines = [what] + (["sizes: " + "; ".join(sizes)] if sizes else [])
        if c.solve_dtype != DEFAULT_SOLVE_DTYPE and self.ranks:
            lines.append(f"solves in {c.solve_dtype}: the eigen-solves of the statistics (pca, fasc-kfac, fasc, "
                         "espace-nl) lose accuracy there; docs/large-models.md, Solve precision, gives the measured "
                         "agreement")
        return lines


# ---------------------------------------------------------------- the boundary: config -> Run

def _is_ratio(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and not math.isnan(x) and 0 < x <= 1


def split_method_names(items) -> list[str]:
    """acbench.methods.split_methods, its refusal (an empty name between commas) as the one-line user error."""
    try:
        return methods.split_methods(items)
    except ValueError as e:
        raise UserError(str(e)) from None


def check_ranks(ranks) -> None:
    for r in ranks:
        if not _is_ratio(r):
            raise UserError(f"rank ratio {r} is outside (0, 1]: pass e.g. --rank 0.5 (1.0 keeps full rank)")
    _once("--rank", ranks)


def _once(flag: str, budgets) -> None:
    """A budget given twice would plan one cell twice: refused."""
    twice = sorted({str(b) for b in budgets if budgets.count(b) > 1})
    if twice:
        raise UserError(f"{flag} {twice[0]} is given twice: give each budget once")


def check_task_names(names, analysis_names=frozenset()) -> None:
    """Every name is a registered task or one of `analysis_names`; otherwise one did-you-mean over both."""
    for name in names:
        if name not in analysis_names and name not in task_registry.REGISTRY:
            known = set(task_registry.known_tasks()) | set(analysis_names)
            raise UserError(f"unknown task '{name}'.{did_you_mean(name, known)} See `bench ls tasks` and "
                            "`bench ls analyses`.")


def parse_sparsity(values) -> list[SparsitySpec]:
    """--sparsity values as SparsitySpecs, or one line naming the bad one (run and plan alike)."""
    out = []
    for p in values:
        try:
            out.append(SparsitySpec.parse(p))
        except ValueError as e:
            raise UserError(f"--sparsity: {e}") from None
    return out


def resolve_budgets(config: RunConfig) -> tuple[tuple[str, ...], list[float], list[SparsitySpec]]:
    """Methods expanded by family (`all` = every method of the families whose budget flag is given), ranks and
    sparsity patterns checked; a method named without its family's budget is refused."""
    if config.budget not in ("rank", "params"):
        raise UserError(f"--budget {config.budget} is unknown: use rank or params")
    if config.rank_align < 1:
        raise UserError("--rank-align must be a positive integer")
    given = split_method_names(config.methods)
    if DENSE in given:
        if given != [DENSE]:
            raise UserError("dense is always evaluated: leave it out of --methods, or pass --methods dense alone")
        if config.ranks or config.sparsity:
            raise UserError("--methods dense evaluates the model as it is: leave out --rank and --sparsity")
        return (), [], []
    patterns = []
    if config.sparsity is not None:
        values = config.sparsity if isinstance(config.sparsity, list) else [config.sparsity]
        patterns = parse_sparsity(values)
        _once("--sparsity", [p.label for p in patterns])
        if not patterns:
            raise UserError("--sparsity is empty: pass N:M patterns (2:4 8:16) or densities (0.5)")
    ranks = config.ranks
    if ranks is None:
        ranks = [] if patterns else [0.5]
    elif not ranks:
        raise UserError("--rank is empty: pass rank ratios in (0, 1], e.g. --rank 0.5")
    families = [f for f, given in ((LOW_RANK_FAMILY, ranks), (SPARSITY_FAMILY, patterns)) if given]
    try:
        names = methods.expand_methods(config.methods, families)
    except ValueError as e:
        raise UserError(str(e)) from None
    except KeyError as e:
        raise UserError(str(e) + " Or pass --methods all.") from None
    for m in names:
        family = methods.family_of(m)
        if family not in families:
            flag = "--sparsity 2:4 (an N:M pattern or a density)" if family == SPARSITY_FAMILY else "--rank 0.5"
            raise UserError(f"{m} is a {family} method but no {family} budget is given: add {flag}, or leave "
                            f"{m} out")
    options = config.method_options if isinstance(config.method_options, dict) else {}
    names = _without_refused_patterns(names, given, patterns, options)
    if not names:
        raise UserError("no methods given: pass --methods all or names from `bench ls methods`")
    check_ranks(ranks)
    _check_distinct(names, config)
    return tuple(names), ranks, patterns


def check_budgets_used(config: RunConfig, names, analyses) -> None:
    """A budget flag that nothing of the run uses would be printed in the header and ignored: refused."""
    families = {methods.family_of(m) for m in names}
    if config.sparsity and SPARSITY_FAMILY not in families:
        raise UserError(f"--sparsity {' '.join(map(str, config.sparsity))} is given, but no sparsity method is named "
                        f"({', '.join(names)}): add one (act-sparse, teal, wanda, magnitude-prune) or leave out "
                        "--sparsity")
    if config.ranks and LOW_RANK_FAMILY not in families and not analyses:
        raise UserError(f"--rank {' '.join(map(str, config.ranks))} is given, but no low-rank method or analysis is "
                        f"named ({', '.join(names)}): add one (pca, fasc, ...) or leave out --rank")



def _check_distinct(names, config: RunConfig) -> None:
    """Two spellings of one method (act-sparse and act-sparse:score=abs, its default) would make two rows of one
    cell: refused, naming both."""
    seen: dict = {}
    for n in names:
        try:
            comp = methods.build(n, config.method_options.get(methods.base_name(n)))
        except (ValueError, TypeError):
            continue  # named by check_methods, with the fix
        same = (methods.base_name(n), json.dumps(comp.settings_dict(), sort_keys=True, default=str))
        if same in seen:
            raise UserError(f"--methods names one method twice: {seen[same]} and {n} have the same settings (a "
                            "setting left out takes its default): name it once")
        seen[same] = n


def _without_refused_patterns(names: list[str], given: list[str], patterns, options: dict) -> list[str]:
    """A sparsity method named on its own must keep every given pattern (else one line naming it and the fix);
    one that `all` brought in is left out where it keeps none of them (teal under --sparsity 2:4), and its
    refused patterns are left out of the plan (acbench.runner.cells.variants)."""
    explicit = set(methods.expand_methods([g for g in given if g != "all"])) if given else set()
    out = []
    for m in names:
        if methods.family_of(m) == SPARSITY_FAMILY:
            problems = [p for p in (methods.pattern_problem(m, pat, options.get(methods.base_name(m)))
                                    for pat in patterns) if p]
            if problems and m in explicit:
                raise UserError(problems[0])
            if len(problems) == len(patterns):
                continue
        out.append(m)
    return out


def check_rank_flags_used(config: RunConfig, names, analyses) -> None:
    """--budget params and --rank-align set how a rank is read: a run with no low-rank method (and no analysis at a
    rank) reads none, and would print them in its header, unused."""
    if not names or LOW_RANK_FAMILY in {methods.family_of(m) for m in names} or (analyses and config.ranks):
        return
    for flag, given in (("--budget params", config.budget != "rank"),
                        (f"--rank-align {config.rank_align}", config.rank_align != 1)):
        if given:
            raise UserError(f"{flag} sets how a rank budget is read, but no low-rank method is named "
                            f"({', '.join(names)}): leave it out, or add a low-rank method and --rank")


def density_methods() -> list[str]:
    """The registered sparsity methods a density rule (greedy) applies to."""
    return [n for n in methods.known_methods() if methods.family_of(n) == SPARSITY_FAMILY
            and methods.get_method(n).takes_group_density]


AS_GIVEN, AUTHORS = "as-given", "authors"


def check_calibration(config: RunConfig, names) -> None:
    """--calibration and --calibration-mode: known values, a mode every method can run in, and nothing that would
    do nothing (a mode or the authors' sizes for methods that read no statistics)."""
    from acbench.deploy.compression import sequential_problem

    if config.calibration not in (AS_GIVEN, AUTHORS):
        raise UserError(f"--calibration {config.calibration!r} is unknown: use as-given (default: the calibration "
                        "flags for every method) or authors (each method at its paper's sizes and mode)")
    if config.calibration_mode not in CALIBRATION_MODES:
        raise UserError(f"--calibration-mode {config.calibration_mode!r} is unknown: use one-pass (default) or "
                        "sequential")
    comps = {m: methods.build(m, config.method_options.get(methods.base_name(m))) for m in names}
    reading = [m for m in names if comps[m].required_stats()]
    if config.calibration == AUTHORS:
        defaults = RunConfig()
        given = [f"--{k.replace('_', '-')}" for k in ("calib_samples", "calib_seq_len", "calibration_mode")
                 if getattr(config, k) != getattr(defaults, k)]
        if given:
            raise UserError(f"--calibration authors sets each method's windows, length and mode, and {given[0]} "
                            f"sets them too: leave {given[0]} out, or use --calibration as-given")
        if not any(comps[m].authors_calibration for m in reading):
            raise UserError("--calibration authors: none of this run's methods states its authors' calibration "
                            f"({', '.join(names) or 'none'}); `bench ls methods` lists those that do: add one, or "
                            "leave the flag out")
    sequential = [m for m in reading if config.calibration_mode == SEQUENTIAL or (
        config.calibration == AUTHORS and getattr(comps[m].authors_calibration, "mode", None) == SEQUENTIAL)]
    if config.calibration_mode == SEQUENTIAL and not reading:
        raise UserError(f"--calibration-mode sequential: none of this run's methods reads calibration statistics "
                        f"({', '.join(names) or 'none'}): add one (e.g. sparsegpt, wanda) or leave the flag out")
    for m in sequential:
        problem = sequential_problem(comps[m])
        if problem:
            raise UserError(problem)
    if (config.calibration == AUTHORS or sequential) and any(r != UNIFORM for r in config.allocate):
        what = "--calibration authors" if config.calibration == AUTHORS else "sequential calibration"
        raise UserError(f"--allocate {next(r for r in config.allocate if r != UNIFORM)} splits the budget from the "
                        f"run's shared one-pass calibration, and {what} gives methods calibrations of their own: "
                        "use --allocate uniform, or run the allocation in another command")


def check_allocation(config: RunConfig, names) -> None:
    """--allocate names rules for the run's methods: rank rules (fisher, variance) split a parameter budget across a
    low-rank method's groups, the density rule (greedy) an unstructured density across a sparsity method's; uniform
    serves both. Every method must have a rule that applies to it."""
    if not config.allocate:
        raise UserError("--allocate is empty: pass uniform, fisher, variance or greedy")
    check_rules(config.allocate, config.budget, config.rank_align)
    rank_rules = [r for r in config.allocate if r in LOW_RANK_RULES]
    density_rules = [r for r in config.allocate if r in SPARSITY_RULES]
    uniform = UNIFORM in config.allocate
    sparse = [m for m in names if methods.family_of(m) == SPARSITY_FAMILY]
    low_rank = [m for m in names if methods.family_of(m) != SPARSITY_FAMILY]
    if sparse and not uniform and not density_rules:
        raise UserError(f"--allocate {rank_rules[0]} splits a rank budget, but {', '.join(sparse)} keep a pattern "
                        "per token: add uniform (or greedy, for unstructured densities) to --allocate, or run them "
                        "in another command")
    if low_rank and not uniform and not rank_rules:
        raise UserError(f"--allocate {density_rules[0]} splits a sparsity density, but {', '.join(low_rank)} keep "
                        "a rank: add uniform (or fisher / variance with --budget params) to --allocate, or run them "
                        "in another command")
    if density_rules:
        given = set(methods.expand_methods([g for g in config.methods if g != "all"])) if isinstance(
            config.methods, list) else set()
        cannot = [m for m in sparse if not methods.get_method(methods.base_name(m)).takes_group_density]
        named = [m for m in cannot if m in given]
        if named:
            raise UserError(f"--allocate {density_rules[0]} sets a density per input group, which {', '.join(named)} "
                            f"cannot deploy as allocated (only {', '.join(density_methods())} keep each group's own "
                            "density of its own input): run them under uniform, or in another command")
        if sparse and not uniform and len(cannot) == len(sparse):
            raise UserError(f"--allocate {density_rules[0]} applies to {', '.join(density_methods())}, and none of "
                            f"them is named ({', '.join(sparse)}): add uniform to --allocate or name one of them")
        sparse = [m for m in sparse if m not in cannot]
        patterns = parse_sparsity(config.sparsity or [])
        if not sparse or not any(not p.structured for p in patterns):
            raise UserError(f"--allocate {density_rules[0]} sets a density per input group for activation sparsity: "
                            "name a sparsity method with an unstructured density (e.g. --methods teal --sparsity 0.5)")
        if not uniform and any(p.structured for p in patterns):
            raise UserError(f"--allocate {density_rules[0]} does not apply to N:M patterns "
                            f"({', '.join(p.budget for p in patterns if p.structured)}): add uniform to --allocate "
                            "for them, or leave them out")
    if rank_rules:
        per_site = [m for m in low_rank if not methods.build(
                    m, config.method_options.get(methods.base_name(m))).projection]
        if per_site:
            raise UserError(f"--allocate {rank_rules[0]} sets one k per input group, but {', '.join(per_site)} "
                            f"factorise{'s' if len(per_site) == 1 else ''} each site on its own: run them in another "
                            "command, or name projection methods (e.g. --methods pca,whitened-svd,fasc-kfac,fasc)")


def check_methods(config: RunConfig, names) -> None:
    for name, opts in config.method_options.items():
        try:
            methods.get_method(name).from_options(opts)
        except (KeyError, ValueError, TypeError) as e:
            raise UserError(f"method options for '{name}': {e}") from None
    for variant in names:
        try:
            methods.build(variant, config.method_options.get(methods.base_name(variant)))
        except (KeyError, ValueError, TypeError) as e:
            raise UserError(f"method '{variant}': {e}") from None


DEFAULT_REFERENCE = "pca"


def reference_method(config: RunConfig) -> str:
    """The method --until-decided tests every other against."""
    return DEFAULT_REFERENCE if config.reference is None else config.reference


def check_settings_used(config: RunConfig, model_tasks: dict, margins: dict) -> None:
    """A setting that would change nothing in this run is refused in one line naming it (docs/cli.md): a margin for
    a task the run does not score, --reference without --until-decided, --until-decided where no task can stop
    early."""
    unscored = sorted(set(margins) - set(model_tasks))
    if unscored:
        raise UserError(f"--margin sets {', '.join(unscored)}, which this run does not score "
                        f"({', '.join(sorted(model_tasks)) or 'no task'}): add it to --tasks, or leave it out (`bench "
                        "report --margin` sets the margins of stored cells)")
    if config.reference is not None and not config.until_decided:
        raise UserError(f"--reference {config.reference!r} only names the method --until-decided tests against, and "
                        "this run evaluates every item: add --until-decided, or leave --reference out")
    if config.until_decided and all(type(t).item_pool is Task.item_pool for t in model_tasks.values()):
        raise UserError(f"--until-decided stops the tasks that score items in blocks (lama, mmlu, ppl-token), and this "
                        f"run's tasks ({', '.join(sorted(model_tasks)) or 'analyses only'}) are evaluated whole: add one of them to "
                        "--tasks, or leave --until-decided out")


def check_until_decided_reference(config: RunConfig, names) -> None:
    reference = reference_method(config)
    if not isinstance(reference, str) or reference not in names:
        raise UserError(f"--until-decided tests every method against --reference {reference!r}, which this run "
                        f"does not compress: add it to --methods or name one of {', '.join(names) or 'them'}")


def until_decided_task(task: Task, config: RunConfig, margins: dict) -> Task:
    """The task as --until-decided evaluates it: its budget every item unless --lama-limit / --ppl-windows (or its
    option) set one, and its comparisons stopped when decided. A task without an item pool is returned as it is
    (evaluated whole)."""
    import dataclasses

    if type(task).item_pool is Task.item_pool:
        return task
    given = config.task_options.get(task.name) or {}
    whole = {f: None for f in UNTIL_DECIDED_BUDGETS.get(task.name, ()) if f not in given}
    out = type(task)(dataclasses.replace(task.settings, **whole)) if whole else task
    out.until_decided = UntilDecided(reference_method(config), margin=margins.get(task.name, task.margin))
    return out


# None there: every item
UNTIL_DECIDED_BUDGETS = {"lama": ("per_relation",), "ppl-token": ("max_windows",), "mmlu": ("limit",)}


def build_tasks(config: RunConfig, analyses: Mapping) -> dict[str, Task]:
    """The run's model tasks; every --task-option block is checked, also of a task this run does not run (that each
    is a mapping, `check_option_blocks` made sure)."""
    shared = RunShared(seed=config.seed, batch_size=config.batch_size, bos=config.bos)
    built = {}
    for name in list(config.task_options) + [t for t in config.tasks if t not in analyses]:
        try:
            built[name] = task_registry.get_task(name).for_run(config.task_options.get(name), shared)
        except UserError:
            raise
        except (ValueError, TypeError) as e:  # the message names the task and its setting
            raise UserError(f"{e}: fix --task-option {name}.<setting> or its shortcut flag (`bench ls tasks`)") from None
    return {name: built[name] for name in config.tasks if name not in analyses}


_POSITIVE = {"calib_samples": 1, "calib_seq_len": 2, "pair_tokens": 1, "batch_size": 1}


def ray_host_port(address: str) -> tuple[str, int] | None:
    """--ray-address as (host, port); None for `auto` (Ray finds the cluster itself)."""
    if address == "auto":
        return None
    host, _, port = str(address).split("://", 1)[-1].rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"--ray-address {address} is not HOST:PORT with a port in 1-65535 (or auto)")
    return host, int(port)


OPTION_BLOCKS = {"method_options": "--method-option", "task_options": "--task-option",
                 "analysis_options": "--analysis-option"}


def check_option_blocks(config: RunConfig) -> None:
    """Each options block is {name: {setting: value}}: a block or a name's settings that are not mappings (a YAML
    `method_options: {fasc: 5}`) are refused naming the block, before anything reads them."""
    for attr, flag in OPTION_BLOCKS.items():
        block = getattr(config, attr)
        if not isinstance(block, dict):
            raise UserError(f"{attr} must be a mapping of names to settings, got {block!r}: fix {flag} or that key "
                            "in the --config file")
        for name, settings in block.items():
            if not isinstance(name, str) or not isinstance(settings, dict):
                raise UserError(f"{attr}: {name!r} must map to a mapping of setting: value, got {settings!r}: fix "
                                f"{flag} {name}.<setting>=<value> or that block of the --config file")
            bad = [k for k in settings if not isinstance(k, str)]
            if bad:
                raise UserError(f"{attr}: {name}'s setting name {bad[0]!r} is not a string: fix that block of the "
                                "--config file")


def check_solve_device(device) -> None:
    if not isinstance(device, str) or not re.fullmatch(r"auto|cpu|cuda(:\d+)?", device):
        raise UserError(f"--solve-device {device!r} is not supported: use auto (the model's device), cpu or "
                        "cuda[:<index>]")
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise UserError(f"--solve-device {device}: this machine has no CUDA device (torch.cuda.is_available() is "
                            "False): use --solve-device cpu or auto")
        index = int(device.split(":")[1]) if ":" in device else 0
        if index >= torch.cuda.device_count():
            raise UserError(f"--solve-device {device}: this machine has {torch.cuda.device_count()} CUDA device(s): "
                            f"use an index below {torch.cuda.device_count()}")


def check_solve_dtype(dtype) -> None:
    if dtype not in SOLVE_DTYPES:
        raise UserError(f"--solve-dtype {dtype!r} is not supported: use float64 (default) or float32")


def solve_device_for(config: RunConfig, model) -> str:
    """The device the solves run on: --solve-device, with auto meaning the device of the model's first parameter
    (the host for a model on the CPU or spread by device_map over several devices from the host)."""
    if config.solve_device != "auto":
        return config.solve_device
    first = next(model.parameters(), None)
    return str(first.device) if first is not None and first.device.type != "meta" else "cpu"


def check_execution(config: RunConfig, writes: bool = True) -> None:
    """Sizes, devices, executors and the results folder."""
    for attr, low in _POSITIVE.items():
        v = getattr(config, attr)
        if not isinstance(v, int) or isinstance(v, bool) or v < low:
            what = "an" if low == 2 else "a positive"
            raise UserError(f"--{attr.replace('_', '-')} must be {what} integer{' >= 2' if low == 2 else ''}, "
                            f"got {v!r}" + (" (one token has no next-token target)" if low == 2 else ""))
    ls = config.latency_seconds
    if isinstance(ls, bool) or not isinstance(ls, (int, float)) or not math.isfinite(ls) or ls <= 0:
        raise UserError(f"--latency-seconds must be a positive number of seconds, got {ls!r}")
    if config.executor not in ("local", "ray"):
        raise UserError(f"--executor {config.executor!r} is unknown: use local (default) or ray")
    if config.threads is not None and (not isinstance(config.threads, int) or config.threads < 1):
        raise UserError(f"--threads must be a positive integer, got {config.threads!r}")
    if not isinstance(config.retries, int) or isinstance(config.retries, bool) or config.retries < 0:
        raise UserError(f"--retries must be a non-negative integer, got {config.retries!r}")
    if isinstance(config.ray_timeout, bool) or not isinstance(config.ray_timeout, (int, float)) or \
            not 0 < config.ray_timeout <= 3600:
        raise UserError(f"--ray-timeout must be a number of seconds in (0, 3600], got {config.ray_timeout!r}")
    if config.ray_address is not None and config.executor != "ray":
        raise UserError("--ray-address is for --executor ray: add --executor ray or leave the address out")
    if config.ray_address is not None:
        ray_host_port(config.ray_address)
    if config.device_map not in (None, "auto"):
        raise UserError(f"--device-map {config.device_map!r} is unknown: use auto (or leave it out for one device)")
    if config.bos not in BOS_PROTOCOLS:
        raise UserError(f"--bos {config.bos!r} is unknown: use auto, window, stream or none")
    if config.dtype not in ("float32", "bfloat16", "float16"):
        raise UserError(f"--dtype {config.dtype} is unknown: use float32, bfloat16 or float16")
    from acbench.model.sources import device_problem

    problem = device_problem(config.device)
    if problem:
        raise UserError(f"--device {problem}")
    check_solve_device(config.solve_device)
    check_solve_dtype(config.solve_dtype)
    if not isinstance(config.seed, int) or isinstance(config.seed, bool) or not 0 <= config.seed < 2**32:
        raise UserError(f"--seed must be an integer in [0, 2^32), got {config.seed!r}")
    if writes:
        from acbench.results.store import check_writable

        check_writable(Path(config.output))


def build_analyses(config: RunConfig) -> dict:
    """The names of config.tasks that are analyses, built with their --analysis-option settings; an unknown name
    gets one did-you-mean over every task and analysis (not only those asked for)."""
    from acbench import analyses as registry

    names = [n for n in config.tasks if isinstance(n, str)] if isinstance(config.tasks, (list, tuple)) else []
    check_task_names(names, set(registry.known_analyses()))
    return registry.build(names, config.analysis_options)


def check_config_types(config: RunConfig) -> None:
    """Every setting of the type its field declares, or one line naming it: the first check a config meets, so that
    no later one reads a mapping where a list of names belongs."""
    check_option_blocks(config)  # first: its message names the flag and the block (the type check names neither)
    problems = type_problems(config)
    if problems:
        name = problems[0].split(" ", 1)[0]
        raise UserError(f"run setting {problems[0]}: fix --{name.replace('_', '-')} or that key in the --config file")


def resolve_run(config: RunConfig, writes: bool = True) -> Run:
    """Every user error is found here, before the model loads: one line, and the fix. The analyses among
    config.tasks are built here too. `writes`: the run writes results (False for `bench plan`, which only reads the
    model's config)."""
    check_config_types(config)
    analyses = build_analyses(config)
    names, ranks, patterns = resolve_budgets(config)
    check_methods(config, names)
    check_budgets_used(config, names, analyses)
    selection = Selection.from_flags(config.groups, config.blocks)
    check_allocation(config, names)
    check_calibration(config, names)
    check_rank_flags_used(config, names, analyses)
    model_tasks = build_tasks(config, analyses)
    check_options_used(config, names, analyses)
    check_execution(config, writes)
    from acbench.results.leaderboard_display import check_margins

    margins = check_margins(config.margin, "--margin")
    check_settings_used(config, model_tasks, margins)
    if config.until_decided:
        check_until_decided_reference(config, names)
        model_tasks = {name: until_decided_task(task, config, margins) for name, task in model_tasks.items()}
    return Run(config=config, methods=names,
               ranks=tuple(RankSpec(r, config.budget, config.rank_align) for r in ranks), patterns=tuple(patterns),
               allocate=tuple(dict.fromkeys(config.allocate)), selection=selection, bos=config.bos, tasks=model_tasks,
               analyses=analyses, stats_memory=parse_bytes(config.stats_memory) if config.stats_memory else None)


# ---------------------------------------------------------------- task shortcuts (--lama-limit and friends)

def task_shortcuts() -> dict[str, list[tuple[str, object]]]:
    """{flag: [(task, Shortcut)]} over every registered task, plugins included."""
    from acbench import tasks

    out: dict[str, list] = {}
    for name in tasks.known_tasks():
        for sc in tasks.get_task(name).shortcuts:
            out.setdefault(sc.flag, []).append((name, sc))
    return out


def shortcut_dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def shortcut_options(values: dict, tasks=None) -> dict:
    """{task: {setting: value}} from shortcut values ({dest: value}); a flag several tasks share (--limit) first,
    so one task's own flag (--lama-limit) overrides it. `tasks`, the run's task names where known: a shared flag
    sets only the tasks the run scores, and one that sets none of them is refused (it would do nothing); a task's
    own flag is kept for `check_options_used` to name."""
    from acbench import analyses

    known = set(task_registry.known_tasks()) | set(analyses.known_analyses())
    run_tasks = set(tasks) if isinstance(tasks, (list, tuple)) and all(isinstance(t, str) for t in tasks) else None
    if run_tasks is not None and not run_tasks <= known:
        run_tasks = None  # an unknown task name is refused with its did-you-mean, before any setting is read
    if run_tasks is not None:  # an analysis sizes its probes from the run's tasks (rho: ppl-token, lama, mmlu)
        run_tasks |= {t for a in run_tasks & set(analyses.known_analyses()) for t in analyses.REGISTRY.get(a).uses_tasks}
    out: dict = {}
    for flag, uses in sorted(task_shortcuts().items(), key=lambda kv: -len(kv[1])):
        value = values.get(shortcut_dest(flag))
        if value is None:
            continue
        if run_tasks is not None and len(uses) > 1:
            kept = [(task, sc) for task, sc in uses if task in run_tasks]
            if not kept:
                raise UserError(f"{flag} sets {' and '.join(t for t, _ in uses)}, and this run scores neither "
                                f"({', '.join(sorted(run_tasks))}): add one to --tasks or leave {flag} out")
            uses = kept
        for task, sc in uses:
            out.setdefault(task, {})[sc.setting] = value
    return out


def merge_option_blocks(*labelled, overridden: list | None = None) -> dict:
    """{name: {setting: value}} blocks, each with where it came from ((label, block) pairs), merged into one, later
    blocks over earlier ones. A setting given twice with different values is refused naming both places, unless
    `overridden` is a list: then the later value wins (the command line over a config file) and the override is
    appended to it as one line, so that it is said, never silent. A block that is not a mapping is returned as it
    is, for `check_option_blocks` to name."""
    out: dict = {}
    where: dict = {}
    for label, block in labelled:
        if block is None:
            continue
        if not isinstance(block, dict):
            return block
        for name, opts in block.items():
            if not isinstance(opts, dict):  # of the wrong type: kept for check_option_blocks to name
                out[name] = opts
                continue
            if not isinstance(out.get(name, {}), dict):  # an earlier block's wrong type is never replaced unsaid
                continue
            mine = out.setdefault(name, {})
            for key, value in opts.items():
                if key in mine and mine[key] != value:
                    if overridden is None:
                        raise UserError(f"{name}.{key} is set twice, to {mine[key]!r} by {where[name, key]} and to "
                                        f"{value!r} by {label}: give it once")
                    overridden.append(f"{name}.{key} = {value!r} from {label} overrides {mine[key]!r} from "
                                      f"{where[name, key]}")
                mine[key] = value
                where[name, key] = label
    return out


def shortcut_flag(task: str, setting: str) -> str | None:
    """The flag of bench run that sets this one task's setting (--mmlu-format for mmlu.format), or None."""
    for flag, uses in task_shortcuts().items():
        if (task, setting) in [(t, sc.setting) for t, sc in uses]:
            return flag
    return None


def check_options_used(config: RunConfig, names, analyses) -> None:
    """An option for a method, task or analysis the run does not include would be checked, printed and ignored:
    refused, naming the option and what it applies to."""
    bases = {methods.base_name(n) for n in names}
    for name, opts in config.method_options.items():
        if name not in bases:
            first = next(iter(opts), "<setting>")
            raise UserError(f"--method-option {name}.{first}: {name} is not among this run's methods "
                            f"({', '.join(names)}): add it to --methods or leave the option out")
    scored = [t for t in config.tasks if t not in analyses]
    read = set(scored) | {t for a in analyses.values() for t in a.uses_tasks}  # an analysis sizes its own probes
    for name, opts in config.task_options.items():
        if name not in read:
            first = next(iter(opts), "<setting>")
            flag = shortcut_flag(name, first)
            given = f"{name}.{first} (set by {flag} or --task-option)" if flag else f"--task-option {name}.{first}"
            scores = ", ".join(scored) or "no task"
            raise UserError(f"{given} applies to {name}, which this run does not score ({scores}): add {name} to "
                            "--tasks or leave the setting out")
    for name, opts in config.analysis_options.items():
        if name not in analyses:
            first = next(iter(opts), "<setting>")
            raise UserError(f"--analysis-option {name}.{first}: {name} is not among --tasks "
                            f"({', '.join(config.tasks)}): add {name} to --tasks or leave the option out")
