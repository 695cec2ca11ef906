"""N:M activation sparsity: per token, keep N of every M consecutive input channels of the group (or the top
fraction of all of them) by a score, zero the rest; every site of the group reads the one sparse x.

Scores (per token, channel j): abs |x_j|; wina |x_j| ||W[:, j]|| (the group's stacked weights); amber |x_j| times
the column norm of the row-standardised stacked weights over its smallest column norm; fisher |x_j| sqrt(F_jj)
(zeroing x_j costs about x_j^2 F_jj under the second-order surrogate). Mitigations (docs/design.md, section 7):
none, variance, shift (calibrated mean, deployed as a bias), median (per-token median).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from acbench.core.sparsity import MITIGATIONS

from .base import SparseActivation, SparsityMethod, stacked_column_norms

SCORES = ("abs", "wina", "amber", "fisher")


@dataclass(frozen=True)
class ActSparseSettings:
    score: str = "abs"
    mitigation: str = "none"

    def __post_init__(self):
        if self.score not in SCORES:
            raise ValueError(f"act-sparse score '{self.score}' is unknown: use one of {', '.join(SCORES)}")
        if self.mitigation not in MITIGATIONS:
            raise ValueError(f"act-sparse mitigation '{self.mitigation}' is unknown: use one of "
                             f"{', '.join(MITIGATIONS)}")


def amber_scale(weights: dict[str, torch.Tensor]) -> torch.Tensor:
    """Column norms of the stacked weights after standardising each output row (so a few outlier rows do not
    decide every channel's score), divided by the smallest column norm."""
    rows = torch.cat(list(weights.values()))
    std = rows.std(dim=1, keepdim=True).clamp_min(torch.finfo(rows.dtype).tiny)
    norms = ((rows - rows.mean(dim=1, keepdim=True)) / std).pow(2).sum(0).sqrt()
    return norms / norms.min().clamp_min(torch.finfo(rows.dtype).tiny)


class ActSparse(SparsityMethod):
    name = "act-sparse"
    description = ("N:M (or unstructured top-k) activation sparsity per token; score abs|wina|amber|fisher, "
                   "mitigation none|variance|shift|median (fisher reads F, shift the calibrated mean)")
    Settings = ActSparseSettings
    takes_group_density = True  # a per-token top-k at each group's own density

    def required_stats(self) -> frozenset[str]:
        need = set()
        if self.settings.score == "fisher":
            need.add("F")
        if self.settings.mitigation == "shift":
            need.add("mean")
        return frozenset(need)

    def solve(self, weights, stats, pattern):
        score, mitigation = self.settings.score, self.settings.mitigation
        scale = None
        if score == "wina":
            scale = stacked_column_norms(weights)
        elif score == "amber":
            scale = amber_scale(weights)
        elif score == "fisher":
            scale = torch.diagonal(stats.F).clamp_min(0).sqrt()
        mu = stats.mean if mitigation == "shift" else None
        return SparseActivation(pattern=pattern, scale=None if scale is None else scale.float(),
                                mitigation=mitigation, mu=None if mu is None else mu.float())
