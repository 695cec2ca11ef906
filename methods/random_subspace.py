"""A random k-dimensional orthogonal projection: the floor every method must beat."""

from dataclasses import dataclass

import torch

from .base import Compressor, projection_factors, projection_ops


@dataclass(frozen=True)
class RandomSettings:
    seed: int = 0


class RandomSubspace(Compressor):
    name = "random"
    description = "orthogonal projection on a random k-dim subspace (seeded)"
    Settings = RandomSettings
    control = True

    def solve_ops(self, d_in, d_outs, k, pair_tokens):
        return [("", "flops", 4 * d_in * k * k), *projection_ops(d_in, d_outs, k)]

    def solve(self, weights, stats, k):
        W = next(iter(weights.values()))
        # drawn on the CPU in float64, then moved and cast: the same subspace whatever device and precision solve
        gen = torch.Generator().manual_seed(self.settings.seed)
        draw = torch.randn(W.shape[1], k, generator=gen, dtype=torch.float64, device="cpu").to(W.device, W.dtype)
        Q, _ = torch.linalg.qr(draw)
        return projection_factors(weights, Q, Q.T), True, [], {}
