"""TEAL's magnitude histogram and threshold, and the N:M hint, on hand cases worked out here (a mutation run
found them pinned only loosely): the bins of values at known magnitudes, the threshold where the tail reaches a
density inside a bin, on an edge, across empty bins and at the ends."""

import math

import pytest
import torch

from acbench.core.stats import HIST_BINS, HIST_HI, HIST_LO, _divisor_hint, magnitude_histogram, magnitude_threshold

WIDTH = (HIST_HI - HIST_LO) / HIST_BINS


def _bin(magnitude: float) -> int:
    """The bin a magnitude falls in, by the definition: log10 clamped to [LO, HI], then floor((log - LO) / width)."""
    log = min(max(math.log10(magnitude) if magnitude > 0 else HIST_LO, HIST_LO), HIST_HI)
    return min(int((log - HIST_LO) / WIDTH), HIST_BINS - 1)


def test_histogram_counts_every_value_in_its_bin_the_extremes_included():
    mids = [10 ** (HIST_LO + (k + 0.5) * WIDTH) for k in (5, 1000, 2048, 4000)]
    values = torch.tensor([0.0, 1e-12, -3e-9, 1e9, -5e5] + mids + [-mids[1]], dtype=torch.float64)
    hist = magnitude_histogram(values)
    want = torch.zeros(HIST_BINS, dtype=torch.float64)
    for v in values.tolist():
        want[_bin(abs(v))] += 1
    assert hist.dtype == torch.float64 and torch.equal(hist, want)
    assert hist[0] == 3 and hist[-1] == 2  # zero and below 1e-8 at the bottom, above 1e4 at the top: none dropped


def _hist(counts: dict[int, int]) -> torch.Tensor:
    h = torch.zeros(HIST_BINS, dtype=torch.float64)
    for k, c in counts.items():
        h[k] = c
    return h


def _edge(position: float) -> float:
    return 10.0 ** (HIST_LO + position * WIDTH)


@pytest.mark.parametrize("density, position", [
    (0.25, 3000),        # exactly the top bin's mass: its lower edge (not the upper edge of the bin below, 20 bins away)
    (0.5, 2000 + 0.5),   # above = 0.25, half of bin 2000's 0.5 more: halfway into it (in log-magnitude)
    (0.625, 2000.25),    # three quarters of bin 2000
    (1.0, 1000),         # everything: the lowest occupied bin's lower edge
    (0.875, 1000.5),     # half of the lowest bin's 0.25
    (0.0, HIST_BINS),    # nothing kept: the histogram's top
])
def test_threshold_is_where_the_tail_reaches_the_density(density, position):
    hist = _hist({1000: 1, 2000: 2, 3000: 1})  # fractions 0.25, 0.5, 0.25, with empty bins between
    assert magnitude_threshold(hist, density) == pytest.approx(_edge(position), rel=1e-9)


def test_threshold_in_a_single_bin():
    hist = _hist({HIST_BINS - 1: 4})  # everything in the top bin
    assert magnitude_threshold(hist, 0.5) == pytest.approx(_edge(HIST_BINS - 0.5), rel=1e-9)
    assert magnitude_threshold(hist, 1.0) == pytest.approx(_edge(HIST_BINS - 1), rel=1e-9)


@pytest.mark.parametrize("d_in, n, m, hint", [
    (4, 3, 5, "2:4"), (24, 3, 5, "2:4"),   # 4 divides: the same density at M = 4 (0.6 x 4 = 2.4 -> 2)
    (20, 1, 10, "1:4"),                     # a density below 1/(2M) still keeps one
    (18, 3, 5, "1:2"), (34, 3, 5, "1:2"), (66, 3, 5, "1:2"), (6, 1, 3, "1:2"),  # only 2 divides
    (7, 2, 4, "0.5"),                       # nothing divides: a density
    (12, 7, 8, "3:4"),
])
def test_divisor_hint_offers_the_same_density_at_an_m_that_divides(d_in, n, m, hint):
    assert _divisor_hint(d_in, n, m) == hint


@pytest.mark.parametrize("density, position", [
    (0.75, 1000.5),      # tails 1.0, 0.5, 0.4, 0.3: (0.75 - 0.5) / 0.5 of bin 1000, from its top
    (0.45, 1001.5),      # (0.45 - 0.4) / 0.1 of bin 1001
    (0.9, 1000.2),       # (0.9 - 0.5) / 0.5 of bin 1000
])
def test_threshold_counts_only_the_bins_above_its_own(density, position):
    """Adjacent occupied bins: the tail above the threshold's bin is the next bin's tail, not one further."""
    hist = _hist({1000: 5, 1001: 1, 1002: 1, 1003: 3})  # fractions 0.5, 0.1, 0.1, 0.3
    assert magnitude_threshold(hist, density) == pytest.approx(_edge(position), rel=1e-9)


def test_threshold_in_the_bin_below_the_top_one():
    """The top bin occupied too: the tail above the second-highest bin is the top bin's mass, not nothing."""
    hist = _hist({HIST_BINS - 2: 3, HIST_BINS - 1: 1})  # 0.75, 0.25
    assert magnitude_threshold(hist, 0.625) == pytest.approx(_edge(HIST_BINS - 1.5), rel=1e-9)
    assert magnitude_threshold(hist, 0.125) == pytest.approx(_edge(HIST_BINS - 0.5), rel=1e-9)
