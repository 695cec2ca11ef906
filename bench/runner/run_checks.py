"""The checks a RunConfig passes before it becomes a Run (resolve.py): budgets, methods, calibration, allocation,
execution, option blocks and settings that would do nothing, each refusing in one line that names the fix."""

from __future__ import annotations
import json
import math
import re
from pathlib import Path

from acbench import methods
from acbench import tasks as task_registry
from acbench.core.errors import UserError, did_you_mean
from acbench.core.record import DENSE, UNIFORM, is_sequence_level
from acbench.core.settings import type_problems
from acbench.core.stats import CALIBRATION_MODES, LOW_RANK_FAMILY, SEQUENTIAL, SPARSITY_FAMILY, SparsitySpec
from acbench.tasks.base import Task
from acbench.deploy.allocation import LOW_RANK_RULES, SPARSITY_RULES, check_rules
from acbench.runner.shortcuts import shortcut_flag
from acbench.runner.config import AS_GIVEN, AUTHORS, BOS_PROTOCOLS, SOLVE_DTYPES, RunConfig, reference_method


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
    alpha = config.until_decided_alpha
    if alpha is not None and not config.until_decided:
        raise UserError(f"--until-decided-alpha {alpha!r} only sets the level of --until-decided's confidence "
                        "sequences, and this run evaluates every item: add --until-decided, or leave it out")
    if alpha is not None and not is_sequence_level(alpha):
        raise UserError(f"--until-decided-alpha must be a level in (0, 0.5] (0.05 by default; 0.05 / m for each of "
                        f"m comparisons read as one family), got {alpha!r}")
    if config.until_decided and all(type(t).item_pool is Task.item_pool for t in model_tasks.values()):
        raise UserError(f"--until-decided stops the tasks that score items in blocks (lama, mmlu, ppl-token), and this "
                        f"run's tasks ({', '.join(sorted(model_tasks)) or 'analyses only'}) are evaluated whole: add one of them to "
                        "--tasks, or leave --until-decided out")


def check_until_decided_reference(config: RunConfig, names) -> None:
    reference = reference_method(config)
    if not isinstance(reference, str) or reference not in names:
        raise UserError(f"--until-decided tests every method against --reference {reference!r}, which this run "
                        f"does not compress: add it to --methods or name one of {', '.join(names) or 'them'}")

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


def check_config_types(config: RunConfig) -> None:
    """Every setting of the type its field declares, or one line naming it: the first check a config meets, so that
    no later one reads a mapping where a list of names belongs."""
    check_option_blocks(config)  # first: its message names the flag and the block (the type check names neither)
    problems = type_problems(config)
    if problems:
        name = problems[0].split(" ", 1)[0]
        raise UserError(f"run setting {problems[0]}: fix --{name.replace('_', '-')} or that key in the --config file")


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
