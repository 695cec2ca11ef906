"""`bench smoke`'s verdict, pinned line by line on hand-built cells (no model): which variant is broken, when the
smoke fails, and what it prints."""

from __future__ import annotations

import math

import pytest

from acbench.results.smoke_verdict import broken_threshold, smoke_verdict


def ppl_cell(method, value, rank=0.5, budget="rank", allocation=None, **metrics):
    cell = {"method": method, "task": "ppl-token", "rank": rank, "budget": budget}
    if allocation is not None:
        cell["allocation"] = allocation
    return {"cell": cell, "metrics": {"ppl": value, **metrics}}


def other_cell(method, **metrics):
    return {"cell": {"method": method, "task": "lama", "rank": 0.5, "budget": "rank"}, "metrics": metrics}


def never(_):
    return False


def test_threshold_is_the_geometric_middle_of_dense_and_uniform():
    assert broken_threshold(100.0, 10_000) == pytest.approx(1000.0, rel=1e-12)
    assert broken_threshold(4.0, 64) == pytest.approx(16.0, rel=1e-12)
    assert broken_threshold(50.0, 50) == pytest.approx(50.0, rel=1e-12)


def test_ok_broken_and_control_lines_in_sorted_order():
    cells = [ppl_cell("dense", 100.0, rank=None, budget=None), ppl_cell("svd", 999.0), ppl_cell("pca", 150.0),
             ppl_cell("zero", 1001.0), ppl_cell("magnitude-prune", 5000.0)]
    v = smoke_verdict(cells, 5, 10_000, lambda m: m == "magnitude-prune")
    assert v.lines == (
        "perplexity (ppl-token): dense 100; a variant above 1000 is broken",
        "  control magnitude-prune @ rank 0.5: 5000 (50.00x dense)",
        "  ok      pca @ rank 0.5: 150 (1.50x dense)",
        "  ok      svd @ rank 0.5: 999 (9.99x dense)",
        "  BROKEN  zero @ rank 0.5: 1001 (10.01x dense)",
        "smoke FAILED: 5 cells (expected 5), non-finite metrics in [], perplexity of a broken model: ['zero']",
    )
    assert v.failed


def test_all_good_passes_and_prints_no_failure_line():
    cells = [ppl_cell("dense", 100.0, rank=None, budget=None), ppl_cell("svd", 1000.0), other_cell("svd", acc=0.5)]
    v = smoke_verdict(cells, 3, 10_000, never)
    assert not v.failed
    assert v.lines == ("perplexity (ppl-token): dense 100; a variant above 1000 is broken",
                       "  ok      svd @ rank 0.5: 1000 (10.00x dense)")


def test_a_control_above_the_limit_does_not_fail_the_smoke():
    cells = [ppl_cell("dense", 100.0, rank=None, budget=None), ppl_cell("ctl", 1e6)]
    assert not smoke_verdict(cells, 2, 10_000, lambda m: m == "ctl").failed
    assert smoke_verdict(cells, 2, 10_000, never).failed


def test_missing_perplexity_is_broken_and_named():
    cells = [ppl_cell("dense", 100.0, rank=None, budget=None), {"cell": ppl_cell("svd", 1)["cell"], "metrics": {}}]
    v = smoke_verdict(cells, 2, 10_000, never)
    assert v.failed and "  BROKEN  svd @ rank 0.5: no perplexity" in v.lines


def test_n_m_budgets_name_their_density_themselves():
    cells = [ppl_cell("dense", 100.0, rank=None, budget=None), ppl_cell("act-sparse", 120.0, rank=0.5, budget="2:4"),
             ppl_cell("svd", 110.0, rank=0.25, budget="params")]
    v = smoke_verdict(cells, 3, 10_000, never)
    assert "  ok      act-sparse @ 2:4: 120 (1.20x dense)" in v.lines
    assert "  ok      svd @ params 0.25: 110 (1.10x dense)" in v.lines
    assert not v.failed


def test_variants_differing_only_in_allocation_are_listed_apart():
    cells = [ppl_cell("dense", 100.0, rank=None, budget=None), ppl_cell("svd", 110.0),
             ppl_cell("svd", 2000.0, allocation="greedy")]
    v = smoke_verdict(cells, 3, 10_000, never)
    assert v.failed and sum(line.startswith("  ") for line in v.lines) == 2
    assert "  BROKEN  svd @ rank 0.5: 2000 (20.00x dense)" in v.lines


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, "12", True, None])
def test_a_non_finite_or_non_number_metric_fails_without_a_perplexity_table(value):
    bad = other_cell("svd", acc=value)
    cells = [ppl_cell("dense", 100.0, rank=None, budget=None), ppl_cell("svd", 110.0), bad]
    v = smoke_verdict(cells, 3, 10_000, never)
    assert v.failed
    assert v.lines == (f"smoke FAILED: 3 cells (expected 3), non-finite metrics in [{bad['cell']!r}], "
                       "perplexity of a broken model: []",)


@pytest.mark.parametrize("found,expected", [(2, 3), (2, 1)])
def test_a_cell_count_other_than_planned_fails(found, expected):
    cells = [ppl_cell("dense", 100.0, rank=None, budget=None), ppl_cell("svd", 110.0)][:found]
    v = smoke_verdict(cells, expected, 10_000, never)
    assert v.failed and v.lines[-1].startswith(f"smoke FAILED: {found} cells (expected {expected}),")


@pytest.mark.parametrize("dense", [None, 0.0])
def test_no_dense_perplexity_fails(dense):
    cells = [ppl_cell("svd", 110.0)]
    if dense is not None:
        cells.append(ppl_cell("dense", dense, rank=None, budget=None))
    v = smoke_verdict(cells, len(cells), 10_000, never)
    assert v.failed and len(v.lines) == 1 and v.lines[0].startswith("smoke FAILED")


def test_the_dense_cell_of_another_task_is_not_the_reference():
    cells = [other_cell("dense", acc=0.3), ppl_cell("dense", 100.0, rank=None, budget=None), ppl_cell("svd", 900.0)]
    v = smoke_verdict(cells, 3, 10_000, never)
    assert v.lines[0] == "perplexity (ppl-token): dense 100; a variant above 1000 is broken" and not v.failed


def test_variants_are_listed_by_allocation_then_budget_then_ratio():
    """One method's variants in a fixed order (no allocation first, then budget by name, then ratio), whatever
    order the cells come in; a perplexity exactly at the limit is still ok."""
    limit = broken_threshold(100.0, 10_000)
    cells = [ppl_cell("dense", 100.0, rank=None, budget=None),
             ppl_cell("svd", 200.0, rank=0.25, allocation="fisher"), ppl_cell("svd", limit, rank=0.5),
             ppl_cell("svd", 300.0, rank=0.25), ppl_cell("svd", 400.0, rank=0.5, budget="params")]
    v = smoke_verdict(cells, 5, 10_000, never)
    assert v.lines == (
        "perplexity (ppl-token): dense 100; a variant above 1000 is broken",
        "  ok      svd @ params 0.5: 400 (4.00x dense)",
        "  ok      svd @ rank 0.25: 300 (3.00x dense)",
        "  ok      svd @ rank 0.5: 1000 (10.00x dense)",
        "  ok      svd @ rank 0.25: 200 (2.00x dense)",
    )
    assert not v.failed
