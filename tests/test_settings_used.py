"""Settings that would change nothing are refused in one line naming them (docs/cli.md): a margin for a task the run
does not score, --reference without --until-decided, --until-decided where no task can stop early, a flag given
twice with different values, `bench plan --results` / `--vs` without --detect, and a --vs no method has."""

from __future__ import annotations

import pytest

from fuzz_common import outcome


def _run(tiny, tmp_path, *extra):
    return outcome(["run", "--model", str(tiny), "--methods", "pca", "--rank", "0.5", "--no-latency", "--quiet",
                    "--no-report", "--output", str(tmp_path / "r"), *extra])


@pytest.mark.parametrize("extra, says", [
    (["--tasks", "ppl-token", "--margin", "lama=0.03"], "--margin sets lama, which this run does not score"),
    (["--tasks", "ppl-token", "--reference", "pca"], "--reference 'pca' only names the method --until-decided"),
    (["--tasks", "rho", "--until-decided"], "this run's tasks (analyses only) are evaluated whole"),
    (["--calibration-mode", "sequential", "--calibration-mode", "one-pass"],
     "argument --calibration-mode: given twice, as 'sequential' and 'one-pass'"),
    (["--margin", "lama=0.03", "--margin", "ppl-token=0.02"], "argument --margin: given twice"),
    (["--lama-limit", "3", "--lama-limit", "4"], "argument --lama-limit: given twice, as 3 and 4"),
])
def test_a_setting_that_would_do_nothing_is_one_line(tiny, tmp_path, checked_only, extra, says):
    rc, lines = _run(tiny, tmp_path, *extra)
    assert rc == 2 and len(lines) == 1 and says in lines[0], lines


def test_the_same_value_twice_is_one_value(tiny, tmp_path, checked_only):
    rc, lines = _run(tiny, tmp_path, "--tasks", "ppl-token", "--calibration-mode", "one-pass", "--calibration-mode",
                     "one-pass", "--until-decided", "--reference", "pca", "--margin", "ppl-token=0.02")
    assert rc == 0, lines


@pytest.mark.parametrize("argv, says", [
    (["plan", "--vs", "svd"], "--vs only sizes the comparisons of --detect"),
    (["plan", "--results", "r", "--vs", "svd"], "--results and --vs only size the comparisons of --detect"),
    (["plan", "--detect", "lama=0.05", "--vs", "pcaa"], "--vs 'pcaa': unknown method 'pcaa'. Did you mean 'pca'?"),
    (["report", "--vs", "bogus", "--results", "nowhere"], "--vs 'bogus': unknown method 'bogus'"),
])
def test_plan_and_report_flags_that_would_do_nothing(argv, says):
    rc, lines = outcome(argv)
    assert rc == 2 and len(lines) == 1 and says in lines[0], lines
