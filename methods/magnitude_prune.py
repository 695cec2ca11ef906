"""Magnitude pruning, the data-free weight-sparsity control: the largest |W_ij| kept, compared within each output
row (N of every M input weights per row, acbench's default) or, with `comparison=layer`, across the whole weight
matrix: the magnitude baseline of Wanda's code (lib/prune.py, `prune_magnitude`: one threshold per layer)."""

from dataclasses import dataclass

import torch

from acbench.core.registry import added_setting

from .base import MaskedWeights, SparsityMethod
from .wanda import weight_masks

COMPARISONS = ("row", "layer")


@dataclass(frozen=True)
class MagnitudeSettings:
    # which weights compete for the kept places: those of one output row, or all of one weight matrix
    comparison: str = added_setting("row")

    def __post_init__(self):
        if self.comparison not in COMPARISONS:
            raise ValueError(f"magnitude-prune comparison {self.comparison!r} is not one of {', '.join(COMPARISONS)}: "
                             "row compares each output row's weights, layer the whole matrix's (Wanda's baseline)")


def layer_masks(weights, density: float) -> dict:
    """Per weight matrix, the round(density x its size) largest |W_ij| kept (rows keep different counts)."""
    out = {}
    for name, W in weights.items():
        k = max(1, round(density * W.numel()))
        idx = W.abs().reshape(-1).topk(k, sorted=False).indices
        out[name] = torch.zeros(W.numel(), dtype=torch.bool, device=W.device).scatter_(0, idx, True).view_as(W)
    return out


class MagnitudePrune(SparsityMethod):
    name = "magnitude-prune"
    description = ("weight pruning by |W_ij|, compared per output row (N:M or a density) or per matrix "
                   "(comparison=layer, Wanda's baseline); the data-free weight-sparsity control")
    masks_weights = True
    Settings = MagnitudeSettings

    def budget_problem(self, pattern):
        if self.settings.comparison == "layer" and pattern.structured:
            return (f"magnitude-prune comparison=layer keeps a share of each whole matrix, which cannot be the N:M "
                    f"pattern {pattern.budget}: pass a density (--sparsity 0.5) or comparison=row")
        return None

    def solve(self, weights, stats, pattern):
        if self.settings.comparison == "layer":
            return MaskedWeights(pattern=pattern, masks=layer_masks(weights, pattern.density))
        return MaskedWeights(pattern=pattern, masks=weight_masks(weights, pattern))
