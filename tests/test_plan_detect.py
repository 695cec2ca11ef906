"""`bench plan --detect`: the items a comparison needs for 80 % power, by hand and as the inverse of the detectable
difference; the spreads read from stored cells as the leaderboard pairs them; the command's table."""

import contextlib
import io
import math
from pathlib import Path

import numpy as np
import pytest

from acbench.cli import main
from acbench.measure.sizing import items_for_accuracy, items_for_mean, stored_spreads
from acbench.core.significance import detectable_accuracy, detectable_mean, item_scores

FIXTURES = Path(__file__).parent / "fixtures"


def test_items_by_hand():
    # Connor at psi 0.2, delta 0.05: (1.95996 * 0.44721 + 0.84162 * sqrt(0.2 - 0.0025))^2 / 0.0025
    # = (0.87652 + 0.37405)^2 / 0.0025 = 625.4 -> 626
    assert items_for_accuracy(0.2, 0.05) == 626
    assert items_for_mean(0.1, 0.02) == math.ceil((2.801585 * 0.1 / 0.02) ** 2) == 197
    assert items_for_accuracy(0.03, 0.05) is None  # a difference larger than the discordant share cannot occur
    assert items_for_mean(1e-6, 0.5) == 2


@pytest.mark.parametrize("psi, delta", [(0.3, 0.05), (0.1, 0.02), (0.5, 0.1)])
def test_items_invert_the_detectable_difference(psi, delta):
    n = items_for_accuracy(psi, delta)
    assert detectable_accuracy(psi, n) <= delta < detectable_accuracy(psi, n - 1)
    m = items_for_mean(psi, delta)
    assert detectable_mean(psi, m) <= delta < detectable_mean(psi, m - 1)


def test_spreads_come_from_the_paired_stored_cells():
    from acbench.leaderboard.load import read_result_set

    spreads = stored_spreads([FIXTURES / "results"], "model-a", "lama", "pca")
    assert spreads and all(s.kind == "accuracy" and s.comparison.endswith(")") for s in spreads)
    cells = {(c.cell.method, c.cell.rank): c for c in read_result_set(FIXTURES / "results").cells
             if c.cell.model == "model-a" and c.cell.task == "lama"}
    fasc = next(s for s in spreads if s.comparison == "fasc vs pca (rank 0.5)")
    ref, other = item_scores(cells[("pca", 0.5)])[1], item_scores(cells[("fasc", 0.5)])[1]
    assert fasc.value == pytest.approx(np.mean(np.asarray(ref) != np.asarray(other))) and fasc.n == len(ref)
    assert stored_spreads([FIXTURES / "results"], "model-a", "lama", "nobody") == []
    assert stored_spreads(["/nonexistent"], "model-a", "lama", "pca") == []


def _plan(argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def test_the_plan_sizes_each_task_from_stored_cells_or_says_it_assumes(tiny, tmp_path):
    rc, out, _ = _plan(["plan", "--model", str(tiny), "--methods", "pca", "--detect", "lama=0.05", "ppl-token=0.02",
                        "--results", str(tmp_path / "none")])
    assert rc == 0
    assert "no stored comparison with pca for lama, ppl-token: spreads assumed" in out
    rows = [ln for ln in out.splitlines() if ln.startswith("| lama ") or ln.startswith("| ppl-token ")]
    assert len(rows) == 6 and "1,354 probes" in rows[0] and "| 626 " in rows[1]  # 20 % discordant at 0.05
    assert "windows of 256" in rows[3]
    (tmp_path / "afile").write_text("x")
    rc, _, err = _plan(["plan", "--model", str(tiny), "--methods", "pca", "--detect", "lama=0.05", "--results",
                        str(tmp_path / "afile")])
    assert rc == 2 and "is a file, not a results folder" in err
    rc, _, err = _plan(["plan", "--model", str(tiny), "--methods", "pca", "--detect", "lama=2"])
    assert rc == 2 and "--detect lama='2'" in err


def test_until_decided_comparisons_give_their_spread_and_skipped_ones_are_named():
    """Cells evaluated until decided pair on the items both scored (a prefix of one seeded order), as the
    leaderboard pairs them; a comparison left out is named with why, never dropped without a word."""
    folder = Path(__file__).resolve().parents[1] / "studies" / "cells" / "until-decided"
    skipped: list[str] = []
    spreads = stored_spreads([folder], "smollm2-135m", "lama", "pca", skipped)
    assert sorted((s.comparison.split(" vs ")[0], s.n) for s in spreads) == [("fasc-kfac", 272),
                                                                           ("whitened-svd", 272)]
    assert all(s.comparison.endswith("until decided") and 0 < s.value < 1 for s in spreads)
    assert skipped == []
    spreads = stored_spreads([folder], "smollm2-135m", "lama", "svd", skipped)
    assert spreads == [] and len(skipped) == 3 and all("no svd cell at its budget" in line for line in skipped)
