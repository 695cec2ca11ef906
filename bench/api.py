"""acbench as a library: the calls the CLI is a layer over, for notebooks and scripts.

    import acbench
    lm = acbench.load_model("smollm2-135m")
    with acbench.compress(lm, "fasc-kfac", rank=0.5, calib_source=my_texts) as c:
        scores = acbench.evaluate(c, tasks=["lama", "ppl-token"])
        c.save("smollm2-fasc-kfac-0.5")
    cells = acbench.sweep(model="smollm2-135m", methods=["pca", "fasc-kfac"], rank=[0.5], output="results")
    frame = acbench.load_results("results")

Each call checks what it is given as `bench run` does and raises `acbench.UserError` with the same one line, in the
call's keywords; each leaves the caller's process as it found it (kept_state).
"""

from __future__ import annotations

import functools
import math
import inspect
import hashlib
import os
import random
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import torch

from acbench.core.errors import UserError
from acbench.core.log import console_lines, say, shows_progress, status_lines
from acbench.tasks.data.text_data import SHOWS_PARSE_BAR, WRITES_DATA_CACHE

from acbench.model.checkpoint import runtime_forms
from acbench.model.groups import find_input_groups
from acbench.model.sources import DEFAULT_MODEL, LoadedModel, open_and_load_model
from acbench.runner.cells import ModelInfo, plan
from acbench.runner.config import DEFAULT_TASKS, RunConfig, until_decided_task
from acbench.runner.run_checks import check_config_types
from acbench.runner.resolve import resolve_run
from acbench.runner.shortcuts import merge_option_blocks, shortcut_options, task_shortcuts
from acbench.runner.until_decided import evaluate_until_decided
from acbench.runner.prepare import check_groups, check_lengths, warn_short_calibrations
from acbench.runner import one_variant
from acbench.runner.one_variant import Compressed

__all__ = ["Compressed", "LoadedModel", "compare", "compress", "evaluate", "list_methods", "list_tasks", "load_model",
           "load_results", "statistics_cache", "sweep", "to_frame"]


class _Scored:
    """What acbench.core.significance reads of a result: its per-item records and details."""

    def __init__(self, records, details):
        self.records, self.details = records, details


def _scored(result, task: str | None, what: str) -> tuple[_Scored, str | None, str | None, dict]:
    """(records holder, task name, primary metric, higher_is_better) of an evaluate result, a stored cell (as sweep
    returns it, or a CellRecord), or evaluate's whole {task: result} with `task` naming one."""
    from acbench.core.record import CellRecord
    from acbench.tasks.base import TaskResult

    if isinstance(result, Mapping) and "cell" in result:
        result = CellRecord.from_json(dict(result))
    if isinstance(result, Mapping):
        if task not in result:
            raise UserError(f"compare: {what} is evaluate's {{task: result}}: name one of its tasks with task= "
                            f"({', '.join(map(str, result)) or 'none'})")
        result = result[task]
    if isinstance(result, CellRecord):
        return (_Scored(result.records, result.details), result.cell.task, result.primary_metric,
                result.higher_is_better)
    if isinstance(result, TaskResult):
        return _Scored(result.records, result.details), task, result.primary_metric or None, result.higher_is_better
    raise UserError(f"compare: {what} is a {type(result).__name__}: pass what evaluate or sweep returned (a task's "
                    "result, evaluate's dict with task=, or a stored cell)")


def compare(reference, other, task: str | None = None, margin: float | None = None) -> dict:
    """The paired difference other - reference on the items both scored, as the leaderboard prints it: `diff`,
    `ci95` and `p` (a confidence sequence and no p for results evaluated until decided), `n`, `test`, the
    difference it had 80 % power to detect (`detectable`) and the `verdict` (better, worse, equivalent within
    `margin` (default: the task's own), undecided). `reference`, `other`: what evaluate returned (one task's
    result, or the whole dict with `task=`) or a cell sweep returned."""
    from acbench import tasks as registry

    from acbench.core.significance import compare as paired, record_scores, verdict

    a, name, metric, higher = _scored(reference, task, "reference")
    b, other_name, other_metric, _ = _scored(other, task, "other")
    name = name or other_name
    metric = metric or other_metric
    for side, held in (("reference", a), ("other", b)):
        scores = record_scores(held.records)
        if scores and not all(math.isfinite(v) for v in scores[1]):
            raise UserError(f"compare: the {side}'s records hold a score that is not a finite number: a broken "
                            "evaluation, not one to compare")
    d = paired(a, b)
    if d is None:
        raise UserError("compare: the two results did not score the same items in the same order (or keep no "
                        "per-item records): evaluate both with the same task settings")
    if margin is not None:  # checked as --margin checks it: a margin of 5 would call any two models equivalent
        margin = checked_margin(margin)
    if margin is None and name in registry.known_tasks():
        margin = registry.get_task(name).margin
    if name in registry.known_tasks() and (metric is None or metric not in higher):
        cls = registry.get_task(name)
        metric, higher = cls.primary_metric, cls.higher_is_better
    # per-window NLL is compared (perplexity's unit): lower is better whatever the metric shown
    kind = (record_scores(a.records) or ("", []))[0]
    direction = False if kind == "nll" else higher.get(metric) if metric else None
    return {**d, "verdict": verdict(d, margin, direction), "margin": margin}


def checked_margin(margin) -> float:
    """compare's margin: a number in (0, 1] (the range --margin takes), or one line naming the problem."""
    number = isinstance(margin, (int, float)) and not isinstance(margin, bool)
    if not (number and math.isfinite(margin) and 0 < margin <= 1):
        raise UserError(f"compare: margin={margin!r}: a margin is a number in (0, 1] in the task's comparison unit "
                        "(0.02: two points of accuracy, or 0.02 nats of mean NLL), or None for the task's own")
    return float(margin)


DEFAULT_CACHE_LIMIT = "20GB"  # from Python, where $ACBENCH_STATS_CACHE_LIMIT is unset


def cache_bound(cache, cache_limit) -> int | None:
    """The statistics cache's bound in bytes for a call with `cache` (checked: a bool) and `cache_limit` (a size,
    else $ACBENCH_STATS_CACHE_LIMIT's, else DEFAULT_CACHE_LIMIT)."""
    from acbench.core.io import stats_cache_limit
    from acbench.core.units import parse_bytes

    if not isinstance(cache, bool):
        raise UserError(f"cache={cache!r}: pass True (keep the statistics on disk) or False (the default)")
    if cache_limit is not None and (isinstance(cache_limit, bool) or not isinstance(cache_limit, (str, int))):
        raise UserError(f"cache_limit={cache_limit!r}: pass a size such as \"50GB\"")
    if cache_limit is not None:
        return parse_bytes(str(cache_limit), "cache_limit=")
    from_env = stats_cache_limit()
    return from_env if from_env is not None else parse_bytes(DEFAULT_CACHE_LIMIT)


def statistics_cache(clear: bool = False) -> list[dict]:
    """The calibration statistics cache ($ACBENCH_STATS_CACHE, else the cache folder's stats/): one entry per
    folder, largest first, with its `key`, `bytes` on disk, the calibration it holds (`spec`, `stats`, `tokens`) and
    `path`. `clear=True` removes every folder no process is writing now (a claimed one is kept, and listed with
    `kept: "being written"`) and returns what it removed and kept."""
    import json
    import shutil

    from acbench.core.io import folder_bytes, stats_cache_dir

    if not isinstance(clear, bool):  # 'no', 0.0 or a path would be truthy: nothing is removed on a value not True
        raise UserError(f"statistics_cache(clear={clear!r}): pass clear=True to remove the cache's folders, or "
                        "clear=False (the default) to list them")
    root = stats_cache_dir()
    out = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        try:
            info = json.loads((folder / "info.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            info = {}
        info = info if isinstance(info, dict) else {}
        size = folder_bytes(folder)
        entry = {"key": folder.name, "bytes": size, "spec": info.get("spec"), "stats": info.get("stats"),
                 "tokens": info.get("n_tokens"), "path": str(folder)}
        if clear:
            if any(f.name.endswith(".lock") for f in folder.iterdir()):
                entry["kept"] = "being written"
            else:
                shutil.rmtree(folder, ignore_errors=True)
                entry["removed"] = True
        out.append(entry)
    return sorted(out, key=lambda e: -e["bytes"])


def list_methods() -> list[dict]:
    """What `bench ls methods` lists: per registered method its name, family, version, what it needs (data-free,
    activations, gradients), description, settings with their defaults, and its authors' calibration."""
    import dataclasses

    from acbench import methods as registry

    out = []
    for name in registry.known_methods():
        cls = registry.get_method(name)
        caps = cls().capabilities()
        own = cls.authors_calibration
        out.append({"name": name, "family": cls.family, "version": cls.version,
                    "needs": [k for k in ("activations", "gradients") if caps[k]], "description": cls.description,
                    "settings": dataclasses.asdict(cls.Settings()) if dataclasses.is_dataclass(
                        getattr(cls, "Settings", None)) else {},
                    "authors_calibration": dataclasses.asdict(own) if own is not None else None})
    return out


def list_tasks() -> list[dict]:
    """What `bench ls tasks` lists: per registered task its name, version, description, primary metric and its
    direction, the margin it is called equivalent within, and its settings with their defaults."""
    import dataclasses

    from acbench import tasks as registry

    out = []
    for name in registry.known_tasks():
        cls = registry.get_task(name)
        out.append({"name": name, "version": cls.version, "description": cls.description,
                    "primary_metric": cls.primary_metric,
                    "higher_is_better": cls.higher_is_better.get(cls.primary_metric), "margin": cls.margin,
                    "settings": dataclasses.asdict(cls.Settings()) if dataclasses.is_dataclass(
                        getattr(cls, "Settings", None)) else {}})
    return out


# ---------------------------------------------------------------- the caller's process, left as it was
# torch's thread count and random state, numpy's and Python's random states, os.environ, the working directory, and
# transformers' progress bars and log handler are put back after each call: a run sets threads and seeds for itself,
# torch and the hub probe set environment variables, and a quiet load silences transformers' bars


@contextmanager
def kept_state():
    import numpy as np
    import torch
    from transformers.utils import logging as hf_logging

    root = hf_logging._get_library_root_logger()
    handler = getattr(hf_logging, "_default_handler", None)
    saved = (torch.get_num_threads(), torch.get_rng_state(), np.random.get_state(), random.getstate(),
             dict(os.environ), os.getcwd(), hf_logging.is_progress_bar_enabled(), handler in root.handlers)
    try:
        yield
    finally:
        threads, torch_rng, np_rng, py_rng, env, cwd, bars, had_handler = saved
        torch.set_num_threads(threads)
        torch.set_rng_state(torch_rng)
        np.random.set_state(np_rng)
        random.setstate(py_rng)
        for key in set(os.environ) - set(env):
            del os.environ[key]
        for key, value in env.items():
            if os.environ.get(key) != value:
                os.environ[key] = value
        if os.getcwd() != cwd:
            os.chdir(cwd)
        (hf_logging.enable_progress_bar if bars else hf_logging.disable_progress_bar)()
        if had_handler and handler not in root.handlers:
            hf_logging.enable_default_handler()
        elif not had_handler and handler in root.handlers:
            hf_logging.disable_default_handler()


@contextmanager
def _reset_after(tokens):
    try:
        yield
    finally:
        for token in tokens:
            token.var.reset(token)


def keeps_caller_state(fn):
    """`fn` run inside kept_state, its refusals in the API's words (api_words). Its status lines go through the
    `bench` logger, dropped for a call made with progress=False; a caller who set that logger above INFO gets no
    bars either."""
    params = inspect.signature(fn).parameters
    takes_progress = "progress" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())  # sweep's

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if takes_progress and not shows_progress(kwargs.get("progress", True)):
            kwargs["progress"] = False
        shown = kwargs.get("progress", True) is not False
        # the embedded text's parse is written to the cache folder only for a call that asked for the cache
        asked = (WRITES_DATA_CACHE.set(kwargs.get("cache") is True), SHOWS_PARSE_BAR.set(shown))
        with kept_state(), console_lines(only_if_unheard=True), status_lines(shown), _reset_after(asked):
            try:
                return fn(*args, **kwargs)
            except UserError as e:
                raise UserError(api_words(str(e), fn.__name__)) from None
    return wrapper


# a flag, as a refusal shared with the CLI names it -> the keyword of the call (the rest: its snake_case name)
_KEYWORDS = {"compress": {"method-option": "method_options"},
             "sweep": {"task-option": "task_options", "method-option": "method_options",
                       "analysis-option": "analysis_options", "no-latency": "measure_latency=False",
                       "quiet": "progress=False"},
             "evaluate": {"task-option": "task_options"}}


def api_words(message: str, call: str) -> str:
    """A refusal shared with the CLI, in the words of the Python call that met it: `--calib-samples` becomes
    `calib_samples=`, and the config file a Python caller never wrote is not mentioned."""
    import re

    names = _KEYWORDS.get(call, {})

    def keyword(m):
        flag, value = m.group(1), m.group(2)
        word = names.get(flag, flag.replace("-", "_"))
        return word if "=" in word else f"{word}={value or ''}"

    message = re.sub(r"(?:,? or (?:that|its) (?:key|block) (?:in|of) the --config file)", "", message)
    # "--rank 0.5" -> "rank=0.5"; "--calib-samples must be ..." -> "samples= must be ..."
    # a command quoted in backticks (`bench run --executor ray`) is one to type, and stays as it is
    words = r"(?:must|is|are|has|have|needs|and|or|with|to|for|of|in|exceeds|names|takes|cannot|does|only)\b"
    flag = re.compile(r"(?<![\w-])--([a-z][a-z0-9-]*)(?: (?!" + words + r")([^\s:;,`]+))?")
    parts = message.split("`")
    return "`".join(part if i % 2 else flag.sub(keyword, part) for i, part in enumerate(parts))


@keeps_caller_state
def load_model(model: str = DEFAULT_MODEL, dtype: str = "float32", device: str = "cpu",
               device_map: str | None = None, progress: bool = True) -> LoadedModel:
    """A model as `bench run --model` opens it (a built-in alias, a local checkpoint folder, a GGUF file or a hub
    id), with its tokenizer and the fingerprint of its weights: `compress` caches its statistics under it.
    `progress=False` silences transformers' bars for this load only (the caller's setting is put back)."""
    return open_and_load_model(model, dtype=dtype, device=device, progress=progress, device_map=device_map)


# ---------------------------------------------------------------- compress

def _digest(windows: torch.Tensor) -> str:
    return hashlib.sha256(windows.to(torch.int64).contiguous().numpy().tobytes()).hexdigest()[:16]


def calibration_tokens(calibration, tokenizer, samples: int, seq_len: int, seed: int, bos: str,
                       text_column: str = "text", vocab: int | None = None) -> tuple[str, torch.Tensor | None]:
    """(source label, windows) for what `compress` was given: a built-in source name ("wiki", "wikitext2",
    "file:<path>"; windows drawn later, as a run draws them), a list of texts or a `datasets.Dataset` (its
    `text_column`; joined by blank lines and cut into `samples` seeded windows of `seq_len` tokens, as for a
    file), or a 2-D integer tensor of token windows used as they are. A label that is not a name is the digest
    of the windows, so cached statistics are found by content."""
    from acbench.tasks.data.text_data import sample_text_windows

    if isinstance(calibration, str):
        return calibration, None
    if isinstance(calibration, torch.Tensor):
        if calibration.dim() != 2 or calibration.dtype.is_floating_point or calibration.dtype == torch.bool:
            raise UserError(f"calibration tensor of shape {tuple(calibration.shape)} and dtype {calibration.dtype}: "
                            "pass token ids as a 2-D integer tensor (windows x tokens)")
        if calibration.shape[0] < 1 or calibration.shape[1] < 2:
            raise UserError(f"calibration tensor of shape {tuple(calibration.shape)}: pass at least one window of "
                            "two tokens or more")
        low, high = int(calibration.min()), int(calibration.max())
        if low < 0 or (vocab is not None and high >= vocab):
            raise UserError(f"calibration tensor holds token ids from {low} to {high}, outside the model's vocabulary "
                            f"[0, {vocab}): pass ids the model's tokenizer produced")
        return f"tokens:{_digest(calibration)}", calibration.to(torch.long)
    if type(calibration).__name__ == "Dataset" and hasattr(calibration, "column_names"):
        if text_column not in calibration.column_names:
            raise UserError(f"calibration dataset has no column '{text_column}' (it has "
                            f"{', '.join(calibration.column_names)}): pass text_column=")
        calibration = calibration[text_column]
    if isinstance(calibration, Sequence) and calibration and all(isinstance(t, str) for t in calibration):
        windows = sample_text_windows(tokenizer, "\n\n".join(calibration), samples, seq_len, seed, bos)
        return f"texts:{_digest(windows)}", windows
    raise UserError(f"calibration of type {type(calibration).__name__}: pass a source name (wiki, wikitext2, "
                    "file:<path>), a non-empty list of texts, a datasets.Dataset, or a 2-D tensor of token ids")


def _vocabulary(model) -> int | None:
    """The number of token ids the model's input embedding takes (None where it has none to ask)."""
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    return int(emb.num_embeddings) if isinstance(emb, torch.nn.Embedding) else None


def _loaded(model, tokenizer) -> LoadedModel:
    if isinstance(model, Compressed):  # what compress returned: its model, and its tokenizer unless one is given
        if model.restored:  # its model is dense again: scoring it would report the dense model as compressed
            raise UserError(f"this {model.method} compression was restored (the model is dense again): evaluate "
                            "the model itself for the dense scores, or compress it anew")
        return _loaded(model.model, tokenizer if tokenizer is not None else model.tokenizer)
    if isinstance(model, LoadedModel):
        return model if tokenizer is None else replace(model, tokenizer=tokenizer)
    if not isinstance(model, torch.nn.Module) or not hasattr(model, "config"):
        raise UserError(f"model of type {type(model).__name__}: pass a loaded transformers causal LM (or what "
                        "acbench.load_model returns)")
    if tokenizer is None:
        raise UserError("no tokenizer: pass the model's tokenizer (or a model from acbench.load_model, which has one)")
    name = str(getattr(model.config, "_name_or_path", "") or type(model).__name__)
    return LoadedModel(model, tokenizer, None, Path(name).name or name)


# what a user of the CLI (or an older acbench) types, and the keyword compress takes for it
_COMPRESS_SPELLINGS = {"ranks": "rank", "samples": "calib_samples", "seq_len": "calib_seq_len", "merge": "merged"}
_NOT_KEYWORDS = {"model", "tokenizer", "method", "unknown"}


def _compress_keywords() -> list[str]:
    return sorted(set(inspect.signature(compress).parameters) - _NOT_KEYWORDS)


def unknown_compress_keyword(method, unknown: dict) -> str:
    """One line for a keyword compress does not take: a setting of the method goes in method_options (or the
    method's spec string); anything else is named with the keywords compress takes."""
    import dataclasses

    from acbench import methods

    key = sorted(unknown)[0]
    try:
        cls = methods.get_method(methods.base_name(method))
        own = {f.name for f in dataclasses.fields(cls.Settings)}
    except Exception:  # no method, or an unknown one: refused by the run's own check once this keyword is gone
        own, cls = set(), None
    if key in own:
        base = methods.base_name(method)
        return (f"compress: {key}= is a setting of {base}, not a keyword of compress: pass "
                f"method_options={{{base!r}: {{{key!r}: {unknown[key]!r}}}}} (or the method as "
                f"'{base}:{key}={unknown[key]}')")
    hint = _COMPRESS_SPELLINGS.get(key)
    return (f"compress: unknown keyword {key}=" + (f" (did you mean {hint}=?)" if hint else "")
            + f"; compress takes {', '.join(_compress_keywords())}, and a method's settings in "
            "method_options={method: {setting: value}} (see acbench.list_methods())")


def check_protocol(calibration) -> None:
    """`calibration=` names the calibration protocol, as in sweep, the CLI and RunConfig; the text is calib_source=."""
    if not isinstance(calibration, str) or calibration not in ("as-given", "authors"):
        shown = repr(calibration) if isinstance(calibration, str) else f"a {type(calibration).__name__}"
        raise UserError(f"calibration={shown}: calibration= is the calibration protocol, 'as-given' or 'authors' "
                        "(each method at its paper's windows); the calibration text is calib_source= (a source name, "
                        "a list of texts, a datasets.Dataset or token windows)")


def _budget_lists(rank, sparsity) -> tuple[list | None, list | None]:
    if (rank is None) == (sparsity is None):
        raise UserError("give rank= (a low-rank method's ratio, e.g. 0.5) or sparsity= (e.g. '2:4' or 0.5), "
                        "one of the two")
    if rank is not None:
        if isinstance(rank, bool) or not isinstance(rank, (int, float)):
            raise UserError(f"rank {rank!r}: pass one number in (0, 1], e.g. rank=0.5")
        return [float(rank)], None
    if isinstance(sparsity, bool) or not isinstance(sparsity, (str, int, float)):
        raise UserError(f"sparsity {sparsity!r}: pass one N:M pattern or density, e.g. '2:4' or 0.5")
    return None, [str(sparsity)]


@keeps_caller_state
def compress(model, tokenizer=None, method: str | None = None, *, rank: float | None = None,
             sparsity: str | float | None = None, calib_source="wiki", text_column: str = "text",
             calib_samples: int = 12, calib_seq_len: int = 256, pair_tokens: int = 512,
             calibration: str = "as-given", calibration_mode: str = "one-pass", seed: int = 0, bos: str = "auto",
             budget: str = "rank", rank_align: int = 1, allocate: str = "uniform", groups: list[str] | None = None,
             blocks: str | None = None, solve_device: str = "auto", solve_dtype: str = "float64",
             batch_size: int = 4, stats_memory: str | None = None, cache: bool = False, cache_limit: str | None = None,
             merged: bool = False, progress: bool = True, method_options: Mapping | None = None,
             **unknown) -> Compressed:
    """Compress `model` in place with `method` (a name or variant, e.g. "fasc-kfac" or "act-sparse:score=wina")
    at `rank` (low-rank family) or `sparsity` (sparsity family), and return the handle (`.model`, `.summary`,
    `.restore()`, `.save(path)`). `model`: what `load_model` returns (`compress(lm, "pca", rank=0.5)`: its
    tokenizer comes with it), or a loaded transformers causal LM on any device (`device_map` included) with its
    tokenizer (`compress(model, tokenizer, "pca", rank=0.5)`).
    The keywords are `bench compress`'s flags and RunConfig's fields, named as there: `calib_source` is the
    calibration text (a source name, a list of texts, a `datasets.Dataset` with its `text_column`, or a 2-D tensor
    of token windows), `calibration` the protocol ("as-given", or "authors": each method at its paper's windows),
    `calibration_mode` one-pass or sequential (the blocks calibrated and compressed in order, each on the
    compressed blocks' outputs; nothing cached). A method's settings go in `method_options={method: {setting:
    value}}` (as sweep and --method-option take them) or its spec string ("fasc:max_swaps=100").
    Statistics are held in memory; `cache=True` keeps them on disk by content (a model from `load_model`, which has a
    fingerprint), saying their size before writing and refusing to take the cache past `cache_limit` (e.g. "50GB";
    default $ACBENCH_STATS_CACHE_LIMIT, else 20GB); `acbench.statistics_cache()` lists and clears it."""
    from acbench.tasks.data.text_data import resolve_bos

    if method is None and isinstance(tokenizer, str):  # compress(lm, "pca", ...): the tokenizer comes with lm
        method, tokenizer = tokenizer, None
    if unknown:
        raise UserError(unknown_compress_keyword(method, unknown))
    if method is None:
        raise UserError("compress needs a method: compress(model, \"pca\", rank=0.5) (see acbench.list_methods())")
    check_protocol(calibration)
    lm = _loaded(model, tokenizer)
    limit = cache_bound(cache, cache_limit)
    ranks, patterns = _budget_lists(rank, sparsity)
    config = RunConfig(
        model=lm.name, methods=[method], ranks=ranks, sparsity=patterns, budget=budget, rank_align=rank_align,
        allocate=[allocate], groups=groups, blocks=blocks, tasks=[], seed=seed, bos=bos, calib_samples=calib_samples,
        calib_seq_len=calib_seq_len, pair_tokens=pair_tokens, solve_device=solve_device, solve_dtype=solve_dtype,
        batch_size=batch_size, stats_memory=stats_memory,
        method_options={} if method_options is None else method_options, measure_latency=False, report=False,
        progress=progress, calibration_mode=calibration_mode, calibration=calibration)
    check_config_types(config)
    run = resolve_run(config, writes=False)
    if len(run.methods) != 1:
        raise UserError(f"method {method!r} names {len(run.methods)} methods: compress with one (see `bench ls "
                        "methods`)")
    forms = runtime_forms(lm.model.config)
    if forms:
        raise UserError(f"this model is a compressed checkpoint ({', '.join(forms)} sites): compress the original")
    run = run.with_bos(resolve_bos(lm.tokenizer, run.bos))
    all_groups = find_input_groups(lm.model)
    run = run.for_blocks(len({g.block for g in all_groups}), tuple(dict.fromkeys(g.kind for g in all_groups)))
    selected = check_groups(run, all_groups)
    check_lengths(run, lm.model.config)
    label, windows = calibration_tokens(calib_source, lm.tokenizer, calib_samples, calib_seq_len, seed, run.bos,
                                        text_column, _vocabulary(lm.model))
    if windows is not None and run.calibration_of(run.methods[0]).spec.windows_key != run.calibration.windows_key:
        raise UserError(f"calibration='authors' draws {run.methods[0]}'s windows at its paper's sizes from a named "
                        "source: pass calib_source='wiki' (or 'wikitext2', 'file:<path>'), or calibration='as-given' "
                        "for the texts given")
    run = replace(run, config=replace(run.config, calib_source=label,
                                      calib_samples=calib_samples if windows is None else int(windows.shape[0]),
                                      calib_seq_len=calib_seq_len if windows is None else int(windows.shape[1])))
    warn_short_calibrations(run, selected)
    # the one path `bench compress` takes too (looked up on the module, so both see the same function)
    return one_variant.compress_model(lm, run, selected, lm.name, windows, cache=cache, limit=limit, merge=merged)


# ---------------------------------------------------------------- evaluate

def _with_shortcuts(shortcuts: dict, task_options):
    """The task shortcuts' options with the explicit `task_options`; a setting given both ways with different values
    is refused, naming both (neither silently wins); `task_options` that are not {task: {setting: value}} are
    passed on for the run's checks to refuse in their words."""
    if task_options is None:
        return shortcuts
    if not isinstance(task_options, Mapping) or not all(isinstance(v, Mapping) for v in task_options.values()):
        return task_options
    return merge_option_blocks(("a task keyword (lama_limit= ...)", shortcuts),
                               ("task_options", {t: dict(v) for t, v in task_options.items()}))


def _task_config(tasks: Sequence[str], task_options: Mapping | None, settings: dict, **run) -> RunConfig:
    """A RunConfig with these tasks, their options, and the task shortcuts among `settings` (`lama_limit=5` as
    `--lama-limit 5`); an unknown keyword is one line naming the known ones."""
    known = {flag.lstrip("-").replace("-", "_") for flag in task_shortcuts()}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise UserError(f"unknown task setting {unknown[0]}=: use one of {', '.join(sorted(known))}, or "
                        "task_options={task: {setting: value}}")
    options = _with_shortcuts(shortcut_options(settings, list(tasks)), task_options)
    return RunConfig(tasks=list(tasks), task_options=options, methods=["dense"], **run)


@keeps_caller_state
def evaluate(model, tokenizer=None, tasks: Sequence[str] = ("lama", "ppl-token"), *, task_options=None,
             bos: str = "auto", seed: int = 0, batch_size: int = 4, progress: bool = True,
             until_decided: Mapping | bool | None = None, **settings) -> dict:
    """Score `model` (any transformers causal LM, compressed or not) on `tasks` as a run's cells score it:
    {task: TaskResult} with `.metrics`, `.stderr`, `.records` (per item, for paired tests) and `.config`.
    `**settings`: the task shortcuts of `bench run` (`lama_limit=`, `ppl_windows=`, `mmlu_shots=`...);
    `task_options`: {task: {setting: value}} as `--task-option` gives them. `until_decided`, as `bench run
    --until-decided` does it: True scores the reference model (the tasks that can stop early, e.g. lama, ppl-token,
    mmlu, on their whole budget in the seeded order a comparison draws); what such a call returned then makes each of
    those tasks stop as soon as its paired comparison with the reference is decided. A result's details say how far
    it went and why it stopped."""
    from acbench.tasks.data.text_data import resolve_bos

    lm = _loaded(model, tokenizer)
    if isinstance(tasks, str):  # "lama" or "lama,ppl-token", as --tasks takes them
        tasks = [t.strip() for t in tasks.split(",")]
    if isinstance(tasks, Sequence) and not tasks:
        raise UserError("tasks=[] names no task: pass task names (bench ls tasks), e.g. tasks=['lama', 'ppl-token']")
    config = _task_config(tasks, task_options, settings, model=lm.name, bos=bos, seed=seed, batch_size=batch_size,
                          measure_latency=False, report=False, progress=progress)
    check_config_types(config)
    run = resolve_run(config, writes=False)
    if run.analyses:
        raise UserError(f"{', '.join(run.analyses)} is an analysis of a sweep, not a task: run it with acbench.sweep")
    run = run.with_bos(resolve_bos(lm.tokenizer, run.bos))
    check_lengths(run, lm.model.config)
    references = _until_decided_references(until_decided, run) if until_decided is not None else {}
    out = {}
    for task in run.tasks.values():
        task.check(lm.tokenizer)
    for name, task in run.tasks.items():
        with torch.no_grad():
            if name in references:
                stoppable = until_decided_task(task, replace(config, until_decided=True, reference=EVALUATE_REFERENCE),
                                               {})
                out[name] = evaluate_until_decided(stoppable, lm.model, lm.tokenizer, references[name], progress)
            else:
                out[name] = task.evaluate(lm.model, lm.tokenizer, progress=progress)
    return out


# what an until-decided result of `evaluate` names as its reference (a sweep names the reference method)
EVALUATE_REFERENCE = "evaluate(until_decided=)"


def _until_decided_references(given, run) -> dict[str, list[dict]]:
    """{task: the reference's per-item records, or False for the reference itself (its whole budget)} for the
    tasks that can stop early; refused in one line where `given` is neither True nor what an until-decided
    evaluate returned, lacks such a task, or no task asked for can stop early."""
    from acbench.tasks.base import Task

    if given is not True and (not isinstance(given, Mapping) or not all(hasattr(r, "records")
                                                                        for r in given.values())):
        raise UserError(f"until_decided= takes True (the reference model) or what evaluate(..., until_decided=True) "
                        f"returned for it ({{task: result}}), not a {type(given).__name__}")
    stoppable = [name for name, task in run.tasks.items() if type(task).item_pool is not Task.item_pool]
    if not stoppable:
        raise UserError(f"until_decided=: none of {', '.join(run.tasks)} can stop early (a task that scores any "
                        "subset of its items can, e.g. lama, ppl-token, mmlu): evaluate them without it")
    if given is True:
        return dict.fromkeys(stoppable, False)
    missing = [name for name in stoppable if name not in given or "until_decided" not in given[name].details]
    if missing:
        raise UserError(f"until_decided= holds no until-decided result of {', '.join(missing)}: evaluate the "
                        f"reference model with until_decided=True on {', '.join(missing)} and pass what it returned")
    return {name: given[name].records for name in stoppable}


# ---------------------------------------------------------------- sweep and results

_FLAG_NAMES = {"rank": "ranks", "method": "methods", "task": "tasks"}


def check_sweep_tasks(config: RunConfig) -> None:
    """A sweep scores at least one task, and a study is named as its own command: `bench run` and `sweep` alike."""
    from acbench.results.plugged import plugged_commands

    if isinstance(config.tasks, (list, tuple)) and not config.tasks:
        raise UserError("--tasks is empty: pass task names (see `bench ls tasks`), e.g. --tasks lama ppl-token")
    for name in config.tasks:  # a study named as a task gets its own command named, not a did-you-mean over tasks
        if isinstance(name, str) and name in plugged_commands():
            raise UserError(f"{name} is not a task of bench run: it is a study with its own command, `bench {name}`")


def sweep_configs(models, keywords: dict) -> list[RunConfig]:
    """One RunConfig per model from `sweep`'s keywords: RunConfig's fields or the flags' names (`rank` for
    --rank), and the task shortcuts (`lama_limit`)."""
    fields_ = RunConfig.field_names()
    data, shortcuts = {}, {}
    known = {flag.lstrip("-").replace("-", "_") for flag in task_shortcuts()}
    by_dest: dict[str, str] = {}
    for key, value in keywords.items():
        dest = _FLAG_NAMES.get(key, key)
        if dest in by_dest:  # rank= and ranks= are one setting: the last would win in silence
            raise UserError(f"sweep: {by_dest[dest]}= and {key}= are the same setting: give it once")
        by_dest[dest] = key
        if dest in fields_ and dest != "model":
            data[dest] = value
        elif key in known:
            shortcuts[key] = value
        else:
            raise UserError(f"unknown sweep setting {key}=: use bench run's flags in snake_case (rank=, methods=, "
                            f"calib_source=, lama_limit=...)")
    for dest in ("methods", "tasks", "ranks", "allocate", "groups", "sparsity"):
        if isinstance(data.get(dest), (str, int, float)) and not isinstance(data.get(dest), bool):
            data[dest] = [data[dest]]  # one value where the flag takes several
    if isinstance(data.get("sparsity"), list):  # densities as numbers, as compress(sparsity=0.5) takes them
        data["sparsity"] = [str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v
                            for v in data["sparsity"]]
    options = _with_shortcuts(shortcut_options(shortcuts, data.get("tasks", list(DEFAULT_TASKS))),
                              data.pop("task_options", None))
    models = [models] if isinstance(models, (str, Path, torch.nn.Module, LoadedModel, Compressed)) else list(models)
    models = [_sweep_source(m) for m in models]
    if not models:
        raise UserError("model=[] names no model: pass one or more models")
    configs = []
    for m in models:
        config = RunConfig(model=str(m), task_options=options, **data)
        check_config_types(config)
        check_sweep_tasks(config)
        configs.append(config)
    return configs


def _sweep_source(model):
    """What a sweep opens for `model`: a name or path as given; a model `load_model` returned, by its source (the
    sweep opens it again, as bench run does), unless it is compressed now (its cells would not be its source's)."""
    if isinstance(model, Compressed):
        raise UserError("sweep(model=...) got a compressed model: sweep the model it came from (load_model's result, "
                        "after .restore()), or save it (.save(folder)) and evaluate that with acbench.evaluate")
    if isinstance(model, LoadedModel):
        from acbench.deploy.compression import is_deployed

        if is_deployed(model.model):
            raise UserError("sweep(model=...) got a model compressed in place: .restore() the handle compress "
                            "returned first, so the sweep starts from the model as loaded")
        if model.given is None:
            raise UserError("sweep(model=...) got a model built in memory: save it with save_pretrained (and its "
                            "tokenizer) and pass the folder")
        return model.given
    if isinstance(model, torch.nn.Module):
        raise UserError("sweep(model=...) takes load_model's result, a model name or a checkpoint folder: for a "
                        "model you built yourself, save it with save_pretrained (and its tokenizer) and pass the folder")
    return model


@contextmanager
def _statistics_cache_for(cache, cache_limit):
    """A sweep's statistics: with `cache`, kept in the shared cache under its bound (the bound given to the runner
    for this call); without, in a temporary folder removed afterwards. The environment is restored by the caller's
    kept_state."""
    import tempfile

    bound = cache_bound(cache, cache_limit)
    if cache:
        os.environ["ACBENCH_STATS_CACHE_LIMIT"] = str(bound)
        yield
        return
    with tempfile.TemporaryDirectory(prefix="acbench-stats-") as tmp:
        os.environ["ACBENCH_STATS_CACHE"] = tmp
        yield


@keeps_caller_state
def sweep(model=DEFAULT_MODEL, **keywords) -> list[dict]:
    """What `bench run` does, with its flags as keywords (`methods=["pca", "fasc-kfac"], rank=[0.5],
    lama_limit=5, output="results"`): the missing cells computed and stored under `output`, the leaderboard
    written there (unless report=False). Without `output` nothing is kept: the cells are computed in a temporary
    folder, returned, and the folder removed (no leaderboard). `model`: one model or a list (one results folder
    each, pooled in the report). Returns every cell the sweep asks for, as stored (with `output`, a rerun computes
    only what is missing and returns them all). `model` may also be what `load_model` returned (opened again from
    its source). The calibration statistics are computed for the call and removed after it, unless `cache=True`
    keeps them in the shared cache (`cache_limit` as in `compress`)."""
    cache, cache_limit = keywords.pop("cache", False), keywords.pop("cache_limit", None)
    if "output" not in keywords:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="acbench-sweep-") as tmp:
            return sweep(model, **{**keywords, "output": tmp, "report": keywords.get("report", False),
                                   "cache": cache, "cache_limit": cache_limit})
    configs = sweep_configs(model, keywords)
    if any(c.executor != "local" for c in configs):
        raise UserError("executor= other than local: run a Ray sweep with `bench run --executor ray`")
    with _statistics_cache_for(cache, cache_limit):
        prepared = run_configs(configs)
    return [cell for p in prepared for cell in stored_cells(p)]


def run_configs(configs: list[RunConfig]) -> list:
    """`bench run` on this machine for checked configs (one per model): every model's settings resolved before
    any model opens, the sweep computed, the leaderboard written unless report is off. Returns each model's
    Prepared (its plan and `outcome`)."""
    from acbench.runner.execute import STAGE_LOG, sweep_runs, third_party_kept, write_kept_lines

    runs = [resolve_run(c) for c in configs]
    with third_party_kept(not configs[0].progress) as said:  # --quiet: other libraries' lines kept, not shown
        prepared = sweep_runs(runs)
    if said:
        kept = write_kept_lines(Path(configs[0].output) / STAGE_LOG, said)
        say(f"{len(said)} line(s) other libraries printed kept in {kept} (--quiet)")
    if configs[0].report:
        say(f"leaderboard: {write_leaderboard(configs[0].output, configs[0].margin)}")
    return prepared


def stored_cells(prepared) -> list[dict]:
    """The stored record of every cell a prepared run asks for (computed now or before), as written."""
    import json

    src = prepared.source
    wanted = plan(prepared.run, ModelInfo(src.name, src.fingerprint, prepared.run.n_blocks), overwrite=True)
    return [json.loads(c.path.read_text(encoding="utf-8")) for c in wanted if c.path.exists()]


def write_leaderboard(folder: str | Path, margins: dict | None = None) -> Path:
    """The markdown leaderboard of every cell under `folder` (as `bench report` writes it); `margins` ({task:
    margin}) override the tasks' default equivalence margins."""
    from acbench.leaderboard.report import write_report

    from acbench.results.leaderboard_display import report_display

    return Path(write_report(str(folder), display=report_display(margins)))


def to_frame(results, model: str | None = None, method: str | None = None):
    """What `evaluate` or `sweep` returned as the DataFrame `load_results` gives: one row per (cell or task) and
    metric, in load_results' columns. `sweep`'s cells fill every column; `evaluate`'s {task: result} fills the task,
    metric, value, stderr, direction and item count, with `model` and `method` as given (the rest empty)."""
    import pandas as pd

    from acbench.core.record import CellRecord
    from acbench.leaderboard.frame import COLUMNS, results_frame
    from acbench.tasks.base import TaskResult

    for what, value in (("model", model), ("method", method)):
        if value is not None and not (isinstance(value, str) and value.strip()):
            raise UserError(f"to_frame: {what}={value!r}: pass the {what}'s name as a string (it fills the frame's "
                            f"{what} column for evaluate's results), or leave it out")
    if isinstance(results, list) and all(isinstance(c, (Mapping, CellRecord)) for c in results):
        try:
            cells = [c if isinstance(c, CellRecord) else CellRecord.from_json(dict(c)) for c in results]
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise UserError(f"to_frame: a cell sweep returned does not read as one ({e})") from None
        return results_frame(cells)
    if isinstance(results, Mapping) and all(isinstance(r, TaskResult) for r in results.values()):
        rows = []
        for task, r in results.items():
            primary = r.primary_metric or getattr(_task_class(task), "primary_metric", "")
            higher = {**getattr(_task_class(task), "higher_is_better", {}), **r.higher_is_better}
            for name, value in r.metrics.items():
                rows.append({"model": model, "method": method, "task": task, "kind": "task", "metric": name,
                             "value": value, "stderr": r.stderr.get(name), "primary": name == primary,
                             "higher_is_better": higher.get(name), "n_items": len(r.records)})
        return pd.DataFrame(rows, columns=list(COLUMNS))
    raise UserError(f"to_frame takes what sweep returned (a list of cells) or what evaluate returned ({{task: "
                    f"result}}), not {type(results).__name__}")


def _task_class(name: str):
    from acbench import tasks as registry

    return registry.get_task(name) if name in registry.known_tasks() else None


def load_results(*folders: str | Path):
    """Every stored cell under the folders as one pandas DataFrame: one row per cell and metric, with the cell's
    coordinates (model, method, budget, rank, allocation, scope, task), its settings key, the metric's value and
    stderr, the compression ratios and the cell's file. Cells the leaderboard would skip (unreadable, invalid,
    superseded) are left out the same way, and the DataFrame's `attrs["problems"]` names them."""
    from acbench.leaderboard.frame import results_frame
    from acbench.leaderboard.load import read_result_set as load_cells

    from acbench.leaderboard.load import results_folder_problem

    if not folders:
        raise UserError("load_results() names no folder: pass the output folder of a run, e.g. "
                        "load_results('results')")
    for f in folders:
        problem = results_folder_problem(f)
        if problem:
            raise UserError(problem + ": pass the output folder of a run (default results)")
    rs = load_cells(*folders)
    frame = results_frame(rs.cells)
    frame.attrs["problems"] = list(rs.problems) + list(rs.superseded)
    return frame

