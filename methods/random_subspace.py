"""A random k-dimensional orthogonal projection: the floor every method must beat."""

from dataclasses import dataclass

import torch

from .base import Compressor, projection_factors


@dataclass(frozen=True)
class RandomSettings:
    seed: int = 0


class RandomSubspace(Compressor):
    name = "random"
    description = "orthogonal projection on a random k-dim subspace (seeded)"
    Settings = RandomSettings

    def solve(self, weights, stats, k):
        d = next(iter(weights.values())).shape[1]
        gen = torch.Generator().manual_seed(self.settings.seed)
        Q, _ = torch.linalg.qr(torch.randn(d, k, generator=gen, dtype=torch.float64))
        return projection_factors(weights, Q, Q.T), True, [], {}
