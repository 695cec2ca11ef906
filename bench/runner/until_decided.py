"""`bench run --until-decided`: one variant's task evaluated block by block in the task's seeded item order, its
comparison with the reference tested after each block by a confidence sequence (core.confidence_sequences), and
stopped at the first block that decides it, or at the budget. Dense and the reference are evaluated on the whole
budget: every comparison can then pair with them on every item it needs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from core.confidence_sequences import paired_cs, sequential_decision
from tasks.base import Task, TaskResult


def scores_of(records: list[dict]) -> tuple[str, list[float], list[tuple]] | None:
    """('accuracy' or 'nll', per-item scores, per-item identities) of a task's records."""
    from core.significance import record_keys, record_scores

    got = record_scores(records)
    return None if got is None else (got[0], got[1], record_keys(records))


def reference_records(path: Path) -> list[dict] | None:
    """The stored reference cell's records, where it exists and was evaluated until decided (in the same order)."""
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or not isinstance((rec.get("details") or {}).get("until_decided"), dict):
        return None
    records = rec.get("records")
    return records if isinstance(records, list) else None


def decide(kind: str, ref: list[float], mine: list[float], budget: int, margin, higher) -> tuple:
    """(decision or None, lower, upper) of the confidence sequence on the items scored so far."""
    d = np.asarray(mine, dtype=np.float64) - np.asarray(ref[:len(mine)], dtype=np.float64)
    lo, hi = paired_cs(kind, d, budget)
    return sequential_decision(float(lo[-1]), float(hi[-1]), margin, higher), float(lo[-1]), float(hi[-1])


def partial_path(cell_path: Path) -> Path:
    """Where a variant's blocks scored so far are kept while it runs (not a .json: never read as a cell)."""
    return cell_path.with_name(cell_path.name + ".partial")


def resumed(path: Path | None, task: Task, pool: list, block: int) -> list[dict]:
    """The records an interrupted evaluation of this cell left, when they are whole blocks of this pool's first
    items (checked by their identities, not by the file's say-so); [] otherwise, said in one line if a file was
    there."""
    from core.significance import record_keys, record_scores

    if path is None or not path.exists():
        return []
    try:
        kept = json.loads(path.read_text(encoding="utf-8"))
        records = kept["records"]
        if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
            raise ValueError("its records are not a list of records")
        n = len(records)
        if n % block and n != len(pool) or n > len(pool) or record_keys(records) != pool_keys(task, pool[:n]):
            raise ValueError("not this pool's first blocks")
        scores = record_scores(records) if records else ("", [])
        if scores is None or not all(math.isfinite(v) and (scores[0] != "accuracy" or v in (0, 1))
                                     for v in scores[1]):
            raise ValueError("a score that no evaluation gives")
    except (OSError, ValueError, KeyError, TypeError) as e:
        import sys

        sys.stderr.write(f"{path.name}: the blocks an interrupted run left do not match this evaluation ({e}): "
                         "evaluating from the first block\n")
        return []
    return records


def pool_keys(task: Task, items: list) -> list:
    """The identities the records of `items` will carry, without scoring them (record_keys of stub records)."""
    from core.significance import record_keys

    return record_keys([task.item_identity(i) for i in items])


def evaluate_until_decided(task: Task, model, tokenizer, reference: list[dict] | None | bool,
                           progress: bool = True, keep: Path | None = None) -> TaskResult:
    """The task's result on the items scored until the comparison with `reference`'s records was decided; the
    whole budget when `reference` is False (dense, or the reference itself) or None (the reference's cell is not
    stored, or scored other items). The result's details say how far it went and why it stopped. `keep`: a file
    the blocks scored so far are written to after each block, and resumed from (then removed at the end)."""
    from core.io import atomic_write_text

    spec = task.until_decided
    pool = task.item_pool(tokenizer)
    block = max(1, math.ceil(len(pool) / spec.looks))
    higher = task.higher_is_better.get(task.primary_metric)
    whole = reference is False
    ref = scores_of(reference) if reference else None
    records, decision, bounds = resumed(keep, task, pool, block), None, None
    for start in range(0, len(pool), block):
        if len(records) < min(start + block, len(pool)):  # blocks an interrupted run scored are tested, not rescored
            records += task.score_items(model, tokenizer, pool[start:start + block], progress)
            if keep is not None:
                atomic_write_text(keep, json.dumps({"records": records}))
        if ref is None:
            continue
        mine = scores_of(records[:start + block])
        if mine is None or mine[0] != ref[0] or len(ref[1]) < len(mine[1]) or ref[2][:len(mine[2])] != mine[2]:
            ref = None  # the stored reference scored other items: this comparison cannot stop early
            continue
        decision, *bounds = decide(ref[0], ref[1], mine[1], len(pool), spec.margin, higher)
        if decision:
            records = records[:start + block]
            break
    if keep is not None:
        keep.unlink(missing_ok=True)
    result = task.result_of(records)
    result.details["until_decided"] = {
        **spec.as_dict(), "budget": len(pool), "block": block, "items": len(records),
        "decision": decision, "interval": bounds,
        "stopped": "decided" if decision else "budget" if ref is not None else
        "whole budget (dense or the reference)" if whole else "budget (no stored reference on the same items)"}
    return result
