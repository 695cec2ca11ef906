"""R-Sparse (Zhang et al., ICLR 2025): per weight matrix, the input channels with the largest |x_j| ||W[:, j]|| go
through the matrix's own columns, and every other channel through a low-rank approximation of the whole matrix,
W ~ U_r S_r V_r^T (its truncated SVD, data-free): y = W (m * x) + U_r S_r V_r^T ((1 - m) * x). Each matrix scores
with its own column norms, so each reads its own mask.

The budget follows the authors' code: with density d (the fraction a dense product would keep) and sparse ratio
rho, a matrix of m x n keeps k = floor(n d rho) channels and a rank r = floor((m n d - k m) / (m + n)), so its
multiply-adds per token, k m + r (m + n), are about d m n; rho = 1 is pure sparsity scored by |x_j| alone (no
norms, no branch), as the authors' code does. The whole W stays stored beside the factors (parameters above
dense). Departures: the mask is a top-k per token, not a threshold calibrated to keep k/n on average (the
authors' `kthvalue` over one calibration window); rho is one value for every matrix unless `search=true`.

`search=true` is the authors' search, per input group: rho is chosen from RHO_GRID as the one whose deployed form
reproduces the group's outputs best (least summed squared error over its sites) on a sample of its calibration
inputs (the `tokens` statistic: `--pair-tokens` tokens per group), every rho at the same budget. The authors search
per matrix (1 hour on a GPU; their released Llama-3-8B recipe has rho = 1 for 193 of its 224 matrices); here the
sites of one input group (q, k, v; gate, up) share one rho, since they share one count of kept channels."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from acbench.core.linalg import check_finite
from acbench.core.registry import added_setting
from acbench.core.stats import ONE_PASS, SparsitySpec

from .base import AuthorsCalibration, SparseActivation, SparsityMethod

RHO_GRID = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)  # the sparse ratios the search tries


@dataclass(frozen=True)
class RSparseSettings:
    sparse_ratio: float = 0.95  # rho: the share of the budget spent on kept channels, the rest on the rank
    # rho searched per input group on calibration inputs (the authors' recipe), sparse_ratio then unused
    search: bool = added_setting(False)

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
    # the search's calibration (R-Sparse paper: 16 sequences of 4,096 C4 tokens); plain r-sparse reads none
    authors_calibration = AuthorsCalibration(16, 4096, ONE_PASS, "C4", "R-Sparse paper, its calibration for the "
                                             "search")

    def required_stats(self):
        return frozenset({"tokens"}) if self.settings.search else frozenset()

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
        if pattern.density >= 1:
            return SparseActivation(pattern=pattern)
        errors = None
        if self.settings.search:
            check_finite("r-sparse", tokens=stats.xs)
            errors = search_errors(weights, stats.xs, pattern.density)
            rho = min(errors, key=errors.get)
        else:
            rho = self.settings.sparse_ratio
        found = self._solve(weights, pattern, n, rho)
        if errors is not None:
            found.extras["searched"] = {f"{r:g}": e for r, e in errors.items()}
        return found

    def _solve(self, weights, pattern, n: int, rho: float) -> SparseActivation:
        k = budget(1, n, pattern.density, rho)[0]  # k depends on n only: one count for the group's sites
        kept = SparsitySpec(density=k / n)
        if rho >= 1:  # pure sparse mode: |x| alone, one mask
            return SparseActivation(pattern=kept, extras={"sparse_ratio": rho, "k": k})
        scales, factors = {}, {}
        for name, W in weights.items():
            scales[name] = W.pow(2).sum(0).sqrt().float()
            _, r = budget(W.shape[0], n, pattern.density, rho)
            if r:
                U, S, Vh = torch.linalg.svd(W, full_matrices=False)
                factors[name] = ((U[:, :r] * S[:r]).float(), Vh[:r].float())
        return SparseActivation(pattern=kept, site_scales=scales, residual_factors=factors or None,
                                extras={"sparse_ratio": rho, "k": k})


def deployed_output(W: torch.Tensor, svd, x: torch.Tensor, density: float, rho: float) -> torch.Tensor:
    """What the deployed form computes for inputs x (N, n): the kept channels through W, the rest through W's
    rank-r SVD (`svd`: U, S, Vh of W; rho < 1, channels scored by |x_j| ||W[:, j]||), or the top |x_j| alone
    (rho = 1)."""
    m, n = W.shape
    k, r = budget(m, n, density, rho)
    score = x.abs() if rho >= 1 else x.abs() * W.pow(2).sum(0).sqrt()
    keep = torch.zeros_like(x, dtype=torch.bool).scatter_(1, score.topk(k, dim=1).indices, True)
    out = (x * keep) @ W.T
    if rho < 1 and r:
        U, S, Vh = svd
        out = out + ((x * ~keep) @ Vh[:r].T) @ (U[:, :r] * S[:r]).T
    return out


def search_errors(weights: dict, xs: torch.Tensor, density: float) -> dict[float, float]:
    """Per rho of RHO_GRID, the group's summed squared output error of the deployed form over the sampled inputs
    (float64; each site's SVD taken once)."""
    x = xs.double()
    sites = [(W.double(), torch.linalg.svd(W.double(), full_matrices=False)) for W in weights.values()]
    return {rho: sum(float((x @ W.T - deployed_output(W, svd, x, density, rho)).pow(2).sum()) for W, svd in sites)
            for rho in RHO_GRID}
