"""R-Sparse (Zhang et al., ICLR 2025): per weight matrix, the input channels with the largest |x_j| ||W[:, j]|| go
through the matrix's own columns, and every other channel through a low-rank approximation of the whole matrix,
W ~ U_r S_r V_r^T (its truncated SVD, data-free): y = W (m * x) + U_r S_r V_r^T ((1 - m) * x). Each matrix scores
with its own column norms, so each reads its own mask.

The budget follows the authors' code: with density d (the fraction a dense product would keep) and sparse ratio
rho, a matrix of m x n keeps k = floor(n d rho) channels and a rank r = floor((m n d - k m) / (m + n)), so its
multiply-adds per token, k m + r (m + n), are about d m n; rho = 1 is pure sparsity scored by |x_j| alone (no
norms, no branch), as the authors' code does. The whole W stays stored beside the factors (parameters above
dense). Departures: the mask is a top-k per token, not a threshold calibrated to keep k/n on average (the
authors' `kthvalue` over one calibration window); rho is one value for every matrix (the authors search it per
matrix, 1 hour on a GPU; their released Llama-3-8B recipe has rho = 1 for 193 of its 224 matrices)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from acbench.core.stats import SparsitySpec

from .base import SparseActivation, SparsityMethod


@dataclass(frozen=True)
class RSparseSettings:
    sparse_ratio: float = 0.95  # rho: the share of the budget spent on kept channels, the rest on the rank

    def __post_init__(self):
        v = self.sparse_ratio
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and 0 < v <= 1):
            raise ValueError(f"r-sparse sparse_ratio {v!r} is not a number in (0, 1]: 1 is pure sparsity, 0.95 the "
                             "uniform setting")


def budget(m: int, n: int, density: float, rho: float) -> tuple[int, int]:
    """(k channels kept, rank r) of an m x n matrix at `density` with sparse ratio rho."""
    k = max(1, math.floor(n * density * rho))
    r = max(0, math.floor((m * n * density - k * m) / (m + n)))
    return k, min(r, m, n)


class RSparse(SparsityMethod):
    name = "r-sparse"
    description = ("R-Sparse: per matrix and token, the top |x_j| ||W[:, j]|| channels through W, the rest through "
                   "W's rank-r SVD (k = n d rho, r from the rest of the budget; rho=1: top |x_j|, no branch)")
    Settings = RSparseSettings

    @classmethod
    def pattern_problem(cls, pattern):
        if pattern.structured:
            return (f"r-sparse keeps a number of channels per matrix and token and spends the rest of the budget on "
                    f"a rank, not an N:M pattern ({pattern.budget}): pass a density, e.g. --sparsity 0.5")
        return None

    def group_cost(self, group, pattern):
        if pattern.density >= 1:
            return super().group_cost(group, pattern)
        n, rho = group.d_in, self.settings.sparse_ratio
        k, macs, params = budget(1, n, pattern.density, rho)[0], 0, 0
        for m in group.d_outs:
            r = budget(m, n, pattern.density, rho)[1] if rho < 1 else 0
            macs += k * m + r * (m + n)
            params += m * n + r * (m + n)
        masks = len(group.d_outs) if rho < 1 else 1
        return macs, params, masks * SparsitySpec(density=k / n).index_bits(n)

    def solve(self, weights, stats, pattern):
        n = next(iter(weights.values())).shape[1]
        rho = self.settings.sparse_ratio
        if pattern.density >= 1:
            return SparseActivation(pattern=pattern)
        k = budget(1, n, pattern.density, rho)[0]  # k depends on n only: one count for the group's sites
        kept = SparsitySpec(density=k / n)
        if rho >= 1:  # pure sparse mode: |x| alone, one mask
            return SparseActivation(pattern=kept)
        scales, factors = {}, {}
        for name, W in weights.items():
            scales[name] = W.pow(2).sum(0).sqrt().float()
            _, r = budget(W.shape[0], n, pattern.density, rho)
            if r:
                U, S, Vh = torch.linalg.svd(W, full_matrices=False)
                factors[name] = ((U[:, :r] * S[:r]).float(), Vh[:r].float())
        return SparseActivation(pattern=kept, site_scales=scales, residual_factors=factors or None,
                                extras={"sparse_ratio": rho, "k": k})
