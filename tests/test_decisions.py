"""Decisions beside every paired difference: the detectable difference by hand for each kind of metric (Connor
1987 for McNemar's test, the normal approximation for a mean), the verdict words with two one-sided tests inside a
margin, and the margins as settings (--margin) from the flag to the leaderboard."""

import math
import shutil
from pathlib import Path

import pytest

from acbench.cli import main
from acbench.results.leaderboard_display import check_margins, report_display
from acbench.core.errors import UserError
from acbench.core.significance import (Z_ALPHA, Z_POWER, detectable_accuracy, detectable_mean, mcnemar, paired_mean,
                               verdict)

FIXTURES = Path(__file__).parent / "fixtures"


def connor_n(delta: float, psi: float) -> float:
    """Connor (1987)'s sample size for McNemar's test, as printed: the inverse the solver must satisfy."""
    return (Z_ALPHA * math.sqrt(psi) + Z_POWER * math.sqrt(psi - delta ** 2)) ** 2 / delta ** 2


def test_the_detectable_accuracy_difference_by_hand():
    # psi 0.2, n 100: a = 1.95996 sqrt(0.2) = 0.87652; the quadratic's root gives delta sqrt(n) = 1.23819
    assert detectable_accuracy(0.2, 100) == pytest.approx(0.123819, abs=2e-6)
    assert connor_n(detectable_accuracy(0.2, 100), 0.2) == pytest.approx(100.0)
    assert connor_n(detectable_accuracy(0.05, 1354), 0.05) == pytest.approx(1354.0)
    # no discordant pair observed: taken as one (n 50 -> psi 0.02), never a detectable difference of zero
    assert detectable_accuracy(0.0, 50) == pytest.approx(detectable_accuracy(0.02, 50))
    assert detectable_accuracy(0.0, 50) > 0.05
    assert Z_ALPHA == pytest.approx(1.959964, abs=1e-6) and Z_POWER == pytest.approx(0.841621, abs=1e-6)


def test_the_detectable_mean_difference_by_hand():
    # differences 0.1 0.3 0.2 0.4: sd 0.129099, n 4 -> 2.80159 * 0.129099 / 2 = 0.180843 (one-sided: 0.160)
    d = [0.1, 0.3, 0.2, 0.4]
    sd = math.sqrt(sum((x - 0.25) ** 2 for x in d) / 3)
    assert detectable_mean(sd, 4) == pytest.approx(0.180843, abs=2e-6)


def test_verdict_words():
    base = {"diff": 0.05, "ci95": [0.01, 0.09], "ci90": [0.02, 0.08], "p": 0.01}
    assert verdict(base, 0.02, True) == "better" and verdict(base, 0.02, False) == "worse"
    assert verdict(base, None, None) == "higher"
    assert verdict({**base, "diff": -0.05}, None, None) == "lower"
    tiny = {"diff": 0.002, "ci95": [-0.021, 0.025], "ci90": [-0.015, 0.019], "p": 0.8}
    # TOST at 5 %: the 90 % interval inside the margin, though the 95 % one is not
    assert verdict(tiny, 0.02, True) == "equivalent"
    assert verdict(tiny, 0.018, True) == "undecided" and verdict(tiny, None, True) == "undecided"
    # significant and inside the margin: the margin says it does not matter
    assert verdict({"diff": 0.004, "ci95": [0.002, 0.006], "ci90": [0.0025, 0.0055], "p": 0.001}, 0.02,
                   True) == "equivalent"


def test_the_comparisons_carry_the_tost_interval():
    ref, other = [1, 0, 1, 1, 0, 1, 0, 1] * 10, [1, 1, 1, 0, 0, 1, 0, 1] * 10
    m = mcnemar(ref, other)
    assert m["ci95"][0] < m["ci90"][0] <= m["diff"] <= m["ci90"][1] < m["ci95"][1]
    p = paired_mean([3.0, 3.1, 2.9, 3.2, 3.0], [3.1, 3.3, 3.0, 3.2, 3.2])
    assert p["ci95"][0] < p["ci90"][0] < p["diff"] < p["ci90"][1] < p["ci95"][1]


@pytest.mark.parametrize("given, problem", [
    (["lamma=0.02"], "Did you mean 'lama'"), (["lama=0"], "(0, 1]"), (["lama=1.5"], "(0, 1]"),
    (["lama=nan"], "(0, 1]"), (["lama"], "not task=margin"), (["lama=0.02,lama=0.03"], "twice"),
    ({"lama": True}, "(0, 1]"), (3, "task=margin items or a mapping"), (["lama=0.1,"], "not task=margin")])
def test_margins_refused_in_one_line(given, problem):
    with pytest.raises(UserError, match=problem.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        check_margins(given)


def test_margins_parse_and_override_the_tasks_defaults():
    assert check_margins(["lama=0.05,ppl-token=0.1", "mmlu=1"]) == {"lama": 0.05, "ppl-token": 0.1, "mmlu": 1.0}
    assert check_margins({"lama": 0.03}) == {"lama": 0.03}
    display = report_display(["lama=0.5"])
    assert display.margins["lama"] == 0.5 and display.margins["ppl-token"] == 0.02


def test_a_wide_margin_turns_an_undecided_comparison_equivalent(tmp_path, capsys):
    """The fixture's fasc against pca on LAMA: +0.080 [-0.016, +0.080], undecided at the default margin; with
    --margin lama=0.5 its 90 % interval lies inside, and the leaderboard says equivalent and states the margin."""
    shutil.copytree(FIXTURES / "results", tmp_path / "results")
    out = tmp_path / "lb.md"
    assert main(["report", "--results", str(tmp_path / "results"), "--out", str(out)]) == 0
    row = next(line for line in out.read_text().splitlines() if line.startswith("| fasc "))
    assert "+0.080 [-0.016, +0.080] p=0.12 undecided (could miss 0.109)" in row
    assert main(["report", "--results", str(tmp_path / "results"), "--out", str(out), "--margin", "lama=0.5"]) == 0
    text = out.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| fasc "))
    assert "+0.080 [-0.016, +0.080] p=0.12 equivalent (detectable 0.109)" in row and "lama ±0.5" in text
    assert main(["report", "--results", str(tmp_path / "results"), "--margin", "lama=5"]) == 2
    assert "--margin lama='5'" in capsys.readouterr().err
