"""`bench run --until-decided`: one variant's task evaluated block by block in the task's seeded item order, its
comparison with the reference tested after each block by a confidence sequence (acbench.core.confidence_sequences), and
stopped at the first block that decides it, or at the budget. Dense and the reference are evaluated on the whole
budget: every comparison can then pair with them on every item it needs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from acbench.core.confidence_sequences import ALPHA, paired_cs, sequential_decision
from acbench.tasks.base import Task, TaskResult


def scores_of(records: list[dict]) -> tuple[str, list[float], list[tuple]] | None:
    """('accuracy' or 'nll', per-item scores, per-item identities) of a task's records."""
    from acbench.core.significance import record_keys, record_scores

    got = record_scores(records)
    return None if got is None else (got[0], got[1], record_keys(records))


def reference_records(path: Path) -> list[dict] | None:
    """The stored reference cell's records, where it exists and was evaluated until decided (in the same order);
    None where it is not stored or was evaluated otherwise. A reference file that is there but does not read as a
    cell, or whose records no longer match their digest, is refused in one line naming it: its records would move
    every verdict taken against it."""
    from acbench.core.errors import UserError
    from acbench.core.record import cell_problem

    if not path.exists():
        return None
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: the reference's cell does not read ({type(e).__name__}): remove it to compute it "
                        "again") from None
    details = rec.get("details") if isinstance(rec, dict) else None
    if not isinstance(details, dict) or not isinstance(details.get("until_decided"), dict):
        return None  # not a cell evaluated until decided (a cell of any other shape is the plan's to recompute)
    problem = cell_problem(rec)
    if problem:
        raise UserError(f"{path}: the reference's cell is not valid ({problem}): remove it to compute it again")
    records = rec.get("records")
    return records if isinstance(records, list) else None


def decide(kind: str, ref: list[float], mine: list[float], budget: int, margin, higher,
           alpha: float = ALPHA) -> tuple:
    """(decision or None, lower, upper) of the confidence sequence at level `alpha` on the items scored so far."""
    d = np.asarray(mine, dtype=np.float64) - np.asarray(ref[:len(mine)], dtype=np.float64)
    lo, hi = paired_cs(kind, d, budget, alpha)
    return sequential_decision(float(lo[-1]), float(hi[-1]), margin, higher), float(lo[-1]), float(hi[-1])


def partial_path(cell_path: Path) -> Path:
    """Where a variant's blocks scored so far are kept while it runs (not a .json: never read as a cell)."""
    return cell_path.with_name(cell_path.name + ".partial")


def partial_problem(path: Path, task: Task | None = None, pool: list | None = None,
                    block: int | None = None) -> str | None:
    """What is wrong with the blocks an interrupted run left in `path` (read by content: its digest, its cell's name,
    each record's ranges and, given the task's item pool, the items' identities as whole blocks of the pool's first
    items), or None."""
    from acbench.core.record import _record_problem, records_digest
    from acbench.core.significance import record_keys, record_scores

    if not path.is_file():
        return "not a file"
    try:
        kept = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return f"does not read as JSON ({type(e).__name__})"
    if not isinstance(kept, dict) or not isinstance(kept.get("records"), list):
        return "holds no list of records"
    records = kept["records"]
    cell = path.name[:-len(".partial")]
    if kept.get("cell") != cell:  # a partial copied beside another cell
        return f"was written for cell {kept.get('cell')!r}, not {cell}"
    if kept.get("digest") != records_digest(records):
        return "its records do not match the digest written with them (edited or damaged since)"
    for i, r in enumerate(records):
        problem = "is not a mapping" if not isinstance(r, dict) else _record_problem(r, kept.get("task") or "")
        if problem:
            return f"records[{i}] {problem}"
    if records and record_scores(records) is None:
        return "its records hold no score (correct or nll) in every record"
    if pool is not None:
        n = len(records)
        if n > len(pool) or (n % block and n != len(pool)):
            return f"its {n} records are not whole blocks of {block} items of this evaluation's {len(pool)}"
        if record_keys(records) != pool_keys(task, pool[:n]):
            return "its records are not this evaluation's first items (another task setting or item order)"
    return None


def refuse_partial(path: Path, problem: str):
    from acbench.core.errors import UserError

    raise UserError(f"{path} (the blocks an interrupted until-decided run kept): {problem}; remove the file to "
                    "evaluate this cell from its first block")


def resumed(path: Path | None, task: Task, pool: list, block: int) -> list[dict]:
    """The records an interrupted evaluation of this cell left (whole blocks of this pool's first items, checked by
    content), [] where there is no such file; a file that does not check is refused in one line naming it, never
    resumed and never silently dropped."""
    if path is None or not (path.exists() or path.is_symlink()):
        return []
    problem = partial_problem(path, task, pool, block)
    if problem:
        refuse_partial(path, problem)
    return json.loads(path.read_text(encoding="utf-8"))["records"]


def block_size(task: Task, pool: list) -> int:
    """Items per look: the pool cut into the task's `looks` blocks."""
    return max(1, math.ceil(len(pool) / task.until_decided.looks))


def check_partials(cells, tasks: dict, tokenizer) -> None:
    """Before any work: every planned cell's kept blocks, where an interrupted run left some, read by content and
    refused in one line naming the file when they do not check."""
    for cell in cells:
        task = tasks.get(cell.id.task)
        keep = partial_path(cell.path)
        if task is None or task.until_decided is None or not (keep.exists() or keep.is_symlink()):
            continue
        pool = task.item_pool(tokenizer)
        problem = partial_problem(keep, task, pool, block_size(task, pool))
        if problem:
            refuse_partial(keep, problem)


def write_partial(path: Path, task: Task, records: list[dict]) -> None:
    """The blocks scored so far, with what they are checked against when resumed."""
    from acbench.core.io import atomic_write_text
    from acbench.core.record import records_digest

    atomic_write_text(path, json.dumps({"cell": path.name[:-len(".partial")], "task": task.name,
                                        "digest": records_digest(records), "records": records}))


def pool_keys(task: Task, items: list) -> list:
    """The identities the records of `items` will carry, without scoring them (record_keys of stub records)."""
    from acbench.core.significance import record_keys

    return record_keys([task.item_identity(i) for i in items])


def evaluate_until_decided(task: Task, model, tokenizer, reference: list[dict] | None | bool,
                           progress: bool = True, keep: Path | None = None) -> TaskResult:
    """The task's result on the items scored until the comparison with `reference`'s records was decided; the
    whole budget when `reference` is False (dense, or the reference itself) or None (the reference's cell is not
    stored, or scored other items). The result's details say how far it went and why it stopped. `keep`: a file
    the blocks scored so far are written to after each block, and resumed from (then removed at the end)."""
    from acbench.core.record import records_digest, until_decided_digest

    spec = task.until_decided
    pool = task.item_pool(tokenizer)
    block = block_size(task, pool)
    higher = task.higher_is_better.get(task.primary_metric)
    whole = reference is False
    ref = scores_of(reference) if reference else None
    records, decision, bounds = resumed(keep, task, pool, block), None, None
    for start in range(0, len(pool), block):
        if len(records) < min(start + block, len(pool)):  # blocks an interrupted run scored are tested, not rescored
            records += task.score_items(model, tokenizer, pool[start:start + block], progress)
            if keep is not None:
                write_partial(keep, task, records)
        if ref is None:
            continue
        mine = scores_of(records[:start + block])
        if mine is None or mine[0] != ref[0] or len(ref[1]) < len(mine[1]) or ref[2][:len(mine[2])] != mine[2]:
            ref = None  # the stored reference scored other items: this comparison cannot stop early
            continue
        decision, *bounds = decide(ref[0], ref[1], mine[1], len(pool), spec.margin, higher, spec.alpha)
        if decision:
            records = records[:start + block]
            break
    if keep is not None:
        keep.unlink(missing_ok=True)
    result = task.result_of(records)
    ud = {**spec.as_dict(), "budget": len(pool), "block": block, "items": len(records),
          "decision": decision, "interval": bounds,
          "stopped": "decided" if decision else "budget" if ref is not None else
          "whole budget (dense or the reference)" if whole else "budget (no stored reference on the same items)"}
    if ref is not None:  # which reference records the decision was taken against: the leaderboard checks they stay
        ud["reference_digest"] = records_digest(reference[:len(records)])
    ud["digest"] = until_decided_digest(result.records, ud)
    result.details["until_decided"] = ud
    return result
