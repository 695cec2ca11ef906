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


def _centred(x: torch.Tensor, mitigation: str, mu: torch.Tensor | None):
    """x minus what the mitigation subtracts before selection (the calibrated mean, the token's median), and the
    per-token median to add back (median) or None."""
    if mitigation == "shift":
        return x - mu, None
    if mitigation == "median":
        eta = x.median(dim=-1, keepdim=True).values
        return x - eta, eta
    return x, None


def _energy_factor(full: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """variance's per-token rescale sqrt(||x||^2 / ||kept||^2); a token with nothing kept (all zeros) stays."""
    return torch.where(kept > 0, (full / kept.clamp_min(torch.finfo(kept.dtype).tiny)).sqrt(), torch.ones_like(kept))


def sparsify(x: torch.Tensor, n: int, m: int, scale: torch.Tensor | None = None, mitigation: str = "none",
             mu: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The sparse input the group's sites multiply, and the per-token shift to add back (median) or None.

    score_j = |x_j - s| * scale_j, with s the calibrated mean (shift), the token's median (median) or 0;
    `variance` rescales the kept entries so each token keeps its full energy ||x||^2.
    A static shift mu comes back as a bias W mu on each site (the caller's), a median as median * W 1.
    This masked dense form is the reference that `sparse_input`'s gathered form is tested against."""
    x, eta = _centred(x, mitigation, mu)
    score = x.abs() if scale is None else x.abs() * scale
    xs = keep_top(x, score, n, m)
    if mitigation == "variance":
        xs = xs * _energy_factor(x.pow(2).sum(-1, keepdim=True), xs.pow(2).sum(-1, keepdim=True))
    return xs, None if eta is None else eta.squeeze(-1)


def top_indices(score: torch.Tensor, n: int, m: int = 0) -> torch.Tensor:
    """The channels `topk_mask(score, n, m)` keeps, as indices into the last dimension (n * d / m per row for
    N:M, n for m = 0), unordered."""
    d = score.shape[-1]
    if not m:
        return score.topk(n, dim=-1, sorted=False).indices
    blocks = score.reshape(*score.shape[:-1], d // m, m)
    idx = blocks.topk(n, dim=-1, sorted=False).indices
    return idx.add_(_block_starts(d, m, score.device)).reshape(*score.shape[:-1], (d // m) * n)


_STARTS: dict = {}


def _block_starts(d: int, m: int, device) -> torch.Tensor:
    """Each block's first channel, as a (d / m, 1) column; kept per shape (a decode step would otherwise build it
    once per group and token)."""
    key = (d, m, str(device))
    if key not in _STARTS:
        _STARTS[key] = torch.arange(0, d, m, device=device).unsqueeze(-1)
    return _STARTS[key]


def sparse_input(x: torch.Tensor, n: int, m: int, scale: torch.Tensor | None = None, mitigation: str = "none",
                 mu: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """`sparsify` in gathered form, for products that read only the kept channels' weights: per token the kept
    channels' indices and values (the values `sparsify` leaves there), and the per-token median or None."""
    x, eta = _centred(x, mitigation, mu)
    score = x.abs() if scale is None else x.abs() * scale
    idx = top_indices(score, n, m)
    vals = x.gather(-1, idx)
    if mitigation == "variance":
        vals = vals * _energy_factor(x.pow(2).sum(-1, keepdim=True), vals.pow(2).sum(-1, keepdim=True))
    return idx, vals, None if eta is None else eta.squeeze(-1)
