"""Whitened SVD (SVD-LLM): F_w = sum_i W_i^T W_i, minimising the output error E||W (x - P x)||^2."""

from dataclasses import dataclass

import torch

from core.linalg import group_whitening, weighted_subspace

from .base import Compressor, projection_factors


@dataclass(frozen=True)
class WhitenedSVDSettings:
    # True: one subspace per site with that site's own k, as SVD-LLM itself does (to reproduce its numbers)
    per_site: bool = False


class WhitenedSVD(Compressor):
    name = "whitened-svd"
    description = "SVD of W S with S S^T = C (Cholesky whitening), truncated: min E||W(x - Px)||^2"
    needs = frozenset({"C"})
    Settings = WhitenedSVDSettings

    @property
    def site_wise(self) -> bool:
        return self.settings.per_site

    def solve(self, weights, stats, k):
        if not self.settings.per_site:
            W = torch.cat(list(weights.values()), dim=0)
            sol = weighted_subspace(stats.C, F_factor=W, whitening=group_whitening(stats), keep=k)
            return projection_factors(weights, sol["U"][:, :k], sol["Wt"][:k]), True, sol["fallbacks"], {}
        factors, fallbacks = {}, []
        for n, W in weights.items():
            sol = weighted_subspace(stats.C, F_factor=W, whitening=group_whitening(stats), keep=k[n])
            factors[n] = (W @ sol["U"][:, :k[n]], sol["Wt"][:k[n]])
            fallbacks = sol["fallbacks"]
        return factors, False, fallbacks, {}
