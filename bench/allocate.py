"""Rank allocation across input groups under one parameter budget (DESIGN.md section 12).

Under the K-FAC surrogate, discarding direction j of group g raises the loss by lambda_gj, the j-th eigenvalue of
C^1/2 F C^1/2, and these rises add over directions and (to second order) over groups. `fisher` keeps, across the
selected groups, the directions with the largest lambda per parameter they cost; `variance` does the same with the
eigenvalues of C (pca's, the variance-driven baseline); `uniform` gives every group the run's own rank ratio.

Costs are exact: one kept direction of a group costs d_in + sum(d_out) parameters in the factorised form
(a column of each A_i and a row of the shared B). Once k (d_in + sum d_out) would reach the dense d_in * sum(d_out),
the group is merged instead; "merged" is only worth its dense cost with every direction kept, so it is one more
item per group: keep the rest of the group for dense minus what its factors cost.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from core.errors import UserError
from core.linalg import NumericError, fisher_basis, pca_basis
from core.record import UNIFORM
from core.stats import GroupStats, RankSpec

# rule -> the statistics it reads
RULES = {UNIFORM: frozenset(), "fisher": frozenset({"C", "F"}), "variance": frozenset({"C"})}
MIN_K_FRACTION = 0.01  # every selected group keeps at least 1 % of its input directions (and at least one)


def check_rules(rules, budget: str, align: int = 1) -> None:
    from core.errors import did_you_mean

    for rule in rules:
        if rule not in RULES:
            raise UserError(f"--allocate {rule} is unknown.{did_you_mean(rule, RULES)} Use {', '.join(RULES)}.")
        if rule != UNIFORM and budget != "params":
            raise UserError(f"--allocate {rule} splits one parameter budget across groups: add --budget params "
                            "(--rank is then the deployed/dense parameter ratio of the selected groups)")
        if rule != UNIFORM and align != 1:
            raise UserError(f"--allocate {rule} keeps single directions: it does not combine with --rank-align "
                            f"{align} (leave --rank-align out)")


def direction_values(rule: str, stats: GroupStats) -> torch.Tensor:
    """Per direction, in the order the method's basis keeps them, what discarding it costs under the rule."""
    try:
        sol = fisher_basis(stats) if rule == "fisher" else pca_basis(stats)
    except NumericError as e:
        raise UserError(str(e)) from None
    # eigenvalues of a PSD matrix: round-off negatives are zero; the greedy split runs on the host
    return sol["lam"].double().clamp_min(0).cpu()


@dataclass
class Allocation:
    rule: str
    ks: dict[str, int]  # group -> k (k = d_in: the group keeps everything and is deployed merged)
    budget_params: int
    allocated_params: int
    dense_params: int
    seconds: dict = field(default_factory=dict)  # values (the eigen-solves) and greedy

    def summary(self) -> dict:
        return {"rule": self.rule, "budget_params": self.budget_params, "allocated_params": self.allocated_params,
                "dense_params": self.dense_params, "budget_ratio": self.budget_params / self.dense_params,
                "allocated_ratio": self.allocated_params / self.dense_params, "seconds": self.seconds,
                "k": dict(self.ks)}


def _floors(shapes: dict[str, tuple[int, int]]) -> tuple[dict, dict]:
    """Per group, the largest k whose factorised form is smaller than dense, and the minimum k."""
    kmax = {g: math.ceil(d * D / (d + D)) - 1 for g, (d, D) in shapes.items()}
    min_k = {g: min(kmax[g], max(1, math.ceil(MIN_K_FRACTION * d))) for g, (d, _) in shapes.items()}
    return kmax, min_k


def _shapes(groups) -> dict[str, tuple[int, int]]:
    return {g.name: (g.d_in, sum(g.d_outs)) for g in groups}


def _budget(shapes: dict[str, tuple[int, int]], rank: RankSpec) -> int:
    return math.floor(rank.ratio * sum(d * D for d, D in shapes.values()))


def _paid_minimum(shapes: dict[str, tuple[int, int]], min_k: dict[str, int], budget: int, ratio: float) -> int:
    """The parameters of every group's minimum k, or one line when the budget cannot pay them."""
    floor = sum(min_k[g] * (d + D) for g, (d, D) in shapes.items())
    if floor > budget:
        raise UserError(f"--rank {ratio:g}: a parameter budget of {budget:,} is below the minimum ranks of the "
                        f"selected groups ({floor:,} parameters at 1 % of each group's directions): raise --rank")
    return floor


def check_budget(groups, rank: RankSpec) -> None:
    """Before any compute: the budget pays for every selected group's minimum k."""
    shapes = _shapes(groups)
    _paid_minimum(shapes, _floors(shapes)[1], _budget(shapes, rank), rank.ratio)


def _greedy(shapes: dict[str, tuple[int, int]], values: dict[str, torch.Tensor], budget: int, ratio: float):
    """shapes: group -> (d_in, sum d_out). Returns ({group: k}, params spent)."""
    kmax, min_k = _floors(shapes)
    ks = dict(min_k)
    spent = _paid_minimum(shapes, min_k, budget, ratio)
    order = {g: i for i, g in enumerate(shapes)}  # ties go to the earlier group: deterministic

    def item(g):
        d, D = shapes[g]
        lam = values[g]
        if ks[g] < kmax[g]:
            return float(lam[ks[g]]), d + D, "direction"
        if ks[g] == kmax[g] and kmax[g] < d:  # merge: keep every remaining direction for the rest of dense
            return float(lam[kmax[g]:].sum()), d * D - kmax[g] * (d + D), "merge"
        return None

    heap = []

    def push(g):
        it = item(g)
        if it is not None:
            value, cost, what = it
            heapq.heappush(heap, (-value / cost, order[g], g, cost, what))

    for g in shapes:
        push(g)
    while heap:
        _, _, g, cost, what = heapq.heappop(heap)
        if spent + cost > budget:
            continue  # this group's next item does not fit; its later ones cost as much (directions) or end it
        spent += cost
        ks[g] = shapes[g][0] if what == "merge" else ks[g] + 1
        push(g)
    return ks, spent


def allocate(rule: str, groups, stats: Mapping[str, GroupStats], rank: RankSpec, progress: bool = False,
             device=None, dtype: torch.dtype = torch.float64) -> Allocation:
    """k per group for `groups` (InputGroups) under `rank` (a parameter ratio for fisher and variance). The
    eigen-solves run on `device` in `dtype` (the run's solve device and precision), memoised there, so the
    compression that follows on that device reuses them."""
    shapes = _shapes(groups)
    dense = sum(d * D for d, D in shapes.values())
    if rule == UNIFORM:
        ks = {g.name: rank.k_group(g.d_in, g.d_outs) for g in groups}
        spent = sum(min(k * (d + D), d * D) for k, (d, D) in zip(ks.values(), shapes.values()))
        return Allocation(rule, ks, spent, spent, dense)
    t0 = time.perf_counter()
    values = {}
    for g in tqdm(groups, desc=f"allocate ({rule})", disable=not progress, leave=False):
        values[g.name] = direction_values(rule, stats[g.name].on(device or "cpu", dtype))
    t1 = time.perf_counter()
    budget = _budget(shapes, rank)
    ks, spent = _greedy(shapes, values, budget, rank.ratio)
    t2 = time.perf_counter()
    return Allocation(rule, ks, budget, spent, dense, {"values_s": t1 - t0, "greedy_s": t2 - t1})
