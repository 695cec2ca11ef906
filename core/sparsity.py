"""Per-token activation masks (N:M and unstructured top-k) and the error mitigations of activation sparsity.

Pure tensor functions, shared by the methods (which test them) and the deployed modules (which run them).
"""

from __future__ import annotations

import torch

MITIGATIONS = ("none", "variance", "shift", "median")


def topk_mask(score: torch.Tensor, n: int, m: int = 0) -> torch.Tensor:
    """Boolean mask of `score`'s last dimension: the n highest of every m consecutive entries (m > 0), or the n
    highest of the whole row (m = 0)."""
    d = score.shape[-1]
    if m:
        blocks = score.reshape(*score.shape[:-1], d // m, m)
        idx = blocks.topk(n, dim=-1, sorted=False).indices
        return torch.zeros_like(blocks, dtype=torch.bool).scatter_(-1, idx, True).reshape(score.shape)
    idx = score.topk(n, dim=-1, sorted=False).indices
    return torch.zeros_like(score, dtype=torch.bool).scatter_(-1, idx, True)


def keep_top(x: torch.Tensor, score: torch.Tensor, n: int, m: int = 0) -> torch.Tensor:
    """x with only the entries `topk_mask(score, n, m)` keeps, the rest 0: the kept values are gathered and
    scattered into zeros (cheaper than building the boolean mask and multiplying, the masked forward's overhead)."""
    d = x.shape[-1]
    if m:
        xb, sb = x.reshape(*x.shape[:-1], d // m, m), score.reshape(*score.shape[:-1], d // m, m)
    else:
        xb, sb = x, score
    idx = sb.topk(n, dim=-1, sorted=False).indices
    return torch.zeros_like(xb).scatter_(-1, idx, xb.gather(-1, idx)).reshape(x.shape)


def sparsify(x: torch.Tensor, n: int, m: int, scale: torch.Tensor | None = None, mitigation: str = "none",
             mu: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The sparse input the group's sites multiply, and the per-token shift to add back (median) or None.

    score_j = |x_j - s| * scale_j, with s the calibrated mean (shift), the token's median (median) or 0;
    `variance` rescales the kept entries so each token keeps its full energy ||x||^2.
    A static shift mu comes back as a bias W mu on each site (the caller's), a median as median * W 1."""
    eta = None
    if mitigation == "shift":
        x = x - mu
    elif mitigation == "median":
        eta = x.median(dim=-1, keepdim=True).values
        x = x - eta
    score = x.abs() if scale is None else x.abs() * scale
    xs = keep_top(x, score, n, m)
    if mitigation == "variance":
        full = x.pow(2).sum(-1, keepdim=True)
        kept = xs.pow(2).sum(-1, keepdim=True)
        # a token with nothing kept (all zeros) stays as it is
        xs = xs * torch.where(kept > 0, (full / kept.clamp_min(torch.finfo(kept.dtype).tiny)).sqrt(),
                              torch.ones_like(kept))
    return xs, None if eta is None else eta.squeeze(-1)
