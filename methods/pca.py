"""Activation PCA (ESPACE-MSE): keep the top-variance directions of the group input; F_w = I."""

from core.linalg import pca_basis

from .base import Compressor, projection_factors


class PCA(Compressor):
    name = "pca"
    description = "top-k eigenvectors of C = E[x x^T] (min E||x - Px||^2)"
    needs = frozenset({"C"})

    def solve(self, weights, stats, k):
        sol = pca_basis(stats)
        return projection_factors(weights, sol["U"][:, :k], sol["Wt"][:k]), True, sol["fallbacks"], {}
