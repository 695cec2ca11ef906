"""The run specification: every flag of `bench run`, validated before any compute starts."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from core.errors import UserError

# MMLU is one flag away (`--tasks mmlu ...`): 0-shot on a 270M model it sits at chance and costs LAMA probes
DEFAULT_TASKS = ("lama", "ppl-token", "rho")


@dataclass
class RunSpec:
    model: str = "gemma-3-270m"
    methods: list[str] = field(default_factory=lambda: ["all"])
    # the two families' budgets: rank ratios (low-rank) and N:M patterns or densities (sparsity). Unset ranks are
    # [0.5] unless a sparsity is given (then []): `--methods all` runs the families whose budget is given.
    ranks: list[float] | None = None
    sparsity: list[str] | None = None
    budget: str = "rank"
    rank_align: int = 1
    # how k is split across the selected groups: uniform (each group at the run's ratio), fisher, variance
    allocate: list[str] = field(default_factory=lambda: ["uniform"])
    groups: list[str] | None = None  # group kinds to compress (attn_in, attn_out, mlp_in, mlp_out); None: all
    blocks: str | None = None  # block indices and ranges to compress, e.g. "0-5,12"; None: all
    tasks: list[str] = field(default_factory=lambda: list(DEFAULT_TASKS))
    # calibration
    calib_source: str = "wiki"
    calib_samples: int = 12
    calib_seq_len: int = 256
    pair_tokens: int = 512
    seed: int = 0
    # BOS protocol for calibration windows and ppl-token: window | stream | none | auto (resolved from the tokenizer)
    bos: str = "auto"
    # task sizes (defaults fit `bench run --methods all --rank 0.5` in 15 minutes on 2 CPU cores)
    limit: int | None = None  # shorthand: MMLU questions per subject and LAMA probes per relation
    mmlu_limit: int = 1
    mmlu_shots: int = 0
    # 15 probes per relation (105 of the 1,354 embedded): about 115 ms per probe and variant at 25 candidates on
    # 2 CPU cores, so all probes for 10 variants would not fit the 15-minute default run (`--lama-limit 0`: all)
    lama_limit: int = 15
    lama_candidates: int = 25  # per probe: its gold objects plus seeded distractors of its relation
    ppl_windows: int = 16
    ppl_seq_len: int = 256
    text_source: str = "wiki"
    mmlu_source: str = "embedded"
    lama_source: str = "embedded"
    # execution
    device: str = "cpu"
    device_map: str | None = None  # "auto": accelerate places the blocks across the GPUs (a model larger than one)
    dtype: str = "float32"
    batch_size: int = 4
    stats_memory: str | None = None  # memory for calibration statistics per pass, e.g. "16GB" (default: half of free)
    output: str = "results"
    # executor: local (this process) or ray (cells spread over a Ray cluster's workers: bench.ray_executor)
    executor: str = "local"
    ray_address: str | None = None  # None: a Ray instance on this machine; "auto" or HOST:PORT: a running cluster
    retries: int = 2  # Ray: times a task whose worker died (or that raised a runtime error) is run again
    threads: int | None = None  # torch intra-op threads (default: the CPUs this process may use; Ray: its CPUs)
    overwrite: bool = False
    method_options: dict = field(default_factory=dict)  # {method: {setting: value}}
    task_options: dict = field(default_factory=dict)  # {task: {setting: value}}
    analysis_options: dict = field(default_factory=dict)  # {analysis: {setting: value}}, e.g. {"rho": {"units": 4}}
    measure_latency: bool = True
    report: bool = True
    progress: bool = True

    def __post_init__(self):
        if self.limit is not None:
            self.mmlu_limit = self.lama_limit = self.limit

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in fields(cls)}

    def as_dict(self) -> dict:
        return asdict(self)


def _is_ratio(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and not math.isnan(x) and 0 < x <= 1


def check_ranks(ranks) -> None:
    for r in ranks:
        if not _is_ratio(r):
            raise UserError(f"rank ratio {r} is outside (0, 1]: pass e.g. --rank 0.5 (1.0 keeps full rank)")


def check_task_names(names, analysis_names=frozenset()) -> None:
    """Every name is a registered task or one of `analysis_names`; otherwise one did-you-mean over both."""
    import tasks

    from core.errors import did_you_mean

    for name in names:
        if name not in analysis_names and name not in tasks.REGISTRY:
            known = set(tasks.known_tasks()) | set(analysis_names)
            raise UserError(f"unknown task '{name}'.{did_you_mean(name, known)} See `bench ls tasks` and "
                            "`bench ls analyses`.")


def parse_sparsity(values) -> list:
    """--sparsity values as SparsitySpecs, or one line naming the bad one (run and plan alike)."""
    from core.stats import SparsitySpec

    out = []
    for p in values:
        try:
            out.append(SparsitySpec.parse(p))
        except ValueError as e:
            raise UserError(f"--sparsity: {e}") from None
    return out


def resolve_budgets(spec: RunSpec) -> None:
    """Methods expanded by family (`all` = every method of the families whose budget flag is given), ranks and
    sparsity patterns checked; a method named without its family's budget is refused."""
    import methods

    from core.stats import LOW_RANK_FAMILY, SPARSITY_FAMILY

    if spec.sparsity is not None:
        values = spec.sparsity if isinstance(spec.sparsity, list) else [spec.sparsity]
        # one spelling per budget: '2:4', or a density as '0.5'
        spec.sparsity = [p.budget if p.structured else f"{p.density:g}" for p in parse_sparsity(values)]
        if not spec.sparsity:
            raise UserError("--sparsity is empty: pass N:M patterns (2:4 8:16) or densities (0.5)")
    if spec.ranks is None:
        spec.ranks = [] if spec.sparsity else [0.5]
    elif not spec.ranks:
        raise UserError("--rank is empty: pass rank ratios in (0, 1], e.g. --rank 0.5")
    families = [f for f, given in ((LOW_RANK_FAMILY, spec.ranks), (SPARSITY_FAMILY, spec.sparsity)) if given]
    try:
        spec.methods = methods.expand_methods(spec.methods, families)
    except ValueError as e:
        raise UserError(str(e)) from None
    except KeyError as e:
        raise UserError(str(e) + " Or pass --methods all.") from None
    for m in spec.methods:
        family = methods.family_of(m)
        if family not in families:
            flag = "--sparsity 2:4 (an N:M pattern or a density)" if family == SPARSITY_FAMILY else "--rank 0.5"
            raise UserError(f"{m} is a {family} method but no {family} budget is given: add {flag}, or leave "
                            f"{m} out")


def check_selection(spec: RunSpec) -> None:
    """--groups/--blocks parse, and --allocate names rules that apply to every method of the run."""
    import methods

    from core.record import UNIFORM
    from core.stats import SPARSITY_FAMILY

    from .allocate import check_rules
    from .selection import Selection

    Selection.from_flags(spec.groups, spec.blocks)
    if not spec.allocate:
        raise UserError("--allocate is empty: pass uniform, fisher or variance")
    check_rules(spec.allocate, spec.budget, spec.rank_align)
    rules = [r for r in spec.allocate if r != UNIFORM]
    sparse = [m for m in spec.methods if methods.family_of(m) == SPARSITY_FAMILY]
    if sparse and UNIFORM not in spec.allocate:
        raise UserError(f"--allocate {rules[0]} splits a rank budget, but {', '.join(sparse)} keep one pattern in "
                        "every group: add uniform to --allocate (the sparsity rows run under it) or run them in "
                        "another command")
    if rules:
        per_site = [m for m in spec.methods if methods.family_of(m) != SPARSITY_FAMILY and not methods.build(
                    m, spec.method_options.get(methods.base_name(m))).projection]
        if per_site:
            raise UserError(f"--allocate {rules[0]} sets one k per input group, but {', '.join(per_site)} "
                            f"factorise{'s' if len(per_site) == 1 else ''} each site on its own: run them in another "
                            "command, or name projection methods (e.g. --methods pca,whitened-svd,fasc-kfac,fasc)")


def validate(spec: RunSpec, analysis_names: set[str] = frozenset()) -> RunSpec:
    """Every user error is found here, before the model loads: one line, and the fix. `analysis_names`: the names
    of spec.tasks that the caller resolved to analyses."""
    import methods
    import tasks

    from core.settings import type_problems

    problems = type_problems(spec)
    if problems:
        name = problems[0].split(" ", 1)[0]
        raise UserError(f"run setting {problems[0]}: fix --{name.replace('_', '-')} or that key in the --config file")
    resolve_budgets(spec)
    if not spec.methods:
        raise UserError("no methods given: pass --methods all or names from `bench ls methods`")
    check_ranks(spec.ranks)
    if spec.budget not in ("rank", "params"):
        raise UserError(f"--budget {spec.budget} is unknown: use rank or params")
    if spec.rank_align < 1:
        raise UserError("--rank-align must be a positive integer")
    check_task_names(spec.tasks, analysis_names)
    for name, opts in spec.method_options.items():
        try:
            methods.get_method(name).from_options(opts)
        except (KeyError, ValueError, TypeError) as e:
            raise UserError(f"method options for '{name}': {e}") from None
    for variant in spec.methods:
        try:
            methods.build(variant, spec.method_options.get(methods.base_name(variant)))
        except (KeyError, ValueError, TypeError) as e:
            raise UserError(f"method '{variant}': {e}") from None
    check_selection(spec)
    for name, opts in spec.task_options.items():
        try:
            tasks.get_task(name).from_options(opts)
        except (KeyError, ValueError, TypeError) as e:
            raise UserError(f"task options for '{name}': {e}") from None
    for attr in ("calib_samples", "calib_seq_len", "pair_tokens", "mmlu_limit", "lama_limit", "lama_candidates",
                 "ppl_windows", "ppl_seq_len", "batch_size"):
        v = getattr(spec, attr)
        low = {"mmlu_limit": 0, "lama_limit": 0, "calib_seq_len": 2, "ppl_seq_len": 2}.get(attr, 1)
        if not isinstance(v, int) or isinstance(v, bool) or v < low:
            what = "a non-negative" if low == 0 else ("an" if low == 2 else "a positive")
            raise UserError(f"--{attr.replace('_', '-')} must be {what} integer{' >= 2' if low == 2 else ''}, "
                            f"got {v!r}" + (" (one token has no next-token target)" if low == 2 else ""))
    if spec.executor not in ("local", "ray"):
        raise UserError(f"--executor {spec.executor!r} is unknown: use local (default) or ray")
    if spec.threads is not None and (not isinstance(spec.threads, int) or spec.threads < 1):
        raise UserError(f"--threads must be a positive integer, got {spec.threads!r}")
    if not isinstance(spec.retries, int) or isinstance(spec.retries, bool) or spec.retries < 0:
        raise UserError(f"--retries must be a non-negative integer, got {spec.retries!r}")
    if spec.ray_address is not None and spec.executor != "ray":
        raise UserError("--ray-address is for --executor ray: add --executor ray or leave the address out")
    if spec.device_map not in (None, "auto"):
        raise UserError(f"--device-map {spec.device_map!r} is unknown: use auto (or leave it out for one device)")
    if spec.stats_memory is not None:
        from .plan import parse_bytes

        parse_bytes(spec.stats_memory)
    if spec.bos not in ("auto", "window", "stream", "none"):
        raise UserError(f"--bos {spec.bos!r} is unknown: use auto, window, stream or none")
    if spec.dtype not in ("float32", "bfloat16", "float16"):
        raise UserError(f"--dtype {spec.dtype} is unknown: use float32, bfloat16 or float16")
    import re

    if not re.fullmatch(r"cpu|cuda(:\d+)?|mps", spec.device):
        raise UserError(f"--device {spec.device} is not supported: use cpu, cuda or cuda:<index>")
    if spec.device != "cpu":
        import torch

        if spec.device.startswith("cuda") and not torch.cuda.is_available():
            raise UserError(f"--device {spec.device} asked for, but no CUDA device is available: use --device cpu")
    from .store import check_writable

    check_writable(Path(spec.output))
    return spec


def split_list(value, kind, where: str) -> list:
    """Comma lists and space lists mean the same ('pca,fasc', ['pca', 'fasc'], ['pca,fasc']); numbers stay numbers."""
    items = value if isinstance(value, list) else [value]
    out = []
    for item in items:
        parts = [p.strip() for p in item.split(",")] if isinstance(item, str) else [item]
        for p in parts:
            if p == "":
                continue
            if kind is float and isinstance(p, str):
                try:
                    p = float(p)
                except ValueError:
                    raise UserError(f"{where}: '{p}' is not a number (e.g. 0.5)") from None
            out.append(p)
    return out


def load_config(path: str) -> dict:
    import yaml

    from tasks.data.errors import read_user_text

    try:
        data = yaml.safe_load(read_user_text(path, "config file")) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise UserError(f"config file {path} is not valid YAML{where}: fix the syntax") from None
    if not isinstance(data, dict):
        raise UserError(f"config file {path} must be a mapping of flag names to values")
    data = {k.replace("-", "_"): v for k, v in data.items()}
    if "rank" in data:
        data["ranks"] = data.pop("rank")
    if isinstance(data.get("blocks"), int) and not isinstance(data["blocks"], bool):
        data["blocks"] = str(data["blocks"])
    if "methods" in data:
        import methods

        value = data["methods"]
        items = value if isinstance(value, list) else [value]
        if all(isinstance(v, str) for v in items):  # anything else is left for the type check to name
            data["methods"] = methods.split_methods(items)
    if "sparsity" in data:  # a pattern stays a string; YAML may have read a density as a number
        items = []
        for item in data["sparsity"] if isinstance(data["sparsity"], list) else [data["sparsity"]]:
            if isinstance(item, int) and not isinstance(item, bool) and item > 1:
                raise UserError(f"'sparsity' in {path}: {item} is not a density; YAML reads an unquoted 2:4 as the "
                                "number 124, so quote N:M patterns ('2:4')")
            items += [p.strip() for p in item.split(",") if p.strip()] if isinstance(item, str) else [str(item)]
        data["sparsity"] = items
    for key in ("ranks", "tasks", "allocate", "groups"):
        if key in data:
            data[key] = split_list(data[key], float if key == "ranks" else str, f"'{key}' in {path}")
    unknown = sorted(set(data) - RunSpec.field_names())
    if unknown:
        import difflib

        hint = difflib.get_close_matches(unknown[0], RunSpec.field_names(), n=1)
        raise UserError(f"config file {path} has unknown key '{unknown[0]}'"
                        + (f" (did you mean '{hint[0]}'?)" if hint else "") + ": see `bench run --help`")
    return data
