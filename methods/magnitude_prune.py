"""Magnitude pruning, the data-free weight-sparsity control: N of every M input weights per output row by |W_ij|."""

from .base import MaskedWeights, SparsityMethod
from .wanda import weight_masks


class MagnitudePrune(SparsityMethod):
    name = "magnitude-prune"
    description = "N:M weight pruning per output row by |W_ij| (data-free weight-sparsity control)"
    masks_weights = True

    def solve(self, weights, stats, pattern):
        return MaskedWeights(pattern=pattern, masks=weight_masks(weights, pattern))
