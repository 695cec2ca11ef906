"""Plain truncated SVD of each site's weight (data-free)."""

import torch

from .base import Compressor, site_svd_ops


def truncated_factors(M: torch.Tensor, k: int):
    """M ~= (U_k S^1/2)(S^1/2 V_k^T)."""
    U, sig, Vh = torch.linalg.svd(M, full_matrices=False)
    r = sig[:k].sqrt()
    return U[:, :k] * r, r[:, None] * Vh[:k]


class SVD(Compressor):
    name = "svd"
    description = "truncated SVD of each weight W_i (data-free)"
    per_site = True

    def solve_ops(self, d_in, d_outs, k, pair_tokens):
        return site_svd_ops(d_in, d_outs)

    def solve(self, weights, stats, k):
        return {n: truncated_factors(W, k[n]) for n, W in weights.items()}, False, [], {}
