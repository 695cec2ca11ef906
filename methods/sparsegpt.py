"""SparseGPT (Frantar and Alistarh, 2023), the second weight-pruning control beside Wanda: prune each site's weights
column by column and, for every weight pruned, move its error onto the columns not yet visited by the optimal brain
surgeon update under H = C, the group input's second moment (the objective is ||W X - W' X||^2).

The inverse Hessian of the columns still to visit is read off the upper Cholesky factor U of H^-1 (row j of U is
[H_F^-1]_j,F / sqrt([H_F^-1]_jj) for F the columns from j on), so one factorisation serves every column. Following
the authors' code: H damped by `damping` times its mean diagonal, inputs that never fire (H_jj = 0) get H_jj = 1 and
their weights pruned first, columns visited in blocks of `block_size` whose errors reach the later blocks at once,
and the mask chosen with the updated weights: per block jointly over rows and the block's columns (unstructured, by
w^2 / U_jj^2), or per row within each M columns (N:M). H comes from the dense model's calibration, as Wanda's scale
does here; the authors' script recomputes it block by block on the partly pruned model (docs/sparsity.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from acbench.core.linalg import NumericError, check_finite

from .base import AuthorsCalibration, MaskedWeights, SEQUENTIAL, SparsityMethod


@dataclass(frozen=True)
class SparseGPTSettings:
    damping: float = 0.01  # the authors' percdamp: lambda = damping * mean(diag H)
    block_size: int = 128  # columns per lazy-update block (rounded up to a multiple of M under an N:M pattern)

    def __post_init__(self):
        if isinstance(self.damping, bool) or not isinstance(self.damping, (int, float)) \
                or not (math.isfinite(self.damping) and 0 < self.damping < 1):
            raise ValueError(f"sparsegpt damping {self.damping!r} is not a number in (0, 1): the authors use 0.01")
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(f"sparsegpt block_size {self.block_size!r} is not a positive whole number: the authors "
                             "use 128")


def inverse_hessian_factor(H: torch.Tensor, damping: float) -> tuple[torch.Tensor, torch.Tensor, list[dict]]:
    """(U, dead, fallbacks): the upper Cholesky factor of (H + damping * mean(diag H) I)^-1, with every input that
    never fires given H_jj = 1 (its weights are pruned as a whole), and the mask of those inputs. Where a
    factorisation fails the damping is raised tenfold (at most to 1) and the fallback recorded."""
    H = H.clone()
    dead = torch.diagonal(H) == 0
    H[dead, dead] = 1.0
    eye = torch.eye(H.shape[0], dtype=H.dtype, device=H.device)
    fallbacks, asked = [], damping
    while True:
        try:
            Hinv = torch.cholesky_inverse(torch.linalg.cholesky(H + damping * torch.diagonal(H).mean() * eye))
            U = torch.linalg.cholesky(Hinv, upper=True)
            if damping != asked:
                fallbacks.append({"fallback": "sparsegpt damping raised", "damping": damping, "asked": asked})
            return U, dead, fallbacks
        except torch.linalg.LinAlgError:
            if damping >= 1:
                raise NumericError("sparsegpt: H = E[x x^T] stays singular with damping 1: recalibrate on more "
                                   "tokens") from None
            damping = min(1.0, damping * 10)


def prune_site(W: torch.Tensor, U: torch.Tensor, keep: int, m: int, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(updated weight with its pruned entries zero, kept mask) of one d_out x d_in weight: N:M (`keep` of every
    `m` columns per row) or, with m = 0, `keep` of every d_in weights kept overall, chosen block by block."""
    W = W.clone()
    rows, cols = W.shape
    mask = torch.zeros_like(W, dtype=torch.bool)  # True: pruned
    block = block_size if not m else -(-block_size // m) * m
    for i1 in range(0, cols, block):
        i2 = min(i1 + block, cols)
        W1, U1 = W[:, i1:i2].clone(), U[i1:i2, i1:i2]
        err = torch.zeros_like(W1)
        d = torch.diagonal(U1)
        if not m:  # the block's share of the pruned weights, the lowest w^2 / U_jj^2 over rows and columns
            score = (W1 ** 2 / d[None, :] ** 2).flatten()
            total = (cols - keep) * rows  # shares rounded cumulatively: they add up to the budget exactly
            n_pruned = round(total * i2 / cols) - round(total * i1 / cols)
            chosen = torch.zeros_like(score, dtype=torch.bool)
            chosen[torch.topk(score, n_pruned, largest=False).indices] = True
            mask[:, i1:i2] = chosen.view(rows, i2 - i1)
        for j in range(i2 - i1):
            if m and j % m == 0:  # this row's m - keep lowest of the next m columns, scored now (updated)
                score = W1[:, j:j + m] ** 2 / d[None, j:j + m] ** 2
                low = torch.topk(score, m - keep, dim=1, largest=False).indices
                mask[:, i1 + j:i1 + j + m].scatter_(1, low, True)
            w = W1[:, j]
            q = torch.where(mask[:, i1 + j], torch.zeros_like(w), w)
            e = (w - q) / d[j]
            W1[:, j:] -= e[:, None] * U1[j, j:][None, :]
            W1[:, j] = q
            err[:, j] = e
        W[:, i1:i2] = W1
        W[:, i2:] -= err @ U[i1:i2, i2:]
    return W, ~mask


class SparseGPT(SparsityMethod):
    name = "sparsegpt"
    description = ("N:M or unstructured weight pruning with optimal-brain-surgeon updates of the kept weights under "
                   "H = C (SparseGPT; the second weight-sparsity control)")
    masks_weights = True
    needs = frozenset({"C"})
    authors_calibration = AuthorsCalibration(128, 2048, SEQUENTIAL, "C4 train segments, seed 0", "SparseGPT paper's setup and its llama.py (llama_sequential)")
    Settings = SparseGPTSettings

    def full_rank_stats(self) -> frozenset[str]:
        return frozenset({"C"})  # the Hessian H = C is inverted (damped) for every site

    def solve(self, weights, stats, pattern):
        check_finite("sparsegpt", C=stats.C)
        d_in = stats.C.shape[0]
        keep, m = pattern.topk_args(d_in)
        if keep >= d_in:  # nothing pruned, so nothing to move: the dense weights (dead inputs included)
            return MaskedWeights(pattern=pattern, masks={n: torch.ones_like(W, dtype=torch.bool)
                                                         for n, W in weights.items()})
        U, dead, fallbacks = inverse_hessian_factor(stats.C, self.settings.damping)
        updated, masks = {}, {}
        for name, W in weights.items():
            W = W.clone()
            if bool(dead.any()):
                W[:, dead] = 0  # an input that never fires carries nothing: its weights are the first pruned
            W, masks[name] = prune_site(W, U, keep, m, self.settings.block_size)
            updated[name] = W.float()  # stored as factors are: float32, cast to the site's dtype when deployed
        return MaskedWeights(pattern=pattern, masks=masks, weights=updated, fallbacks=fallbacks,
                             extras={"dead_inputs": int(dead.sum())})
