"""The two synthetic activation/gradient distributions of docs/design.md, section 4, for testing FASC's selection rule.

A: K-FAC already ranks the directions right (g = (A x) eta + noise); B: per-direction coupling makes K-FAC misrank
them. Both return float64 (x, g) tokens; weights are the identity.
"""

from __future__ import annotations

import torch


def _orth(d, gen):
    q, r = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))


def _student_t(shape, dof, gen):
    z = torch.randn(shape, generator=gen, dtype=torch.float64)
    chi2 = torch.randn((dof,) + tuple(shape), generator=gen, dtype=torch.float64).pow(2).sum(0)
    return z / (chi2 / dof).sqrt()


class Distribution:
    def __init__(self, kind: str, d: int, seed: int):
        self.kind, self.d = kind, d
        gen = torch.Generator().manual_seed(seed)
        i = torch.arange(d, dtype=torch.float64)
        if kind == "A":
            self.Lx = _orth(d, gen) * (2 * 0.92**i + 0.05)
            self.Lg = _orth(d, gen) * (0.9**i + 0.02)
            self.mu = 0.3 * torch.randn(d, generator=gen, dtype=torch.float64)
            self.A = torch.randn(d, d, generator=gen, dtype=torch.float64) / d**0.5
        elif kind == "B":
            self.R = _orth(d, gen)
            self.s = 0.95**i + 0.05
            self.t = 0.95 ** torch.randperm(d, generator=gen).double() + 0.05
            self.positive = torch.zeros(d, dtype=torch.bool)
            self.positive[torch.randperm(d, generator=gen)[: d // 2]] = True
        else:
            raise ValueError(kind)
        self.gen = torch.Generator().manual_seed(seed + 10_000)

    def sample(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        d, gen = self.d, self.gen
        if self.kind == "A":
            x = _student_t((n, d), 5, gen) @ self.Lx.T + self.mu
            eta = torch.randn(n, 1, generator=gen, dtype=torch.float64) * torch.exp(
                0.5 * torch.randn(n, 1, generator=gen, dtype=torch.float64))
            g = (x @ self.A.T) * eta + 0.5 * _student_t((n, d), 3, gen) @ self.Lg.T
            return x, g
        a = torch.randn(n, d, generator=gen, dtype=torch.float64)
        c = torch.randn(n, d, generator=gen, dtype=torch.float64)
        m = torch.where(self.positive, a.abs(), 1 / (a**2 + 0.1).sqrt() / 2.3**0.5)
        return (a * self.s) @ self.R.T, (c * self.t * m) @ self.R.T
