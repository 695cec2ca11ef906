"""Plain truncated SVD of each site's weight (data-free)."""

import torch

from acbench.core.linalg import gram_eigh, tiny

from .base import Compressor, site_svd_ops


def truncated_factors(M: torch.Tensor, k: int):
    """M ~= (U_k S^1/2)(S^1/2 V_k^T), the rank-k truncated SVD: in float64 from the smaller Gram's eigenvectors
    (acbench.core.linalg.gram_eigh; the 126 site weights of Gemma-3-270m took 23 s by SVD), in float32 by the SVD."""
    if M.dtype != torch.float64:
        U, sig, Vh = torch.linalg.svd(M, full_matrices=False)
        r = sig[:k].sqrt()
        return U[:, :k] * r, r[:, None] * Vh[:k]
    tall = M.shape[0] >= M.shape[1]
    lam, E = gram_eigh(M if tall else M.T)
    E, r = E[:, :k], lam[:k].pow(0.25)  # r = sigma^1/2
    # a zero singular value (rank below k) contributes nothing either way: its direction is kept unscaled
    r = torch.where(r > 0, r, torch.ones_like(r))
    return ((M @ E) / r, r[:, None] * E.T) if tall else (E * r, (E.T @ M) / r[:, None])


def scaled_truncated_factors(W: torch.Tensor, k: int, inputs: torch.Tensor | None = None,
                             outputs: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The rank-k truncated SVD of diag(outputs) W diag(inputs), the scalings undone on the factors: W ~= A B with
    A = diag(outputs)^-1 U S^1/2 and B = S^1/2 V^T diag(inputs)^-1. The core of the weighted SVDs (asvd scales
    the inputs by E|x|^alpha, fwsvd the outputs by the row Fisher); the scalings must be positive (see `floored`)."""
    M = W if inputs is None else W * inputs
    M = M if outputs is None else outputs[:, None] * M
    A, B = truncated_factors(M, k)
    return (A if outputs is None else A / outputs[:, None]), (B if inputs is None else B / inputs)


def floored(v: torch.Tensor, op: str, kind: str, unit: str, fallbacks: list, rel: float = 1e-6) -> torch.Tensor:
    """v with every entry below rel * mean(v) raised to it, so a dead channel's scaling can be undone; where the
    floor bites, a fallback record {"op", "kind", unit: how many} is appended to `fallbacks` (stored in the
    result, counted in the leaderboard). All zero (a site whose output no gradient reaches: Doge's dt_proj feeds a
    top-k mask), there is nothing to weigh by: every entry is 1, the plain SVD, recorded as such."""
    if not bool((v > 0).any()):
        fallbacks.append({"op": op, "kind": f"{kind}: all zero, unweighted", unit: int(v.numel())})
        return torch.ones_like(v)
    floor = rel * v.mean().clamp_min(tiny(v.dtype))
    low = v < floor
    if low.any():
        fallbacks.append({"op": op, "kind": kind, unit: int(low.sum())})
    return v.clamp_min(floor)


class SVD(Compressor):
    name = "svd"
    description = "truncated SVD of each weight W_i (data-free)"
    per_site = True

    def solve_ops(self, d_in, d_outs, k, pair_tokens):
        return site_svd_ops(d_in, d_outs)

    def solve(self, weights, stats, k):
        return {n: truncated_factors(W, k[n]) for n, W in weights.items()}, False, [], {}
