"""ESPACE NL-MSE: orthogonal projection on the top eigenvectors of C F + F C (a bound on the loss error)."""

from acbench.core.linalg import check_finite, sorted_eigh, tiny

from .base import Compressor, projection_factors, projection_ops


class EspaceNL(Compressor):
    name = "espace-nl"
    description = "top-k eigenvectors of C F + F C (ESPACE NL-MSE)"
    needs = frozenset({"C", "F"})

    def solve_ops(self, d_in, d_outs, k, pair_tokens):
        return [("", "flops", 4 * d_in ** 3), ("", "eigh", d_in), *projection_ops(d_in, d_outs, k)]

    def solve(self, weights, stats, k):
        C, F = stats.C.to(stats.solve_dtype), stats.F.to(stats.solve_dtype)
        check_finite("espace-nl", C=C, F=F)
        # Normalise both factors so neither scale dominates the symmetrised product.
        floor = tiny(C.dtype)
        C, F = C / C.trace().clamp_min(floor), F / F.trace().clamp_min(floor)
        CF = C @ F
        _, V = sorted_eigh(CF + CF.T)  # F C = (C F)^T for symmetric C and F: one product, not two
        Vk = V[:, :k]
        return projection_factors(weights, Vk, Vk.T), True, [], {}
