"""TEAL (Liu et al. 2024, training-free activation sparsity): per token, keep the input channels whose magnitude
exceeds a static threshold, calibrated per input group so that the calibration tokens keep the target density,
and compare |x| with it at run time (no top-k). The density a token keeps varies; the calibrated one is the
budget's, and a run records the density measured on each task's tokens (`measured_density` in its cells).

TEAL's recipe as its authors run it is three settings: `--calibration authors` (10 x 2,048 tokens),
`--allocate greedy` (a density per group, acbench.deploy.allocation) and `prefill_half=true` (the first half of
each evaluated sequence dense).

The threshold is read off the group's |x| histogram (acbench.core.stats.magnitude_threshold): the magnitude above which
the target fraction of the calibration values lies.
"""

from __future__ import annotations

from dataclasses import dataclass

from acbench.core.linalg import check_finite
from acbench.core.registry import added_setting
from acbench.core.stats import ONE_PASS, magnitude_threshold

from .base import AuthorsCalibration, SparseActivation, SparsityMethod


@dataclass(frozen=True)
class TealSettings:
    # TEAL's evaluation (its SparsifyFn): the first half of each evaluated sequence stays dense, as a prompt would,
    # and only the second half is sparsified; False: every token, as a deployment that sparsifies prefill
    prefill_half: bool = added_setting(False)


class Teal(SparsityMethod):
    name = "teal"
    description = ("TEAL: static magnitude threshold per input group, calibrated to the target density (--sparsity "
                   "0.5), |x| compared with it at run time; reads the |x| histogram")
    needs = frozenset({"abs_hist"})
    takes_group_density = True  # each group's threshold calibrated at its own density
    Settings = TealSettings
    authors_calibration = AuthorsCalibration(10, 2048, ONE_PASS, "Alpaca samples", "TEAL code (teal/grab_acts.py: "
                                             "activation histograms from 10 x 2,048 tokens)")

    @classmethod
    def pattern_problem(cls, pattern):
        if pattern.structured:
            return (f"teal keeps the channels above a threshold, so its density varies per token and cannot be an "
                    f"N:M pattern ({pattern.budget}): pass a density, e.g. --sparsity 0.5")
        return None

    def solve(self, weights, stats, pattern):
        check_finite("teal", abs_hist=stats.abs_hist)
        threshold = magnitude_threshold(stats.abs_hist, pattern.density)
        return SparseActivation(pattern=pattern, threshold=threshold, extras={"threshold": threshold},
                                dense_prefix=0.5 if self.settings.prefill_half else 0.0)
