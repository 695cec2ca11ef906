"""`acbench.compress`: one method at one budget, in place, through the path `bench compress` takes
(acbench.runner.one_variant.compress_model)."""

from __future__ import annotations
import inspect
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
import torch

from acbench.core.errors import UserError
from acbench.model.checkpoint import runtime_forms
from acbench.model.groups import find_input_groups
from acbench.model.sources import LoadedModel
from acbench.runner.config import RunConfig
from acbench.runner.run_checks import check_config_types
from acbench.runner.resolve import resolve_run
from acbench.runner.prepare import check_groups, check_lengths, warn_short_calibrations
from acbench.runner import one_variant
from acbench.runner.one_variant import Compressed
from acbench.api.caller_state import keeps_caller_state
from acbench.api.catalogue import cache_bound


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
