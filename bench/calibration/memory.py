"""How much memory a group's calibration statistics take, and the passes a calibration splits into so that each
pass's statistics fit a memory budget (the cache calibrates by these passes; `bench plan` prices them)."""

from __future__ import annotations

from acbench.core.errors import UserError
from acbench.core.stats import HIST_BINS
from acbench.core.units import human

from acbench.model.groups import InputGroup


def stat_bytes(group: InputGroup, needs: frozenset[str], pair_tokens: int, width: int = 8) -> dict[str, int]:
    """Bytes of each statistic of one group: moments at `width` bytes per number (float64 in memory, float32 in
    the cache), the (x, g) token sample always float32."""
    d = group.d_in
    sizes = {"C": d * d * width, "F": d * d * width, "abs_mean": d * width, "mean": d * width, "pairs": 2 * pair_tokens * d * 4,
             "tokens": pair_tokens * d * 4,
             "row_fisher": sum(group.d_outs) * width, "abs_hist": HIST_BINS * width,
             "act_hist": HIST_BINS * width}
    return {k: v for k, v in sizes.items() if k in needs}


def calibration_chunks(groups, needed: frozenset[str], pair_tokens: int, budget: int) -> list[list]:
    """Consecutive groups whose float64 statistics fit the budget together: one calibration pass each."""
    chunks, size = [[]], 0
    for g in groups:
        b = sum(stat_bytes(g, needed, pair_tokens).values())
        if b > budget:
            raise UserError(f"group {g.name}'s statistics take {human(b)}, more than --stats-memory {human(budget)}: "
                            f"raise it to at least {human(b)}")
        if chunks[-1] and size + b > budget:
            chunks.append([])
            size = 0
        chunks[-1].append(g)
        size += b
    return [c for c in chunks if c]
