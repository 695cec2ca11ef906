"""Activation PCA (ESPACE-MSE): keep the top-variance directions of the group input; F_w = I."""

from core.linalg import pca_basis

from .base import Compressor, basis_ops, projection_factors, projection_ops


class PCA(Compressor):
    name = "pca"
    description = "top-k eigenvectors of C = E[x x^T] (min E||x - Px||^2)"
    needs = frozenset({"C"})

    def solve_ops(self, d_in, d_outs, k, pair_tokens):
        return [basis_ops(d_in)["pca_basis"], *projection_ops(d_in, d_outs, k)]

    def solve(self, weights, stats, k):
        sol = pca_basis(stats)
        return projection_factors(weights, sol["U"][:, :k], sol["Wt"][:k]), True, sol["fallbacks"], {}
