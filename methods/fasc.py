"""FASC: Fisher-aligned subspace compression (a reconstruction; docs/methods.md says what is computed).

`fasc-kfac` keeps the top-k eigen-directions of C^1/2 F C^1/2, the exact minimiser of the K-FAC surrogate
tr((I-P)^T F (I-P) C). `fasc` starts from that choice and swaps directions to minimise the per-token surrogate
E[(g^T (I-P) x)^2] = 1_D^T Q 1_D measured on the (x, g) token sample, keeping only as many swaps as K-fold
cross-validation on that sample says lower the surrogate on held-out tokens (docs/design.md, section 4).
"""

from dataclasses import dataclass

import torch

from acbench.core.linalg import check_finite, fisher_basis, fisher_scores, tiny

from .base import Compressor, basis_ops, projection_factors, projection_ops


def swap_path(Q: torch.Tensor, discard: torch.Tensor, max_swaps: int) -> list[tuple[int, int]]:
    """Greedy best-improvement swaps (i leaves the discard set D, j enters it) minimising 1_D^T Q 1_D.

    The D x K block of -2 Q is kept in slot order and a swap rewrites one row and one column of it, instead of
    gathering the block again per swap (that gather was most of fasc's compress time at d = 2048). Ties go to the
    smallest i, then the smallest j: the pair a scan of D and K in index order finds first."""
    d = Q.shape[0]
    in_D = torch.zeros(d, dtype=torch.bool, device=Q.device)
    in_D[discard] = True
    if in_D.all() or not in_D.any():
        return []
    r = Q[:, in_D].sum(1)  # r_a = sum_{b in D} Q_ab
    diag = Q.diagonal()
    scale = diag.abs().sum().clamp_min(tiny(Q.dtype))
    D, K = in_D.nonzero().squeeze(1), (~in_D).nonzero().squeeze(1)
    # -2 Q is exact (a power of two): the sum below equals the unfused -2 r_i + ... - 2 Q_ij bit for bit
    block = -2 * Q[D][:, K]
    delta = torch.empty_like(block)
    path = []
    while len(path) < max_swaps:
        # f(D - i + j) - f(D) = -2 r_i + Q_ii + 2 r_j + Q_jj - 2 Q_ij
        torch.add((diag[D] - 2 * r[D])[:, None], (2 * r[K] + diag[K])[None, :], out=delta)
        delta += block
        row_low = delta.amin(1)  # a row-wise reduction, several times faster here than a flat argmin
        low = row_low.min()
        if low >= -_improvement(Q.dtype) * scale:
            break
        p, q = _first_minimum(delta, row_low, low, D, K, d)
        i, j = int(D[p]), int(K[q])
        D[p], K[q] = j, i
        block[p, :] = -2 * Q[j, K]
        block[:, q] = -2 * Q[D, i]
        r += Q[:, j] - Q[:, i]
        path.append((i, j))
    return path


def _improvement(dtype: torch.dtype) -> float:
    """The least swap gain, relative to tr Q, the search takes: 1e-12 in float64; in float32, some multiple of its
    round-off, so that no swap is taken on rounding noise alone."""
    return max(1e-12, 64 * torch.finfo(dtype).eps)


def _first_minimum(delta, row_low, low, D, K, d) -> tuple[int, int]:
    """The slot (p, q) of the minimum whose (D[p], K[q]) comes first in index order (several can tie)."""
    best = None
    for p in (row_low == low).nonzero().squeeze(1).tolist():
        q = (delta[p] == low).nonzero().squeeze(1)
        q = int(q[torch.argmin(K[q])])
        key = int(D[p]) * d + int(K[q])
        if best is None or key < best[0]:
            best = (key, p, q)
    return best[1], best[2]


def path_values(Q: torch.Tensor, discard: torch.Tensor, path: list[tuple[int, int]]) -> torch.Tensor:
    """1_D^T Q 1_D after 0, 1, ..., len(path) swaps of a path (Q may be another sample's than the path's)."""
    in_D = torch.zeros(Q.shape[0], dtype=torch.bool, device=Q.device)
    in_D[discard] = True
    ones = in_D.to(Q.dtype)
    r = Q @ ones
    f = float(ones @ r)
    out = [f]
    for i, j in path:
        f += float(-2 * r[i] + Q[i, i] + 2 * r[j] + Q[j, j] - 2 * Q[i, j])
        r += Q[:, j] - Q[:, i]
        out.append(f)
    return torch.tensor(out, dtype=Q.dtype, device=Q.device)


def coupled_selection(Q: torch.Tensor, discard: torch.Tensor, max_swaps: int) -> tuple[torch.Tensor, int]:
    """The discard set after the full in-sample swap search (no validation): never worse than the start on Q."""
    path = swap_path(Q, discard, max_swaps)
    return _apply(Q.shape[0], discard, path), len(path)


def _apply(d: int, discard: torch.Tensor, path: list[tuple[int, int]]) -> torch.Tensor:
    in_D = torch.zeros(d, dtype=torch.bool, device=discard.device)
    in_D[discard] = True
    for i, j in path:
        in_D[i], in_D[j] = False, True
    return in_D


def cross_validated_swaps(z: torch.Tensor, discard: torch.Tensor, max_swaps: int, folds: int,
                          seed: int = 0, gram: torch.Tensor | None = None) -> dict:
    """How many of the greedy swaps generalise: K-fold cross-validation of the path length.

    Each fold's swap path is fitted on the other folds' tokens and scored on the fold's own tokens, relative to the
    K-FAC choice. A number of swaps qualifies only if it lowers the held-out surrogate in every fold; among those
    (and 0) the one with the lowest mean held-out surrogate is taken along the path fitted on all tokens. Where
    K-FAC already ranks the directions right, swaps fitted on N tokens fit the noise of Q's d^2/2 entries, some
    fold disagrees and the answer is 0 swaps (fasc = fasc-kfac); where activations and gradients are coupled per
    direction, the held-out gain survives in every fold and is kept. (Taking the plain minimum of the mean curve
    let one lucky fold carry the choice: +1.6 % held-out vs fasc-kfac on synthetic data where K-FAC is right.)
    """
    n = z.shape[0]
    # folds drawn on the CPU, then moved: the same folds whatever device solves
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed), device="cpu")
    fold_of = torch.empty(n, dtype=torch.long, device="cpu")
    fold_of[perm] = torch.arange(n, device="cpu") % folds
    fold_of = fold_of.to(z.device)
    gram = z.T @ z if gram is None else gram
    curves = []
    for f in range(folds):
        # the fitting folds' Gram is the whole sample's less the held-out fold's: one Gram per fold, not two
        val = z[fold_of == f]
        held = val.T @ val
        path = swap_path((gram - held) / (n - len(val)), discard, max_swaps)
        v = path_values(held / len(val), discard, path)
        v = v / v[0].clamp_min(tiny(v.dtype))
        curves.append(torch.cat([v, v[-1].repeat(max_swaps + 1 - len(v))]))
    curves = torch.stack(curves)
    mean = curves.mean(0)
    agreed = (curves < 1).all(0)
    agreed[0] = True
    best = int(mean.masked_fill(~agreed, float("inf")).argmin())
    return {"swaps": best, "heldout_ratio": float(mean[best]), "curve": mean}


@dataclass(frozen=True)
class FASCSettings:
    max_swaps: int = 512
    # Cross-validation folds that decide how many swaps generalise beyond the (x, g) sample; 1 switches the
    # validation off (the unconstrained in-sample search, which fits noise: docs/design.md, section 4).
    folds: int = 4

    def minimums(self):
        return {"folds": (self.folds, 1)}


class FASCKFAC(Compressor):
    name = "fasc-kfac"
    description = "top-k eigenvectors of C^1/2 F C^1/2 (F C b = lambda b), F = E[g g^T]: min tr((I-P)^T F (I-P) C)"
    needs = frozenset({"C", "F"})

    def solve_ops(self, d_in, d_outs, k, pair_tokens):
        return [*basis_ops(d_in).values(), *projection_ops(d_in, d_outs, k)]

    def solve(self, weights, stats, k):
        sol = fisher_basis(stats)
        extras = {"surrogate_kfac": float(sol["lam"][k:].sum())}
        return projection_factors(weights, sol["U"][:, :k], sol["Wt"][:k]), True, sol["fallbacks"], extras


class FASC(FASCKFAC):
    name = "fasc"
    description = "fasc-kfac's basis, discarded set chosen by swaps to minimise E[(g^T (I-P) x)^2] on sampled tokens"
    needs = frozenset({"C", "F", "pairs"})
    Settings = FASCSettings

    def solve_ops(self, d_in, d_outs, k, pair_tokens):
        n, kept, dropped = pair_tokens, k, d_in - k
        # the scores z (two N x d x d products, memoised), the Gram and the folds' Grams, and the swap search: about
        # 50 swaps per path (24-53 measured per group on Gemma-3-270m), 1 + folds paths, 4 passes over the D x K block
        return [*super().solve_ops(d_in, d_outs, k, pair_tokens), ("fisher_scores", "flops", 4 * n * d_in * d_in),
                ("", "flops", 4 * n * d_in * d_in), ("", "bytes", (1 + self.settings.folds) * 50 * 4 * 8 * kept * dropped)]

    def solve(self, weights, stats, k):
        sol = fisher_basis(stats)
        d = sol["U"].shape[0]
        s = self.settings

        def select():
            check_finite("fasc", xs=stats.xs, gs=stats.gs)
            return select_discard(fisher_scores(stats), torch.arange(k, d, device=sol["U"].device), s.max_swaps,
                                  s.folds)

        # memoised per group, k and settings: the rho analysis compresses block ranges with fasc at the run's rank
        in_D, extras = stats.cached(f"fasc_discard:{k}:{s.max_swaps}:{s.folds}", select)
        keep = (~in_D).nonzero().squeeze(1)
        extras = {"surrogate_kfac": float(sol["lam"][in_D].sum()), **extras}
        return projection_factors(weights, sol["U"][:, keep], sol["Wt"][keep]), True, sol["fallbacks"], extras


def select_discard(z: torch.Tensor, kfac_discard: torch.Tensor, max_swaps: int, folds: int) -> tuple[torch.Tensor, dict]:
    """The discard set: K-FAC's, improved by as many in-sample swaps as cross-validation says generalise.
    Records the in-sample surrogate of both choices and the cross-validated (held-out) one relative to K-FAC."""
    d = z.shape[1]
    gram = z.T @ z
    Q = gram / z.shape[0]
    path = swap_path(Q, kfac_discard, max_swaps)
    extras = {"swaps_in_sample": len(path), "pair_tokens": int(z.shape[0]), "folds": folds}
    n_swaps = len(path)
    if folds > 1 and path:
        # Only the first len(path) swaps can be applied, so the folds' paths need go no further (this bounds the
        # cost by the in-sample path, 24-53 swaps per group on Gemma-3-270m, instead of max_swaps).
        cv = cross_validated_swaps(z, kfac_discard, len(path), folds, gram=gram)
        n_swaps = min(cv["swaps"], len(path))
        extras["surrogate_heldout_ratio"] = cv["heldout_ratio"]  # held-out surrogate / K-FAC's, at the chosen swaps
        extras["surrogate_heldout_ratio_all_swaps"] = float(cv["curve"][len(path)])
    in_D = _apply(d, kfac_discard, path[:n_swaps])
    ones, ones_kfac = in_D.to(Q.dtype), _apply(d, kfac_discard, []).to(Q.dtype)
    extras.update(swaps=n_swaps, surrogate_tokens=float(ones @ Q @ ones),
                  surrogate_tokens_kfac_choice=float(ones_kfac @ Q @ ones_kfac))
    return in_D, extras
