"""LaRoSa (Liu et al., ICML 2025): activation sparsity in a rotated basis. The inputs of q/k/v and of gate/up (the
normed residual stream) are rotated by the eigenvectors Q of their calibration second moment, z = x Q, the top-k
of |z| kept per token, and the sites deploy W Q, so W x ~ (W Q)(mask * z); the inputs of o_proj and down_proj take
a plain top-k in their own basis. The budget is split as the authors' code splits it: with s = 1 - density the
fraction zeroed, the rotated groups zero `in_factor` * s and the output groups `out_factor` * s (0.8 and 1.2);
other group kinds zero s. One mask per group, shared by its sites, as the authors' code does for q/k/v and
gate/up.

Q: the eigenvectors of H = sum x x^T + 0.01 mean(diag H) I, the same as C's (the damping shifts every eigenvalue
alike), so pca's memoised eigenvectors serve; each rotated group has its own (the authors' released inference code
loads the attention input's Q for the MLP input too; their calibration script computes both, and the paper
describes one per input). The rotation is deployed online, one d x d product per token and group, and priced so."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from acbench.core.linalg import check_finite, pca_basis

from .base import AuthorsCalibration, ONE_PASS, SparseActivation, SparsityMethod

ROTATED_KINDS = frozenset({"attn_in", "mlp_in", "attn_mlp_in"})  # inputs read after a norm: the residual stream
PLAIN_KINDS = frozenset({"attn_out", "mlp_out"})  # o_proj's and down_proj's inputs


@dataclass(frozen=True)
class LaRoSaSettings:
    in_factor: float = 0.8  # the rotated groups zero in_factor * s of their channels
    out_factor: float = 1.2  # o_proj's and down_proj's inputs zero out_factor * s

    def __post_init__(self):
        for name in ("in_factor", "out_factor"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and 0 < v <= 10):
                raise ValueError(f"larosa {name} {v!r} is not a number in (0, 10]: the authors use 0.8 (in) and "
                                 "1.2 (out)")


class LaRoSa(SparsityMethod):
    name = "larosa"
    description = ("LaRoSa: top-k per token of z = x Q (Q: eigenvectors of E[x x^T]) at the q/k/v and gate/up inputs, "
                   "sites deployed as W Q; plain top-k at o/down; the budget split 0.8 s / 1.2 s")
    needs = frozenset({"C"})
    authors_calibration = AuthorsCalibration(10, 2048, ONE_PASS, "WikiText-2 train, its first 500 rows concatenated", "LaRoSa code (alibaba/EfficientAI larosa/)")
    Settings = LaRoSaSettings

    def full_rank_stats(self) -> frozenset[str]:
        return frozenset({"C"})  # the rotation is C's whole eigenbasis

    @classmethod
    def pattern_problem(cls, pattern):
        if pattern.structured:
            return (f"larosa keeps a top-k per token split unevenly between group kinds (0.8 s and 1.2 s), not an N:M "
                    f"pattern ({pattern.budget}): pass a density, e.g. --sparsity 0.5")
        return None

    def budget_problem(self, pattern):
        """A factor of 1 / s or more asks a kind to zero every channel: it would keep one per token (the floor), a
        density other than the split asks for and the run's budget names."""
        s = 1.0 - pattern.density
        for name in ("in_factor", "out_factor"):
            factor = getattr(self.settings, name)
            if factor * s >= 1:
                return (f"larosa {name} {factor:g} at sparsity {s:g} (density {pattern.density:g}) zeroes "
                        f"{factor * s:g} of the channels, more than there are (the groups would keep one per token): "
                        f"lower {name} below {1 / s:.4g} or ask for a higher density")
        return None

    def group_pattern(self, kind: str, pattern):
        """The density a group of `kind` keeps under the run's density, and whether its input is rotated."""
        from acbench.core.stats import SparsitySpec

        s = 1.0 - pattern.density
        rotate = kind in ROTATED_KINDS
        factor = self.settings.in_factor if rotate else self.settings.out_factor if kind in PLAIN_KINDS else 1.0
        # at least one channel per token is kept (SparsitySpec.keep), however large the factor
        return SparsitySpec(density=min(1.0, max(1.0 - factor * s, 1e-12))), rotate

    def compress(self, group, stats, pattern, k=None, device=None, dtype=torch.float64):
        self.refuse_pattern(pattern)  # the run's pattern, before it is split by kind
        own, rotate = self.group_pattern(group.kind, pattern)
        res = super().compress(group, stats, own, k, device, dtype)
        if rotate and own.density < 1:  # at full density nothing is dropped: no rotation to pay for
            # C's eigenvectors, solved where the base solved (its memo serves when the statistics are already there)
            res.rotation = pca_basis(stats.on(torch.device(device or "cpu")))["U"].float()
            self.check_deployable(res)
        return res

    def solve(self, weights, stats, pattern):
        check_finite("larosa", C=stats.C)
        return SparseActivation(pattern=pattern)
