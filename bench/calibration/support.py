"""Whether a calibration can support a method's solve: a d x d statistic estimated from n tokens has rank at most
n, so a solve that inverts, factors or eigen-decomposes C or F (whitening, a Hessian inverse, a full rotation, an
eigenbasis) of a group wider than its calibration tokens works on a singular matrix: it falls back (damping) or
keeps directions the calibration never saw. Said before any work (the run's opening lines, `bench plan`), recorded
in the cells it affects, and said again after the solve with the fallbacks it caused."""

from __future__ import annotations

import math


def short_groups(comp, groups, tokens: int) -> list:
    """The groups wider than `tokens` whose solve under `comp` relies on a full-rank statistic."""
    if not comp.full_rank_stats():
        return []
    return [g for g in groups if g.d_in > tokens]


def support_record(comp, groups, tokens: int) -> dict | None:
    """What a cell stores of it: {groups, of, tokens, tokens_needed, stats}, or None where every group is covered."""
    short = short_groups(comp, groups, tokens)
    if not short:
        return None
    return {"groups": len(short), "of": len(groups), "tokens": tokens,
            "tokens_needed": max(g.d_in for g in short), "stats": sorted(comp.full_rank_stats())}


def support_line(methods: list[str], comp, groups, tokens: int, seq_len: int) -> str | None:
    """One line naming the groups a calibration of `tokens` cannot support under the methods (`comp` one of them:
    they share its short groups), and the size that would; None where it supports them all."""
    short = short_groups(comp, groups, tokens)
    if not short:
        return None
    widest = max(short, key=lambda g: g.d_in)
    need = widest.d_in
    return (f"{', '.join(methods)}: {tokens:,} calibration tokens are fewer than the input width of {len(short)} of "
            f"{len(groups)} groups (up to {need:,}, {widest.name}), where the C or F {'their' if len(methods) > 1 else 'its'} "
            f"solve inverts or eigen-decomposes is singular: the solve falls back or keeps directions the calibration "
            f"never saw; calibrate at least {need:,} tokens (e.g. --calib-samples {math.ceil(need / seq_len)} at "
            f"--calib-seq-len {seq_len})")


def after_line(label: str, record: dict, summary: dict) -> str:
    """After the solve: the fallbacks a short calibration left in the variant."""
    fallbacks = summary.get("n_fallbacks") or 0
    return (f"[{label}] calibrated on {record['tokens']:,} tokens, fewer than the width of {record['groups']} of "
            f"{record['of']} groups: {fallbacks} numeric fallback(s) recorded; its numbers measure the calibration's "
            f"size as much as the method (at least {record['tokens_needed']:,} tokens would cover every group)")
