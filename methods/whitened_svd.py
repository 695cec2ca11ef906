"""Whitened SVD (SVD-LLM): F_w = sum_i W_i^T W_i, minimising the output error E||W (x - P x)||^2."""

from dataclasses import dataclass

import torch

from acbench.core.linalg import group_whitening, weighted_subspace

from .base import AuthorsCalibration, Compressor, ONE_PASS, basis_ops, factor_svd_ops, projection_factors, projection_ops


@dataclass(frozen=True)
class WhitenedSVDSettings:
    # True: one subspace per site with that site's own k, as SVD-LLM itself does (to reproduce its numbers)
    per_site: bool = False


class WhitenedSVD(Compressor):
    name = "whitened-svd"
    description = "SVD of W S with S S^T = C (Cholesky whitening), truncated: min E||W(x - Px)||^2"
    needs = frozenset({"C"})
    authors_calibration = AuthorsCalibration(256, 2048, ONE_PASS, "WikiText-2 train windows, seed 3", "SVD-LLM code: --whitening_nsamples 256, --model_seq_len 2048 (whitening from the dense model)")
    Settings = WhitenedSVDSettings

    @property
    def site_wise(self) -> bool:
        return self.settings.per_site

    def solve_ops(self, d_in, d_outs, k, pair_tokens):
        b, ks = basis_ops(d_in), list(k.values()) if isinstance(k, dict) else [k]
        m, k = sum(d_outs), max(ks)
        svds = ([op for d, ki in zip(d_outs, ks) for op in factor_svd_ops(d, d_in, ki)] if self.settings.per_site
                else factor_svd_ops(m, d_in, k))
        # W S, then U = S V and W^T = V^T S^-1 for the k kept directions, then the projection
        return [b["pca_basis"], b["whitening"], ("", "flops", 2 * m * d_in * d_in), *svds,
                ("", "flops", 4 * d_in * d_in * k), *projection_ops(d_in, d_outs, k)]

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
