"""WINA as its authors run it (Chen et al. 2025, microsoft/wina): per token, each weight matrix keeps the input
channels with the largest |x_j| * ||W[:, j]||, its own column norms, so each matrix reads its own mask; in the
authors' code only k_proj and gate_proj (and the fused qkv / gate_up matrices of Phi) are weighted by their
norms, and q, v, o, up and down keep the top |x_j| (TEAL's score), those sharing one mask.

`act-sparse:score=wina` is the group form: one mask per input group, scored with the column norms of the group's
stacked weights (every site's). `wina` differs in three ways: a mask per weighted matrix (its own norms), unweighted
matrices at plain |x|, and an index per mask (a group of q, k, v reads two masks). Not done here: the authors'
orthogonal transform (the weights rotated by the right singular vectors of W_k and W_gate, with two d x d residual
adapters per layer, so that the weighted columns are orthogonal) and their greedy per-matrix densities; every
token is sparsified (the authors keep the first 1 % of a sequence's tokens dense)."""

from __future__ import annotations

from dataclasses import dataclass


from .base import SparseActivation, SparsityMethod

# the matrices the authors weigh by their column norms: the key and gate projections, and the fused matrices that
# hold them (Phi-3's qkv_proj and gate_up_proj)
WEIGHTED_AUTHORS = ("k_proj", "gate_proj", "qkv_proj", "gate_up_proj")
WEIGHTINGS = ("authors", "all")


@dataclass(frozen=True)
class WinaSettings:
    weighted: str = "authors"  # authors: k/gate (and fused) matrices by their norms, the rest |x|; all: every matrix

    def __post_init__(self):
        if self.weighted not in WEIGHTINGS:
            raise ValueError(f"wina weighted {self.weighted!r} is unknown: use authors (k_proj and gate_proj by their "
                             "column norms, the rest by |x|) or all (every matrix by its own)")


class Wina(SparsityMethod):
    name = "wina"
    description = ("WINA as its authors run it: per token and per weight matrix, the top |x_j| ||W[:, j]|| by that "
                   "matrix's own column norms (k_proj, gate_proj; weighted=all: every matrix), the others top |x_j|")
    Settings = WinaSettings
    takes_group_density = True  # a per-token top-k at its group's density: TEAL's greedy allocation applies (the authors' recipe)

    def weighs(self, site: str) -> bool:
        return self.settings.weighted == "all" or site.rsplit(".", 1)[-1] in WEIGHTED_AUTHORS

    def group_cost(self, group, pattern):
        macs, params, bits = super().group_cost(group, pattern)
        weighted = sum(map(self.weighs, group.site_names))
        masks = weighted + (weighted < len(group.site_names))
        return macs, params, max(1, masks) * bits

    def solve(self, weights, stats, pattern):
        scales = {n: W.pow(2).sum(0).sqrt().float() if self.weighs(n) else None for n, W in weights.items()}
        if not any(v is not None for v in scales.values()):
            return SparseActivation(pattern=pattern)  # no weighted matrix: one |x| mask for the group
        return SparseActivation(pattern=pattern, site_scales=scales)
