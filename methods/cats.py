"""CATS (Lee et al., COLM 2024: Contextually-Aware Thresholding for Sparsity): in each MLP, zero the activation
a = act(gate x) wherever |a_i| <= t, one threshold t per layer calibrated so that the target fraction of
calibration values is zeroed, and compute down(a * up x) from what is kept. A zero a_i makes the MLP's
intermediate channel i zero, so a kernel reads neither up_proj's row i nor down_proj's column i; gate_proj runs
dense (its output decides the mask), attention is not touched.

One group each gets a role: the MLP's last group (down_proj) carries the threshold, read off the |act| histogram
calibration takes at the activation module's output (`act_hist`, the same log-magnitude bins as TEAL's |x| one;
the authors bin |a| linearly on [-2, 2]); the MLP's first group (gate and up) prices its followed rows (sites
named as an up projection: up_proj, w3, wi_1; a fused gate_up matrix is priced dense); every other group stays
dense. So `--sparsity 0.5` zeroes half the MLP's intermediate channels, and the model's compute is much more
than half: a fair comparison is at matched compute (the leaderboard's and the study's)."""

from __future__ import annotations

import torch

from acbench.core.errors import UserError
from acbench.core.linalg import check_finite
from acbench.core.stats import magnitude_threshold

from .base import ActivationThreshold, AuthorsCalibration, ONE_PASS, SparsityMethod

# the names of the up projection in the gated MLPs transformers builds (Llama's, Mixtral's experts', T5's)
FOLLOW_NAMES = ("up_proj", "w3", "wi_1")


def follows(group) -> tuple[str, ...]:
    """The sites of an MLP's first group whose rows a CATS mask skips: the up projections beside a gate."""
    if group.kind != "mlp_in" or len(group.site_names) < 2:
        return ()
    return tuple(n for n in group.site_names if n.rsplit(".", 1)[-1] in FOLLOW_NAMES)


class Cats(SparsityMethod):
    name = "cats"
    description = ("CATS: a calibrated threshold per MLP on |act(gate x)|, zeroing the MLP's intermediate channels "
                   "below it (down_proj's columns and up_proj's rows skipped; attention dense); reads the |act| "
                   "histogram")
    needs = frozenset({"act_hist"})
    authors_calibration = AuthorsCalibration(100, 1024, ONE_PASS, "RefinedWeb train sequences", "CATS code (ScalingIntelligence/CATS)")

    @classmethod
    def pattern_problem(cls, pattern):
        if pattern.structured:
            return (f"cats keeps the MLP activations above a threshold, so its density varies per token and cannot "
                    f"be an N:M pattern ({pattern.budget}): pass a density, e.g. --sparsity 0.5")
        return None

    def group_cost(self, group, pattern):
        out, dense = sum(group.d_outs), group.d_in * sum(group.d_outs)
        if group.kind == "mlp_out":
            return pattern.keep(group.d_in) * out, dense, pattern.index_bits(group.d_in)
        rows = sum(d for n, d in zip(group.site_names, group.d_outs) if n in follows(group))
        return round(group.d_in * (out - rows + rows * pattern.density)), dense, 0

    def compress(self, group, stats, pattern, k=None, device=None, dtype=torch.float64):
        hist = stats.act_hist
        if group.kind == "mlp_out" and hist is not None and torch.isfinite(hist).all() and not float(hist.sum()) > 0:
            raise UserError(f"group {group.name}: calibration found no activation module of width {group.d_in} "
                            "beside its sites, so cats has no threshold to set there: this architecture's MLP is not one cats "
                            "can threshold; leave cats out of --methods")
        res = super().compress(group, stats, pattern, k, device, dtype)
        res.follows = follows(group) if res.threshold is None else ()
        res.follow_rows = sum(d for n, d in zip(group.site_names, group.d_outs) if n in res.follows)
        return res

    def solve(self, weights, stats, pattern):
        check_finite("cats", act_hist=stats.act_hist)
        if float(stats.act_hist.sum()) > 0:  # the group reads an activation: it carries the threshold
            t = magnitude_threshold(stats.act_hist, pattern.density)
            return ActivationThreshold(pattern=pattern, threshold=t, extras={"threshold": t})
        return ActivationThreshold(pattern=pattern)
