"""FASC: Fisher-aligned subspace compression (a reconstruction; see README "What FASC computes here").

`fasc-kfac` keeps the top-k eigen-directions of C^1/2 F C^1/2, the exact minimiser of the K-FAC surrogate
tr((I-P)^T F (I-P) C). `fasc` starts from that choice and swaps directions to minimise the per-token surrogate
E[(g^T (I-P) x)^2] = 1_D^T Q 1_D measured on the (x, g) token sample, so it never does worse on that sample.
"""

from dataclasses import dataclass

import torch

from bench.linalg import check_finite, group_whitening, weighted_subspace

from .base import Compressor, projection_factors


def direction_scores(sol: dict, xs: torch.Tensor, gs: torch.Tensor) -> torch.Tensor:
    """z[n, j] = (g_n^T u_j)(w_j^T x_n): the share of direction j in token n's loss change."""
    return (gs.double() @ sol["U"]) * (xs.double() @ sol["Wt"].T)


def coupled_selection(Q: torch.Tensor, discard: torch.Tensor, max_swaps: int) -> tuple[torch.Tensor, int]:
    """Greedy best-improvement swaps between the discard set D and the kept set, minimising 1_D^T Q 1_D."""
    d = Q.shape[0]
    in_D = torch.zeros(d, dtype=torch.bool)
    in_D[discard] = True
    if in_D.all() or not in_D.any():
        return in_D, 0
    r = Q[:, in_D].sum(1)  # r_a = sum_{b in D} Q_ab
    diag = Q.diagonal()
    scale = Q.diagonal().abs().sum().clamp_min(1e-300)
    swaps = 0
    while swaps < max_swaps:
        D, K = in_D.nonzero().squeeze(1), (~in_D).nonzero().squeeze(1)
        # f(D - i + j) - f(D) = -2 r_i + Q_ii + 2 r_j + Q_jj - 2 Q_ij
        delta = (-2 * r[D] + diag[D])[:, None] + (2 * r[K] + diag[K])[None, :] - 2 * Q[D][:, K]
        best = int(delta.argmin())
        if delta.view(-1)[best] >= -1e-12 * scale:
            break
        i, j = int(D[best // K.numel()]), int(K[best % K.numel()])
        in_D[i], in_D[j] = False, True
        r += Q[:, j] - Q[:, i]
        swaps += 1
    return in_D, swaps


@dataclass(frozen=True)
class FASCSettings:
    max_swaps: int = 512


class FASCKFAC(Compressor):
    name = "fasc-kfac"
    description = "top-k eigenvectors of C^1/2 F C^1/2 (F C b = lambda b), F = E[g g^T]: min tr((I-P)^T F (I-P) C)"
    stats = frozenset({"C", "F"})

    def _basis(self, stats):
        check_finite("fasc", C=stats.C, F=stats.F)
        return stats.cached("fisher_basis", lambda: weighted_subspace(stats.C, F=stats.F, whitening=group_whitening(stats)))

    def solve(self, weights, stats, k):
        sol = self._basis(stats)
        extras = {"surrogate_kfac": float(sol["lam"][k:].sum())}
        return projection_factors(weights, sol["U"][:, :k], sol["Wt"][:k]), True, sol["fallbacks"], extras


class FASC(FASCKFAC):
    name = "fasc"
    description = "fasc-kfac's basis, discarded set chosen by swaps to minimise E[(g^T (I-P) x)^2] on sampled tokens"
    stats = frozenset({"C", "F", "pairs"})
    Settings = FASCSettings

    def solve(self, weights, stats, k):
        sol = self._basis(stats)
        d = sol["U"].shape[0]
        check_finite("fasc", xs=stats.xs, gs=stats.gs)
        z = direction_scores(sol, stats.xs, stats.gs)
        Q = z.T @ z / z.shape[0]
        kfac_discard = torch.arange(k, d)
        in_D, swaps = coupled_selection(Q, kfac_discard, self.settings.max_swaps)
        keep = (~in_D).nonzero().squeeze(1)
        ones_kfac = torch.zeros(d, dtype=torch.float64)
        ones_kfac[kfac_discard] = 1
        ones = in_D.double()
        extras = {
            "surrogate_kfac": float(sol["lam"][in_D].sum()),
            "surrogate_tokens": float(ones @ Q @ ones),
            "surrogate_tokens_kfac_choice": float(ones_kfac @ Q @ ones_kfac),
            "swaps": swaps,
            "pair_tokens": int(z.shape[0]),
        }
        return projection_factors(weights, sol["U"][:, keep], sol["Wt"][keep]), True, sol["fallbacks"], extras
