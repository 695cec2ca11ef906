"""The statistics and rank types shared by the calibration engine, the methods and the analyses."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

# Statistics a method can ask for; the calibration engine collects only the union of what is asked.
ACTIVATION_STATS = frozenset({"C", "abs_mean"})
GRADIENT_STATS = frozenset({"F", "pairs", "row_fisher"})


@dataclass(frozen=True)
class RankSpec:
    """`ratio` is a rank ratio (budget="rank") or a parameter ratio (budget="params")."""

    ratio: float
    budget: str = "rank"
    align: int = 1

    def __post_init__(self):
        if not (isinstance(self.ratio, (int, float)) and 0 < self.ratio <= 1) or math.isnan(self.ratio):
            raise ValueError(f"rank ratio {self.ratio} is outside (0, 1]: pass e.g. --rank 0.5")
        if self.budget not in ("rank", "params"):
            raise ValueError(f"budget '{self.budget}' is unknown: use rank or params")
        if self.align < 1:
            raise ValueError("rank alignment must be >= 1")

    def k_group(self, d_in: int, d_outs: tuple[int, ...]) -> int:
        """k of one projection shared by a group: the activation goes from d_in to k numbers."""
        return self._k(full=d_in, d_in=d_in, d_out=sum(d_outs))

    def k_site(self, d_in: int, d_out: int) -> int:
        """k of one site's own factorisation W_i ~ A_i B_i, from that site's shape alone (so k_proj and v_proj
        of a grouped-query attention get their own, smaller k: SVD-LLM's int(m*n*r/(m+n)) per matrix)."""
        return self._k(full=min(d_in, d_out), d_in=d_in, d_out=d_out)

    def _k(self, full: int, d_in: int, d_out: int) -> int:
        if self.budget == "rank":
            k = round(self.ratio * full)
        else:
            k = math.floor(self.ratio * d_in * d_out / (d_in + d_out))
        k = max(1, k)
        if self.align > 1:
            k = math.ceil(k / self.align) * self.align
        return min(k, full)


@dataclass
class GroupStats:
    """Calibration statistics of one input group (all float64 except the token sample)."""

    n_tokens: int = 0
    C: torch.Tensor | None = None  # E[x x^T]
    abs_mean: torch.Tensor | None = None  # E|x| per channel
    F: torch.Tensor | None = None  # E[g g^T], g = dL/dx at the group input
    xs: torch.Tensor | None = None  # (N, d) token sample of x
    gs: torch.Tensor | None = None  # (N, d) the same tokens' g
    row_fisher: dict[str, torch.Tensor] | None = None  # per site: sum over batches of (dL/dW)^2 row sums
    memo: dict = field(default_factory=dict, repr=False)  # solves shared by methods (whitening, Fisher basis)

    def cached(self, key: str, compute):
        """Methods that share a factorisation of the same statistics compute it once per group."""
        if key not in self.memo:
            self.memo[key] = compute()
        return self.memo[key]
