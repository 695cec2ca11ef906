"""`bench run --until-decided`: one variant's task evaluated block by block in the task's seeded item order, its
comparison with the reference tested after each block by a confidence sequence (core.confidence_sequences), and
stopped at the first block that decides it, or at the budget. Dense and the reference are evaluated on the whole
budget: every comparison can then pair with them on every item it needs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from core.confidence_sequences import accuracy_cs, mean_cs, sequential_decision
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
    lo, hi = accuracy_cs(d) if kind == "accuracy" else mean_cs(d, budget=budget)
    return sequential_decision(float(lo[-1]), float(hi[-1]), margin, higher), float(lo[-1]), float(hi[-1])


def evaluate_until_decided(task: Task, model, tokenizer, reference: list[dict] | None | bool,
                           progress: bool = True) -> TaskResult:
    """The task's result on the items scored until the comparison with `reference`'s records was decided; the
    whole budget when `reference` is False (dense, or the reference itself) or None (the reference's cell is not
    stored, or scored other items). The result's details say how far it went and why it stopped."""
    spec = task.until_decided
    pool = task.item_pool(tokenizer)
    block = max(1, math.ceil(len(pool) / spec.looks))
    higher = task.higher_is_better.get(task.primary_metric)
    whole = reference is False
    ref = scores_of(reference) if reference else None
    records, decision, bounds = [], None, None
    for start in range(0, len(pool), block):
        records += task.score_items(model, tokenizer, pool[start:start + block], progress)
        if ref is None:
            continue
        mine = scores_of(records)
        if mine is None or mine[0] != ref[0] or len(ref[1]) < len(mine[1]) or ref[2][:len(mine[2])] != mine[2]:
            ref = None  # the stored reference scored other items: this comparison cannot stop early
            continue
        decision, *bounds = decide(ref[0], ref[1], mine[1], len(pool), spec.margin, higher)
        if decision:
            break
    result = task.result_of(records)
    result.details["until_decided"] = {
        **spec.as_dict(), "budget": len(pool), "block": block, "items": len(records),
        "decision": decision, "interval": bounds,
        "stopped": "decided" if decision else "budget" if ref is not None else
        "whole budget (dense or the reference)" if whole else "budget (no stored reference on the same items)"}
    return result
