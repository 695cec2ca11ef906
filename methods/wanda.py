"""Wanda (Sun et al. 2023), the weight-sparsity control: per output row, keep N of every M input weights (or
the top fraction of the row) by |W_ij| * ||X_j||, with ||X_j|| = sqrt(E[x_j^2]) from the calibration C."""

import torch

from acbench.core.linalg import check_finite
from acbench.core.sparsity import topk_mask

from .base import AuthorsCalibration, MaskedWeights, SEQUENTIAL, SparsityMethod


def weight_masks(weights, pattern, scale=None) -> dict:
    """N of every M input weights per output row by |W| (times a per-input-channel scale)."""
    out = {}
    for name, W in weights.items():
        score = W.abs() if scale is None else W.abs() * scale[None, :]
        out[name] = topk_mask(score, *pattern.topk_args(W.shape[1]))
    return out


class Wanda(SparsityMethod):
    name = "wanda"
    description = "N:M weight pruning per output row by |W_ij| ||X_j|| (Wanda; the weight-sparsity control)"
    masks_weights = True
    needs = frozenset({"C"})
    authors_calibration = AuthorsCalibration(128, 2048, SEQUENTIAL, "C4 train segments", "Wanda paper's setup (SparseGPT's calibration) and lib/prune.py (prune_wanda)")

    def solve(self, weights, stats, pattern):
        norms = torch.diagonal(stats.C)
        check_finite("wanda", C=norms)
        return MaskedWeights(pattern=pattern, masks=weight_masks(weights, pattern, norms.clamp_min(0).sqrt()))
