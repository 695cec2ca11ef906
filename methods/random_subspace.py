"""A random k-dimensional orthogonal projection: the floor every method must beat. Written as one decorated
function (methods/from_function.py), with a setting."""

from dataclasses import dataclass

import torch

from .from_function import low_rank_method


@dataclass(frozen=True)
class RandomSettings:
    seed: int = 0


@low_rank_method("random", description="orthogonal projection on a random k-dim subspace (seeded)",
                 settings=RandomSettings, control=True,
                 solve_ops=lambda d_in, d_outs, k: [("", "flops", 4 * d_in * k * k)])
def RandomSubspace(weights, k, settings):
    W = next(iter(weights.values()))
    # drawn on the CPU in float64, then moved and cast: the same subspace whatever device and precision solve
    gen = torch.Generator().manual_seed(settings.seed)
    draw = torch.randn(W.shape[1], k, generator=gen, dtype=torch.float64, device="cpu").to(W.device, W.dtype)
    Q, _ = torch.linalg.qr(draw)
    return Q
