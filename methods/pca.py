"""Activation PCA (ESPACE-MSE): keep the top-variance directions of the group input; F_w = I. Written as one
decorated function (methods/from_function.py), the short form a new method can start from."""

from acbench.core.linalg import pca_basis

from .base import basis_ops
from .from_function import Basis, low_rank_method


@low_rank_method("pca", needs={"C"}, description="top-k eigenvectors of C = E[x x^T] (min E||x - Px||^2)",
                 solve_ops=lambda d_in, d_outs, k: [basis_ops(d_in)["pca_basis"]])
def PCA(stats, k):
    sol = pca_basis(stats)
    return Basis(sol["U"][:, :k], sol["Wt"][:k], sol["fallbacks"])
