"""Rank allocation across input groups under one parameter budget (docs/design.md, section 6).

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

from acbench.core.errors import UserError
from acbench.core.linalg import NumericError, fisher_basis, pca_basis
from acbench.core.record import UNIFORM
from acbench.core.stats import GroupStats, RankSpec

# rule -> the statistics it reads
RULES = {UNIFORM: frozenset(), "fisher": frozenset({"C", "F"}), "variance": frozenset({"C"}),
         "greedy": frozenset({"abs_hist"})}
LOW_RANK_RULES = frozenset({"fisher", "variance"})  # split a parameter budget into k per group
SPARSITY_RULES = frozenset({"greedy"})  # split a model-level density into a density per group (unstructured)
MIN_K_FRACTION = 0.01  # every selected group keeps at least 1 % of its input directions (and at least one)


def check_rules(rules, budget: str, align: int = 1) -> None:
    from acbench.core.errors import did_you_mean

    for rule in rules:
        if rule not in RULES:
            raise UserError(f"--allocate {rule} is unknown.{did_you_mean(rule, RULES)}")
        if rule in LOW_RANK_RULES and budget != "params":
            raise UserError(f"--allocate {rule} splits one parameter budget across groups: add --budget params "
                            "(--rank is then the deployed/dense parameter ratio of the selected groups)")
        if rule in LOW_RANK_RULES and align != 1:
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

    def compress_args(self) -> dict:
        """What `acbench.deploy.compression.compressed` takes from it."""
        return {"ks": self.ks}


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


# ---------------------------------------------------------------- density across groups (activation sparsity)

DENSITY_STEP = 1 / 64  # the greedy moves a group's density in these steps (and never below one step)


@dataclass
class DensityAllocation:
    """A density per group whose weight reads (density x the group's dense parameters, summed) meet the model-level
    target density: where zeroing channels loses the least of the input's energy, more is zeroed."""

    rule: str
    densities: dict[str, float]
    target: float
    allocated: float  # the parameter-weighted mean density the allocation reached
    lost_energy: dict[str, float]  # per group, the calibration |x|^2 fraction below its threshold
    seconds: dict = field(default_factory=dict)

    def summary(self) -> dict:
        return {"rule": self.rule, "target_density": self.target, "allocated_density": self.allocated,
                "density": dict(self.densities), "lost_energy": dict(self.lost_energy), "seconds": self.seconds}

    def compress_args(self) -> dict:
        return {"densities": self.densities}


def lost_energy(hist: torch.Tensor, density: float) -> float:
    """The fraction of E[x^2] carried by the (1 - density) smallest |x| of a magnitude histogram (acbench.core.stats bins,
    each bin's values at its centre, interpolated within a bin): what zeroing them loses of the input's energy."""
    import numpy as np

    from acbench.core.stats import HIST_BINS, HIST_HI, HIST_LO

    p = (hist / hist.sum()).double().cpu().numpy()
    width = (HIST_HI - HIST_LO) / HIST_BINS
    centre = 10.0 ** (HIST_LO + (np.arange(HIST_BINS) + 0.5) * width)
    energy = p * centre ** 2
    mass = np.concatenate([[0.0], np.cumsum(p)])
    cum = np.concatenate([[0.0], np.cumsum(energy)])
    return float(np.interp(1.0 - density, mass, cum) / cum[-1]) if cum[-1] > 0 else 0.0


def allocate_density(rule: str, groups, stats: Mapping[str, GroupStats], pattern) -> DensityAllocation:
    """TEAL's greedy allocation (Liu et al. 2024), model-wide: every group starts dense, and the step that costs
    the least lost input energy per weight read saved is taken, one DENSITY_STEP at a time, until the groups'
    parameter-weighted density reaches the target. TEAL scores a step by the block's output error on calibration
    tokens; here the score is the input energy the step zeroes, read off each group's |x| histogram (abs_hist),
    which needs no extra forward passes. Energy lost grows faster as density falls (the smallest values go first),
    so each group's steps come in increasing cost and taking the cheapest step first is the greedy of a knapsack
    with convex costs (optimal up to the last step)."""
    if pattern.structured:
        raise UserError(f"--allocate {rule} sets a density per group; {pattern.budget} keeps one N:M pattern in "
                        "every group: pass a density (--sparsity 0.5)")
    t0 = time.perf_counter()
    params = {g.name: g.d_in * sum(g.d_outs) for g in groups}
    total = sum(params.values())
    steps = round(1 / DENSITY_STEP)
    level = {g: steps for g in params}  # density = level * DENSITY_STEP
    curves = {}
    for g in params:
        h = stats[g].abs_hist
        if h is None or not float(h.sum()) > 0:
            raise UserError(f"--allocate {rule}: group {g} has no |x| histogram (abs_hist) in its statistics: "
                            "recalibrate (delete its statistics cache folder)")
        curves[g] = [lost_energy(h, i / steps) for i in range(steps + 1)]
    order = {g: i for i, g in enumerate(params)}
    heap = [((curves[g][steps - 1] - curves[g][steps]) / params[g], order[g], g) for g in params]
    heapq.heapify(heap)
    reads = float(total)  # weight entries read per token, sum of density x params
    goal = pattern.density * total
    while heap and reads > goal + 1e-9 * total:
        _, _, g = heapq.heappop(heap)
        level[g] -= 1
        reads -= params[g] / steps
        if level[g] > 1:
            i = level[g]
            heapq.heappush(heap, ((curves[g][i - 1] - curves[g][i]) / params[g], order[g], g))
    densities = {g: level[g] / steps for g in params}
    return DensityAllocation(rule, densities, pattern.density, reads / total,
                             {g: curves[g][level[g]] for g in params}, {"greedy_s": time.perf_counter() - t0})
