"""What the user typed (`RunConfig`: flags, a YAML file) and what the run does (`Run`: validated and resolved).

`resolve_run(config)` (resolve.py, its checks in run_checks.py) is the one boundary: every user error is found there,
before any weights load,
and the `Run` it returns is frozen: methods expanded, budgets parsed, tasks and analyses built. The tokenizer's
BOS default is settled later by `Run.with_bos`, which returns a new Run (the config is never rewritten).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from acbench import methods
from acbench import tasks as task_registry
from acbench.core.record import UNIFORM
from acbench.core.registry import code_key
from acbench.core.stats import SEQUENTIAL, RankSpec, SparsitySpec
from acbench.tasks.base import RunShared, Task, UntilDecided

from acbench.deploy.allocation import RULES
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
    # the confidence sequences' level (None: 0.05); a study testing m comparisons as one family gives each 0.05 / m
    until_decided_alpha: float | None = None
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
                        + (f", {c.pair_tokens} (x, g) pairs/group)" if "pairs" in needs else
                           f", {c.pair_tokens} tokens sampled/group)" if "tokens" in needs else ")")]
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


AS_GIVEN, AUTHORS = "as-given", "authors"  # the calibration protocols (RunConfig.calibration)
DEFAULT_REFERENCE = "pca"


def reference_method(config: RunConfig) -> str:
    """The method --until-decided tests every other against."""
    return DEFAULT_REFERENCE if config.reference is None else config.reference


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
    level = {} if config.until_decided_alpha is None else {"alpha": float(config.until_decided_alpha)}
    out.until_decided = UntilDecided(reference_method(config), margin=margins.get(task.name, task.margin), **level)
    return out


# None there: every item
UNTIL_DECIDED_BUDGETS = {"lama": ("per_relation",), "ppl-token": ("max_windows",), "mmlu": ("limit",)}


def solve_device_for(config: RunConfig, model) -> str:
    """The device the solves run on: --solve-device, with auto meaning the device of the model's first parameter
    (the host for a model on the CPU or spread by device_map over several devices from the host)."""
    if config.solve_device != "auto":
        return config.solve_device
    first = next(model.parameters(), None)
    return str(first.device) if first is not None and first.device.type != "meta" else "cpu"


# ---------------------------------------------------------------- task shortcuts (--lama-limit and friends)


