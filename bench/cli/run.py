"""`bench run`: its flags (the task shortcuts generated from the tasks' own declarations), a YAML config file,
and the command, which resolves the config into a Run at this boundary and hands it to an executor."""

from __future__ import annotations

import argparse
import dataclasses

from acbench.core.errors import UserError

from acbench.runner.config import DEFAULT_TASKS, RunConfig
from acbench.runner.run_checks import check_config_types, split_method_names
from acbench.runner.shortcuts import merge_option_blocks, shortcut_dest, shortcut_options, task_shortcuts
from acbench.model.sources import ALIASES, DEFAULT_MODEL
from acbench.results.leaderboard_display import MARGIN_HELP, check_margins


def kv_options(items: list[str] | None, what: str) -> dict:
    """'method.key=value' items -> {method: {key: value}} (values parsed as YAML scalars)."""
    import yaml

    out: dict = {}
    for item in items or []:
        target, _, rest = item.partition(".")
        key, eq, value = rest.partition("=")
        if not target or not key or not eq:
            raise UserError(f"--{what}-option '{item}' is not of the form {what}.setting=value")
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError:
            raise UserError(f"--{what}-option '{item}': the value '{value}' does not parse (quote strings, close "
                            "brackets)") from None
        if key in out.get(target, {}):  # the last would win in silence, as inside one method string it is refused
            raise UserError(f"--{what}-option {target}.{key} is given twice ({out[target][key]!r} and {parsed!r}): "
                            "give it once")
        out.setdefault(target, {})[key] = parsed
    return out


def split_list(value, kind, where: str) -> list:
    """Comma lists and space lists mean the same ('pca,fasc', ['pca', 'fasc'], ['pca,fasc']); numbers stay numbers."""
    items = value if isinstance(value, list) else [value]
    out = []
    for item in items:
        parts = [p.strip() for p in item.split(",")] if isinstance(item, str) else [item]
        if len(parts) > 1 and "" in parts:  # 'a,' or 'a,,b': a name left out, never read as the list without it
            raise UserError(f"{where} {item!r} has an empty entry between commas: remove the stray comma or name "
                            "what belongs there")
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


RUN_FLAGS = [
    # (flag, dest, kwargs)
    ("--model", "model", {"nargs": "+", "help": f"alias ({', '.join(ALIASES)}), .gguf file, checkpoint dir or hub "
                                                f"id (default: {DEFAULT_MODEL}); several (spaces or commas): one "
                                                "sweep over each, and the report's Across models section"}),
    ("--methods", "methods", {"nargs": "+", "help": "method names or 'all' (see `bench ls methods`)"}),
    ("--rank", "ranks", {"nargs": "+", "help": "rank ratio(s) in (0, 1] (default 0.5); spaces or commas"}),
    ("--sparsity", "sparsity", {"nargs": "+", "help": "sparsity budgets: N:M patterns (2:4 8:16 16:32; keep N of "
                                                    "every M input channels per token) and densities (0.5 = keep "
                                                    "half of each token's channels, unstructured)"}),
    ("--budget", "budget", {"choices": ["rank", "params"], "help": "--rank is a rank ratio (default) or a parameter ratio"}),
    ("--rank-align", "rank_align", {"type": int, "help": "round each k up to a multiple of this"}),
    ("--allocate", "allocate", {"nargs": "+", "help": "how the budget is split across groups: uniform (default: "
                                                    "each group at --rank / --sparsity), fisher (largest K-FAC loss "
                                                    "rise per parameter), variance (pca's eigenvalues), both with "
                                                    "--budget params; greedy (TEAL's density per group under an "
                                                    "unstructured --sparsity, for act-sparse and teal)"}),
    ("--groups", "groups", {"nargs": "+", "help": "input-group kinds to compress: attn_in, attn_out, mlp_in, mlp_out, "
                                                "and where a model has them attn_mid, mlp_mid, attn_mlp_in "
                                                "(default all)"}),
    ("--blocks", "blocks", {"help": "blocks to compress, indices and ranges, e.g. 0-5,12 (default all)"}),
    ("--tasks", "tasks", {"nargs": "+", "help": "tasks (default: lama ppl-token rho; see `bench ls tasks`)"}),
    ("--calib-source", "calib_source", {"help": "calibration text: wiki (embedded), wikitext2, c4 (hub), file:<path>"}),
    ("--calib-samples", "calib_samples", {"type": int, "help": "calibration windows (default 12)"}),
    ("--calib-seq-len", "calib_seq_len", {"type": int, "help": "tokens per calibration window (default 256)"}),
    ("--calibration-mode", "calibration_mode", {"help": "one-pass (default: every block calibrated once on the dense "
                                                         "model) or sequential (blocks calibrated and compressed in "
                                                         "order, each on the compressed blocks' outputs)"}),
    ("--calibration", "calibration", {"help": "as-given (default: the calibration flags for every method) or "
                                              "authors (each method at its paper's windows, length and mode)"}),
    ("--margin", "margin", {"nargs": "+", "metavar": "TASK=MARGIN", "help": MARGIN_HELP}),
    ("--until-decided", "until_decided", {"action": "store_true",
                                          "help": "evaluate LAMA, MMLU and ppl-token in 20 blocks of a seeded order "
                                                  "and stop each method's comparison with --reference when a "
                                                  "confidence sequence decides it (budget: every item, or "
                                                  "--lama-limit / --mmlu-limit / --ppl-windows)"}),
    ("--reference", "reference", {"help": "with --until-decided: the method every comparison is tested against "
                                          "(default pca)"}),
    ("--until-decided-alpha", "until_decided_alpha", {"type": float, "help": "with --until-decided: the confidence "
                                                      "sequences' level (default 0.05; 0.05 / m for m comparisons "
                                                      "read as one family)"}),
    ("--pair-tokens", "pair_tokens", {"type": int, "help": "sampled (x, g) token pairs per group (default 512)"}),
    ("--bos", "bos", {"choices": ["auto", "window", "stream", "none"],
                      "help": "BOS protocol of calibration and ppl-token windows: window ([BOS] + text per window), "
                              "stream (one BOS opens the text), none; auto (default) = window if the tokenizer "
                              "adds BOS, else none"}),
    ("--seed", "seed", {"type": int}),
    ("--device", "device", {"help": "cpu or cuda[:i]"}),
    ("--solve-device", "solve_device", {"help": "where the solves run: auto (the model's device; default), cpu, "
                                                 "cuda[:i]"}),
    ("--solve-dtype", "solve_dtype", {"help": "the low-rank solves' precision: float64 (default) or float32 (faster on "
                                               "a GPU; docs/large-models.md: its measured agreement with float64)"}),
    ("--device-map", "device_map", {"help": "auto: spread a model larger than one GPU over the GPUs (accelerate)"}),
    ("--dtype", "dtype", {"help": "float32 (default), bfloat16, float16"}),
    ("--batch-size", "batch_size", {"type": int}),
    ("--stats-memory", "stats_memory", {"help": "host memory for calibration statistics per pass, e.g. 16GB; beyond it "
                                                "calibration runs in several passes (default: half of free memory)"}),
    ("--output", "output", {"help": "results directory (default results/)"}),
    ("--executor", "executor", {"choices": ["local", "ray"],
                                "help": "local (default: this process) or ray (cells spread over Ray workers; "
                                        "pip install -e '.[ray]')"}),
    ("--ray-address", "ray_address", {"help": "Ray cluster to join: auto or HOST:PORT (default: start one here)"}),
    ("--ray-timeout", "ray_timeout", {"type": float, "help": "seconds to reach --ray-address (default 30)"}),
    ("--retries", "retries", {"type": int, "help": "Ray: runs of a failed task after the first (default 2)"}),
    ("--threads", "threads", {"type": int, "help": "torch threads per process (default: its CPUs; Ray: the CPUs "
                                                   "each task is given)"}),
    ("--latency-seconds", "latency_seconds", {"type": float, "help": "per variant, the most seconds of rounds against "
                                                                    "dense (default 8; fewer when the speedup's 95 %% "
                                                                    "interval reaches +-3 %% first)"}),
]




class GivenOnce(argparse._StoreAction):
    """A flag given twice with different values is refused: argparse would keep the last one without a word
    (`--calibration-mode sequential ... --calibration-mode one-pass`, `--margin lama=0.03 --margin ppl-token=0.02`).
    The same value twice is one value."""

    def __call__(self, parser, namespace, values, option_string=None):
        seen = namespace.__dict__.setdefault("_given_once", {})
        if self.dest in seen and seen[self.dest] != values:
            raise argparse.ArgumentError(self, f"given twice, as {seen[self.dest]!r} and {values!r}: give it once")
        seen[self.dest] = values
        setattr(namespace, self.dest, values)


# every flag is given once (or twice alike): a second --tasks or --margin would replace the first without a word
RUN_FLAGS = [(flag, dest, kw if "action" in kw else {**kw, "action": GivenOnce}) for flag, dest, kw in RUN_FLAGS]


# ---------------------------------------------------------------- task shortcuts (--lama-limit, --ppl-windows, ...)

def _setting_type(task: str, setting: str):
    from acbench import tasks

    ann = next((f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
                for f in dataclasses.fields(tasks.get_task(task).Settings) if f.name == setting), "str")
    return int if ann.startswith("int") else float if ann.startswith("float") else str


def add_shortcuts(parser) -> None:
    for flag, uses in task_shortcuts().items():
        task, sc = uses[0]
        targets = ", ".join(f"{t}.{s.setting}" for t, s in uses)
        kind = _setting_type(task, sc.setting)
        parser.add_argument(flag, dest=f"shortcut:{shortcut_dest(flag)}", default=None, type=kind, action=GivenOnce,
                            metavar="N" if kind is int else "VALUE", help=f"{sc.help} [= --task-option {targets}]")


# ---------------------------------------------------------------- a YAML config file

def _config_lists(data: dict, path: str) -> None:
    """List settings in a config file as the flags take them (comma or YAML lists; quoted N:M patterns)."""
    if "methods" in data:
        value = data["methods"]
        items = value if isinstance(value, list) else [value]
        if all(isinstance(v, str) for v in items):  # anything else is left for the type check to name
            data["methods"] = split_method_names(items)
    if "sparsity" in data:  # a pattern stays a string; YAML may have read a density as a number
        items = data["sparsity"] if isinstance(data["sparsity"], list) else [data["sparsity"]]
        for item in items:
            if isinstance(item, int) and not isinstance(item, bool) and item > 1:
                raise UserError(f"'sparsity' in {path}: {item} is not a density; YAML reads an unquoted 2:4 as the "
                                "number 124, so quote N:M patterns ('2:4')")
        data["sparsity"] = [str(p) for p in split_list(items, str, f"'sparsity' in {path}")]
    for key in ("ranks", "tasks", "allocate", "groups"):
        if key in data:
            data[key] = split_list(data[key], float if key == "ranks" else str, f"'{key}' in {path}")


# the switches whose flag says the opposite of the setting: --no-latency sets measure_latency false
_NEGATED = {"no_latency": "measure_latency", "no_report": "report", "quiet": "progress"}


class DuplicateKey(Exception):
    def __init__(self, key, line: int):
        super().__init__(key)
        self.key, self.line = key, line


def _unique_key_loader():
    """yaml's safe loader, refusing a mapping that sets one key twice (at any depth)."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                try:
                    duplicate = key in seen
                    seen.add(key)
                except TypeError:  # an unhashable key: the type check names it later
                    continue
                if duplicate:
                    raise DuplicateKey(key, key_node.start_mark.line + 1)
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader


def read_config_file(path: str) -> tuple[dict, dict]:
    """(RunConfig fields, task shortcut values) from a YAML file of flag names (dashes or underscores)."""
    import yaml

    from acbench.core.io import read_user_text

    try:
        data = yaml.load(read_user_text(path, "config file"), Loader=_unique_key_loader()) or {}
    except DuplicateKey as e:
        raise UserError(f"config file {path} sets '{e.key}' twice (line {e.line}): keep one (YAML would silently "
                        "keep the last)") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise UserError(f"config file {path} is not valid YAML{where}: fix the syntax") from None
    if not isinstance(data, dict):
        raise UserError(f"config file {path} must be a mapping of flag names to values")
    spelled: dict[str, str] = {}
    for k in data:  # no-latency and no_latency are one key: written both ways, one would silently win
        norm = str(k).replace("-", "_")
        if norm in spelled:
            raise UserError(f"config file {path} sets '{norm}' twice ('{spelled[norm]}' and '{k}'): keep one")
        spelled[norm] = str(k)
    data = {str(k).replace("-", "_"): v for k, v in data.items()}
    internal = sorted(set(data) & set(_NEGATED.values()))
    if internal:  # one configuration language: the flags' names
        flag = next(f for f, d in _NEGATED.items() if d == internal[0])
        raise UserError(f"config file {path} has key '{internal[0]}': write it as the flag is spelled, "
                        f"'{flag}: true' (or false)")
    for flag, dest in _NEGATED.items():  # the no-* switches, as the flags spell them
        if flag in data:
            if not isinstance(data[flag], bool):
                raise UserError(f"'{flag}' in {path} is a switch: write {flag}: true or {flag}: false")
            data[dest] = not data.pop(flag)
    for what in ("method", "task", "analysis"):  # a flag's list of name.setting=value, or an options block
        if f"{what}_option" in data:
            items = data.pop(f"{what}_option")
            items = [items] if isinstance(items, str) else items
            if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
                raise UserError(f"'{what}_option' in {path} is a list of {what}.setting=value strings (or write a "
                                f"{what}_options: block)")
            data[f"{what}_options"] = merge_option_blocks((f"{path}'s {what}_options", data.get(f"{what}_options")),
                                                          (f"{path}'s {what}_option", kv_options(items, what)))
    if "ranks" in data:  # the field's internal name: one configuration language, the flags' names
        raise UserError(f"config file {path} has key 'ranks': write it as the flag is spelled, 'rank' (one ratio or "
                        "a list)")
    if "rank" in data:
        data["ranks"] = data.pop("rank")
    if isinstance(data.get("blocks"), int) and not isinstance(data["blocks"], bool):
        data["blocks"] = str(data["blocks"])
    _config_lists(data, path)
    shortcuts = {shortcut_dest(f) for f in task_shortcuts()}
    known = RunConfig.field_names() | shortcuts  # the internal names were refused above, before the switches set them
    unknown = sorted(set(data) - known)
    if unknown:
        import difflib

        hint = difflib.get_close_matches(unknown[0], (known - set(_NEGATED.values())) | set(_NEGATED), n=1)
        raise UserError(f"config file {path} has unknown key '{unknown[0]}'"
                        + (f" (did you mean '{hint[0]}'?)" if hint else "") + ": see `bench run --help`")
    return {k: v for k, v in data.items() if k not in shortcuts}, {k: v for k, v in data.items() if k in shortcuts}


# ---------------------------------------------------------------- the command

def add_run_parser(sub):
    p = sub.add_parser("run", help="calibrate, compress, evaluate and store every (method, rank, task) cell")
    for flag, dest, kw in RUN_FLAGS:
        p.add_argument(flag, dest=dest, default=None, **kw)
    add_shortcuts(p)
    p.add_argument("--config", help="YAML file of these flags by name (dashes or underscores; a switch as no_latency: "
                   "true), plus method_options, task_options and analysis_options blocks; the command line overrides it")
    p.add_argument("--method-option", action="append", help="method.setting=value, e.g. fasc.max_swaps=100")
    p.add_argument("--task-option", action="append", help="task.setting=value, e.g. mmlu.shots=5 (see `bench ls "
                                                          "tasks`); wins over the shortcut flags")
    p.add_argument("--overwrite", action="store_true", default=None, help="recompute cells that exist")
    p.add_argument("--no-latency", dest="measure_latency", action="store_false", default=None,
                   help="skip the speed measurement (the speedup columns stay empty)")
    p.add_argument("--analysis-option", action="append",
                   help="analysis.setting=value, e.g. rho.units=4 or rho.per_group=true (see `bench ls analyses`)")
    p.add_argument("--no-report", dest="report", action="store_false", default=None)
    p.add_argument("--quiet", dest="progress", action="store_false", default=None, help="no progress bars")
    return p


def _narrowed(block, names, flag: str, said: list) -> dict | None:
    """A config file's option block without the entries for names the command line's `flag` left out of the run
    (a file made for a larger run, narrowed on the command line), each one said; `names` None keeps it whole, and
    what is left is checked as used (`check_options_used`)."""
    if names is None or not isinstance(block, dict) or not all(isinstance(n, str) for n in names):
        return block
    kept = {k: v for k, v in block.items() if k in names}
    for name in block.keys() - kept.keys():
        said.append(f"--config's {name} settings left out: {flag} on the command line does not include {name}")
    return kept


def models_of(value, where: str = "--model") -> list:
    """The models a run sweeps: one, or several as spaces, commas or a YAML list; each named once, in order."""
    if value is None:
        return [DEFAULT_MODEL]
    if not isinstance(value, (str, list)):
        return [value]  # for the type check to name
    bad = [v for v in (value if isinstance(value, list) else [value]) if not isinstance(v, str)]
    if bad:
        raise UserError(f"{where} holds {bad[0]!r}, which is not a model name: list aliases, .gguf files, checkpoint "
                        f"folders or hub ids as text, e.g. [{DEFAULT_MODEL}]")
    models = list(dict.fromkeys(split_list(value, str, where)))
    if not models:
        raise UserError(f"{where} is empty: pass a model (alias, .gguf file, checkpoint dir or hub id), e.g. "
                        f"--model {DEFAULT_MODEL}")
    return models


def configs_from_args(args) -> list[RunConfig]:
    """One RunConfig per model the flags and config file name (they differ only in the model)."""
    data, file_shortcuts = read_config_file(args.config) if args.config else ({}, {})
    for _, dest, _ in RUN_FLAGS:
        if getattr(args, dest) is not None:
            data[dest] = getattr(args, dest)
    shortcuts = {k.split(":", 1)[1]: v for k, v in vars(args).items() if k.startswith("shortcut:") and v is not None}
    if args.methods is not None:  # `--methods pca,fasc` = `--methods pca fasc`; a variant's settings stay whole
        data["methods"] = split_method_names(args.methods)
    for dest, flag in (("tasks", "--tasks"), ("ranks", "--rank"), ("allocate", "--allocate"), ("groups", "--groups"),
                       ("sparsity", "--sparsity")):
        if getattr(args, dest) is not None:  # spaces or commas alike
            data[dest] = split_list(getattr(args, dest), float if dest == "ranks" else str, flag)
    for dest in ("overwrite", "measure_latency", "report", "progress", "until_decided"):
        if getattr(args, dest) is not None:
            data[dest] = getattr(args, dest)
    if "margin" in data:  # task=margin items (flag or file) or the file's mapping, as {task: margin}
        data["margin"] = check_margins(data["margin"], "--margin" if args.margin is not None else "the config's margin")
    overridden: list[str] = []  # each setting the command line (or a more explicit form) overrides, said below
    tasks = data.get("tasks", list(DEFAULT_TASKS))
    narrowed_tasks = bool(args.config) and args.tasks is not None
    # the file's shortcuts, then its task options, then the command line's shortcuts, then --task-option: the
    # command line overrides the file, and in each the most explicit wins; every override is said in one line
    file_tasks = merge_option_blocks(("--config's shortcut keys", shortcut_options(file_shortcuts,
                                                                              None if narrowed_tasks else tasks)),
                                ("--config's task_options", data.get("task_options")), overridden=overridden)
    data["task_options"] = merge_option_blocks(
        ("--config", _narrowed(file_tasks, tasks if narrowed_tasks else None, "--tasks", overridden)),
        ("a shortcut flag", shortcut_options(shortcuts, tasks)),
        ("--task-option", kv_options(args.task_option, "task")), overridden=overridden)
    if "analysis_options" in data or args.analysis_option:
        data["analysis_options"] = merge_option_blocks(
            ("--config's analysis_options", _narrowed(data.get("analysis_options"),
                                                      tasks if narrowed_tasks else None, "--tasks", overridden)),
            ("--analysis-option", kv_options(args.analysis_option, "analysis")), overridden=overridden)
    if "method_options" in data or args.method_option:
        listed = data.get("methods") if args.config and args.methods is not None else None
        bases = None if not isinstance(listed, list) or "all" in listed else [
            m.split(":", 1)[0].split("+", 1)[0] for m in listed if isinstance(m, str)]
        data["method_options"] = merge_option_blocks(
            ("--config's method_options", _narrowed(data.get("method_options"), bases, "--methods", overridden)),
            ("--method-option", kv_options(args.method_option, "method")), overridden=overridden)
    for line in overridden:
        print(f"setting: {line}")
    if "model" in data and data["model"] is None:
        raise UserError("'model' in --config is null: name a model (e.g. model: gemma-3-270m) or leave the key out for "
                        f"the default ({DEFAULT_MODEL})")
    configs = []
    for model in models_of(data.pop("model", None), "--model" if args.model is not None else "'model' in --config"):
        try:
            config = RunConfig(model=model, **data)
        except TypeError as e:
            raise UserError(f"bad run settings ({e}): check --config") from None
        check_config_types(config)
        configs.append(config)
    return configs


def config_from_args(args) -> RunConfig:
    """The RunConfig of a command that takes one model (bench compress, a single-model run)."""
    configs = configs_from_args(args)
    if len(configs) > 1:
        raise UserError(f"`bench {getattr(args, 'cmd', 'run')}` takes one model, and --model names {len(configs)} "
                        f"({', '.join(c.model for c in configs)}): run it once per model")
    return configs[0]




def run_configs_of(args) -> list[RunConfig]:
    """bench run's own checks of its flags and config file, short of opening a model or writing anything: one
    config per model."""
    from acbench.api.sweep_call import check_sweep_tasks

    configs = configs_from_args(args)
    check_sweep_tasks(configs[0])
    return configs


def run_config(args) -> RunConfig:
    """The one config of a single-model run."""
    configs = run_configs_of(args)
    if len(configs) > 1:
        raise UserError(f"--model names {len(configs)} models: this entry point takes one")
    return configs[0]


def cmd_run(args) -> int:
    from acbench.api.sweep_call import run_configs, write_leaderboard
    from acbench.runner.resolve import resolve_run

    configs = run_configs_of(args)
    config = configs[0]
    if config.executor != "ray":
        run_configs(configs)  # what acbench.sweep runs: resolve every model's settings, sweep, write the leaderboard
        return 0
    from acbench.runner.ray_executor import _import_ray, probe_ray_address, run_on_ray

    _import_ray()  # a missing Ray is said before anything is written
    runs = [resolve_run(c) for c in configs]  # every model's settings checked before any model is opened
    probe_ray_address(config.ray_address, config.ray_timeout)  # before the model is opened
    failed = run_on_ray(runs if len(runs) > 1 else runs[0])["failed"]
    if config.report:
        print(f"leaderboard: {write_leaderboard(config.output, config.margin)}")
    return 1 if failed else 0
