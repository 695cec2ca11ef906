"""Float64 factorisations with trace-relative damping; every fallback is returned, never silent."""

from __future__ import annotations

import torch

BASE_EPS = 1e-6
MAX_EPS = 1e-1


class NumericError(ValueError):
    """Statistics that cannot be used (NaN / inf)."""


def check_finite(where: str, **tensors: torch.Tensor | None) -> None:
    for name, t in tensors.items():
        if t is not None and not torch.isfinite(t).all():
            raise NumericError(
                f"non-finite {name} statistics in {where}: recalibrate in float32 (--dtype float32) "
                "or with fewer/shorter calibration windows"
            )


def damp(C: torch.Tensor, eps: float) -> torch.Tensor:
    d = C.shape[0]
    scale = torch.trace(C) / d
    if scale <= 0:
        scale = torch.ones((), dtype=C.dtype, device=C.device)
    return C + eps * scale * torch.eye(d, dtype=C.dtype, device=C.device)


def tiny(dtype: torch.dtype) -> float:
    """The floor a divisor is clamped to: 1e-300 in float64 (as always), the smallest normal number in float32."""
    return 1e-300 if dtype == torch.float64 else torch.finfo(dtype).tiny


def rank_tolerance(dtype: torch.dtype, d: int) -> float:
    """Eigenvalues below this fraction of the largest count as zero: 1e-10 in float64; in float32 a computed
    eigenvalue carries round-off near eps * d of the largest, so the threshold rises to that (the same rank is
    reported in both precisions wherever the gap in the spectrum is wider than float32's round-off)."""
    return max(1e-10, torch.finfo(dtype).eps * d)


def whitening_factor(C: torch.Tensor, eps: float = BASE_EPS, evals: torch.Tensor | None = None,
                     dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor, list[dict]]:
    """S with S S^T = C + damping, and S^{-1}, in `dtype`. Cholesky first; escalate damping; eigh as the last resort.

    `evals`, C's eigenvalues when already known, spare the decomposition the rank check needs.
    """
    C = C.to(dtype)
    C = 0.5 * (C + C.T)
    fallbacks: list[dict] = []
    if evals is None:
        evals = torch.linalg.eigvalsh(C)
    top = evals.max().clamp_min(tiny(dtype))
    rank = int((evals > top * rank_tolerance(dtype, C.shape[0])).sum())
    if rank < C.shape[0]:
        fallbacks.append(
            {"op": "whiten", "kind": "rank-deficient", "rank": rank, "d": C.shape[0],
             "note": f"C has numerical rank {rank} < d; directions outside its range are set by damping eps={eps:g}"}
        )
    e = eps
    while e <= MAX_EPS:
        L, info = torch.linalg.cholesky_ex(damp(C, e))
        if int(info) == 0:
            if e != eps:
                fallbacks.append({"op": "cholesky", "kind": "damping-escalated", "eps": e})
            Linv = torch.linalg.solve_triangular(L, torch.eye(L.shape[0], dtype=L.dtype, device=L.device),
                                                  upper=False)
            return L, Linv, fallbacks
        e *= 10
    # Cholesky failed at every damping: symmetric square root from eigh, eigenvalues clamped.
    w, U = torch.linalg.eigh(damp(C, eps))
    floor = eps * (torch.trace(C) / C.shape[0]).clamp_min(tiny(dtype))
    w = w.clamp_min(floor)
    fallbacks.append({"op": "cholesky", "kind": "eigh-fallback", "eps": eps})
    return U * w.sqrt(), (U / w.sqrt()).T, fallbacks


def sorted_eigh(M: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigenvalues descending, with eigenvectors as columns."""
    w, V = torch.linalg.eigh(0.5 * (M + M.T))
    return w.flip(0), V.flip(1)


def gram_eigh(M: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """M's squared singular values (descending, n of them) and right singular vectors (columns), from the
    eigendecomposition of M^T M (n x n): 2-3x faster than the SVD at the weight and whitened-weight shapes here,
    float64 only. On Gemma-3-270m it reproduced the SVD's deployed products to 1e-13 (weights, ASVD-scaled at
    condition number 3.5e7) and 2.4e-11 (W S, condition number 1.8e5) relative; float32's round-off cannot carry
    the squared condition number, so callers take the SVD there."""
    lam, V = sorted_eigh(M.T @ M)
    return lam.clamp_min(0), V


def weighted_subspace(
    C: torch.Tensor,
    F: torch.Tensor | None = None,
    F_factor: torch.Tensor | None = None,
    eps: float = BASE_EPS,
    whitening: tuple | None = None,
    keep: int | None = None,
) -> dict:
    """Solve min_P tr((I-P)^T F (I-P) C) over rank-k projections, for every k at once.

    With S S^T = C: the eigenvectors v_j of S^T F S (descending lambda_j) give u_j = S v_j and
    w_j^T = v_j^T S^{-1}; keeping the first k gives P = U_k W_k^T, the exact optimum. F = I when
    neither F nor F_factor (F = R^T R, solved by SVD of R S for accuracy) is given. `keep`: only the first `keep`
    columns of U and rows of W^T are formed (a method that deploys one k; the d x d products are most of its cost).
    Solved in the whitening factor's dtype (float64 unless a float32 one is passed).
    """
    S, Sinv, fallbacks = whitening if whitening is not None else whitening_factor(C, eps)
    fallbacks = list(fallbacks)
    dtype = S.dtype
    if F_factor is not None:
        R = F_factor.to(dtype) @ S
        m, d = R.shape
        lam = torch.zeros(d, dtype=dtype, device=S.device)
        if m >= d and dtype == torch.float64:
            lam[:], V = gram_eigh(R)
        else:
            # V must be square unless only directions inside R's row space are kept: the thin SVD's, completed
            # by the full SVD otherwise
            _, sig, Vh = torch.linalg.svd(R, full_matrices=m < d and (keep is None or keep > m))
            lam[: sig.numel()] = sig**2
            V = Vh.T
    else:
        Fm = torch.eye(S.shape[0], dtype=dtype, device=S.device) if F is None else F.to(dtype)
        lam, V = sorted_eigh(S.T @ Fm @ S)
    if keep is not None:
        V = V[:, :keep]
    U = S @ V  # columns u_j
    Wt = V.T @ Sinv  # rows w_j^T
    return {"lam": lam, "U": U, "Wt": Wt, "fallbacks": fallbacks}


def group_whitening(stats) -> tuple:
    """The group's whitening factor, computed once and shared by every method that needs it. Its rank check
    reuses the eigenvalues of C from pca_basis (one decomposition of C per group, not two, in a sweep)."""
    return stats.cached("whitening", lambda: whitening_factor(stats.C, evals=pca_basis(stats)["lam"],
                                                              dtype=stats.solve_dtype))


def fisher_basis(stats) -> dict:
    """The K-FAC solution F C b = lambda b (fasc-kfac's basis); lam_j is the surrogate loss rise of discarding
    direction j, which rank allocation compares across groups."""

    def solve():
        check_finite("fasc", C=stats.C, F=stats.F)
        return weighted_subspace(stats.C, F=stats.F, whitening=group_whitening(stats))

    return stats.cached("fisher_basis", solve)


def pca_basis(stats) -> dict:
    """F_w = I needs no whitening: the eigenvectors of C itself (orthonormal, so U = V and W^T = V^T)."""

    def solve():
        check_finite("the group", C=stats.C)
        lam, V = sorted_eigh(stats.C.to(stats.solve_dtype))
        return {"lam": lam, "U": V, "Wt": V.T, "fallbacks": []}

    return stats.cached("pca_basis", solve)


def direction_scores(sol: dict, xs: torch.Tensor, gs: torch.Tensor) -> torch.Tensor:
    """z[n, j] = (g_n^T u_j)(w_j^T x_n): the share of direction j in token n's loss change."""
    dtype = sol["U"].dtype
    return (gs.to(dtype) @ sol["U"]) * (xs.to(dtype) @ sol["Wt"].T)


def fisher_scores(stats) -> torch.Tensor:
    """direction_scores on fasc-kfac's basis for the group's token sample, memoised (N x d): fasc's swap search and
    the rho analysis's surrogate read the same scores."""
    return stats.cached("fisher_scores", lambda: direction_scores(fisher_basis(stats), stats.xs, stats.gs))
