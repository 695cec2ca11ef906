"""Before any weights load: the model opened and checked, BOS settled, the groups selected, the calibration checked
against what each method needs, the calibration windows tokenized once (`Prepared`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
import torch

from acbench.core.errors import UserError
from acbench.core.log import say, warn
from acbench.core.record import UNIFORM, describe_scope
from acbench.core.stats import SPARSITY_FAMILY, check_pattern_widths
from acbench import methods
from acbench.core.version import __version__
from acbench.deploy.allocation import SPARSITY_RULES, check_budget
from acbench.runner.cells import Cell, ModelInfo, plan
from acbench.calibration.memory import calibration_chunks
from acbench.measure.costs import model_positions
from acbench.runner.config import Run
from acbench.model.groups import fused_experts_problem
from acbench.model.sources import ModelSource, check_weights_fit, open_model
from acbench.runner.selection import ALL
from acbench.runner.until_decided import check_partials
from acbench.calibration.cache import calibration_windows
from acbench.calibration.support import short_groups, support_line
from acbench.results.store import results_name


def log(msg: str) -> None:
    """A run's status line, through the `acbench` logger (its warnings go through acbench.core.log.warn)."""
    say(msg)


@dataclass
class Prepared:
    """A run ready to execute: its model opened (no weights), its data checked, its missing cells planned."""

    run: Run
    source: ModelSource
    cells: list[Cell]
    calib_windows: torch.Tensor | None = None  # tokenized once, for the calibration
    outcome: dict | None = None  # once executed: {"written", "seconds", "elsewhere", "failed"}


def check_groups(run: Run, groups: list) -> list:
    """The selected groups (of a meta-device model; `run` resolved for it); budgets and patterns that cannot apply
    to them are refused before any cell is computed."""
    selection = run.selection
    # the kinds as typed: a resolved selection naming every group the model has reads as "all", which for a
    # model with fused experts does not mean its MLP
    problem = fused_experts_problem(groups, tuple(run.config.groups) if run.config.groups else None)
    if problem and (run.methods or run.analyses):  # dense alone compresses nothing: its experts are no problem
        raise UserError(problem)
    idle = getattr(groups, "idle_sites", ())
    if idle:
        log(f"{len(idle)} linear sites stay dense: the traced forward never called them as modules (a weight read "
            f"directly, as Mamba's dt_proj, or a block the forward skips), so no input of theirs can be calibrated "
            f"({idle[0]}" + (", ..." if len(idle) > 1 else "") + ")")
    selected = [g for g in groups if selection.includes(g)]
    if selection.scope != ALL:
        log(f"compressing {len(selected)} of {len(groups)} input groups: {describe_scope(selection.scope)}"
            + ("; analyses run over every group" if run.analyses else ""))
    for r in run.ranks:  # an alignment that rounds k up to a group's (or site's) full width leaves it dense
        if r.align > 1 and r.ratio < 1:
            for g in selected:
                shapes = [("group", g.name, r.k_group(g.d_in, g.d_outs), g.d_in)] + [
                    ("site", f"{g.name}.{n}", r.k_site(g.d_in, d), min(g.d_in, d)) for n, d in zip(g.site_names, g.d_outs)]
                for what, name, k, full in shapes:
                    if k >= full:
                        raise UserError(f"--rank-align {r.align} rounds the k of {what} {name} up to its full width "
                                        f"{full} at --rank {r.ratio:g}: it would stay uncompressed; use a "
                                        "--rank-align well below the model's widths (e.g. 8 or 64)")
    if any(rule != UNIFORM and rule not in SPARSITY_RULES for rule in run.allocate):
        for r in run.ranks:
            check_budget(selected, r)
    if any(methods.family_of(m) == SPARSITY_FAMILY for m in run.methods):
        check_pattern_widths(list(run.patterns), selected)
    return selected


def check_lengths(run: Run, config) -> None:
    """A sequence longer than the model's positions is refused before any weights load (at 100,000 tokens a
    window ran until killed; past the positions a model's outputs mean nothing)."""
    limit = model_positions(config)
    if limit is None:
        return
    # (what is too long, its length, the fix): each names what the user can change, never a flag they did not give
    lengths = [("--calib-seq-len", run.calibration.seq_len, f"pass --calib-seq-len {limit} or less")] \
        if run.stats_needs() else []
    lengths += [(f"{m}'s authors' calibration windows", spec.seq_len,
                 f"run {m} with --calibration as-given (and --calib-seq-len {limit} or less), or on a model with "
                 f"{spec.seq_len} positions") for m, spec in run.own_calibrations().items()
                if spec.seq_len != run.calibration.seq_len]
    lengths += [(f"{name}'s seq_len", task.settings.seq_len,
                 f"pass --ppl-seq-len {limit} or less" if name == "ppl-token" else
                 f"pass --task-option {name}.seq_len={limit} or less") for name, task in run.tasks.items()
                if isinstance(getattr(task.settings, "seq_len", None), int)]
    for what, n, fix in lengths:
        if n > limit:
            raise UserError(f"{what} ({n} tokens) are longer than the model's {limit} positions: {fix}"
                            if what.endswith("windows") else
                            f"{what} {n} is longer than the model's {limit} positions: {fix}")


def open_checked(run: Run, tokenize: bool = True) -> Prepared:
    """Open the model (tokenizer and config), settle BOS, check the tasks', the groups' and the calibration's data;
    nothing is planned yet (`bench compress` stops here). `tokenize=False` leaves the calibration windows to the
    caller, who knows whether any cell will read them."""
    from acbench.tasks.data.text_data import resolve_bos

    from acbench.model.checkpoint import runtime_forms

    c = run.config
    for line in run.describe():
        log(("" if line.startswith("sizes") else f"acbench {__version__}: ") + line)
    source = open_model(c.model, c.dtype, c.progress, c.device_map)
    check_weights_fit(source)
    forms = runtime_forms(source.config)
    if forms and run.methods:
        raise UserError(f"model {c.model} is a compressed checkpoint ({', '.join(forms)} sites): evaluate it as it is "
                        "with --methods dense, or compress the original model")
    run = run.with_bos(resolve_bos(source.tokenizer, run.bos))  # one protocol for calibration and ppl-token
    log(f"BOS protocol: {run.bos}" + (" (the tokenizer's default)" if c.bos == "auto" else ""))
    for task in run.tasks.values():
        task.check(source.tokenizer)
    check_lengths(run, source.config)
    for analysis in run.analyses.values():
        for name in analysis.uses_tasks:
            run.task(name)  # its run-sized tasks' settings are valid
    if run.analyses and not run.ranks:
        log(f"{', '.join(run.analyses)}: run at rank ratios, and this run gives none: skipped; add --rank 0.5 (and "
            "a method) to run them")
    groups = source.input_groups()
    run = run.for_blocks(len({g.block for g in groups}), tuple(dict.fromkeys(g.kind for g in groups)))  # the selection, resolved once for the whole run
    selected = check_groups(run, groups)
    warn_short_calibrations(run, selected)
    if run.ranks:  # a solve of minutes (a wide group on a CPU) is said before any weights load
        from acbench.measure.costs import long_solve_line

        device = c.device if c.solve_device in (None, "auto") else c.solve_device
        long = long_solve_line(run.methods, selected, run.ranks, c.pair_tokens, device, c.solve_dtype)
        if long:
            warn(long)
    if run.stats_needs() and run.stats_memory:  # a budget below one group's statistics, said before any weights load
        calibration_chunks(groups if run.analyses else selected, run.stats_needs(), run.config.pair_tokens,
                           run.stats_memory)
    windows = calibration_windows(source.tokenizer, run.calibration) if tokenize and run.stats_needs() else None
    return Prepared(run, source, [], windows)


def prepare(run: Run, taken: dict[str, str] | None = None) -> Prepared:
    """`open_checked`, then plan the cells that are missing, under the model's own results folder (`taken`: the
    names already given to other models of the same sweep, {name: identity})."""
    prepared = open_checked(run, tokenize=False)
    run, source = prepared.run, prepared.source
    name = results_name(run.output, source.name, source.fingerprint, taken)
    if name != source.name:
        log(f"results of {run.config.model} are filed under {name}/: {source.name}/ holds another model's cells")
        source = replace(source, name=name)
        prepared = replace(prepared, source=source)
    cells = plan(run, ModelInfo(source.name, source.fingerprint, run.n_blocks))
    for cell in cells:
        if cell.why not in ("missing", "overwrite"):
            log(f"recomputing {cell.path}: {cell.why}")
    log(f"{len(cells)} cell(s) to compute under {run.output}/ (existing cells are kept; --overwrite recomputes)")
    if run.config.until_decided:
        check_partials([c for c in cells if not c.id.is_analysis], run.tasks, source.tokenizer)
    # a rerun with nothing to compute does not tokenize the calibration text (2.5 s of the smoke model's no-op rerun)
    windows = calibration_windows(source.tokenizer, run.calibration) if cells and run.stats_needs() else None
    return replace(prepared, cells=cells, calib_windows=windows)


def warn_short_calibrations(run: Run, selected) -> list[str]:
    """Before any work: one line per calibration with fewer tokens than groups a method's solve reads full-rank
    statistics of, naming the methods it fails (logged, and returned)."""
    short: dict = {}  # (tokens, seq_len, the short groups) -> [(method, its compressor)]
    for m in run.methods:
        comp = run.compressor(m)
        spec = run.calibration_for(m)
        tokens = spec.samples * spec.seq_len
        groups = tuple(g.name for g in short_groups(comp, selected, tokens)) if comp.required_stats() else ()
        if groups:
            short.setdefault((tokens, spec.seq_len, groups), []).append((m, comp))
    lines = [support_line([m for m, _ in ms], ms[0][1], selected, tokens, seq_len)
             for (tokens, seq_len, _), ms in short.items()]
    for line in lines:
        warn(line)
    return lines
