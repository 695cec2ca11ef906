"""Leaderboard from the committed fixture results tree (no compute)."""

import csv
import json
import shutil
from pathlib import Path

import pytest

from bench.store import SCHEMA_VERSION
from leaderboard.load import SUPPORTED_SCHEMA, load_results
from leaderboard.report import build

FIXTURE = Path(__file__).parent / "fixtures" / "results"
EXPECTED = Path(__file__).parent / "fixtures" / "expected_leaderboard.md"


@pytest.fixture
def rendered(tmp_path):
    root = tmp_path / "results"
    shutil.copytree(FIXTURE, root)
    info = build([root], tmp_path / "LEADERBOARD.md")
    return info, tmp_path


def test_reader_understands_the_store_schema():
    assert SUPPORTED_SCHEMA == SCHEMA_VERSION


def test_golden_markdown(rendered):
    info, out = rendered
    text = (out / "LEADERBOARD.md").read_text().replace(str(out), "<tmp>")
    assert text == EXPECTED.read_text()


def test_corrupt_and_stale_files_reported_by_name(rendered):
    info, _ = rendered
    joined = "\n".join(info["problems"])
    assert "lama-corrupt.json: unreadable JSON" in joined
    assert "svd/rank-0.5/mmlu-fixture.json: schema version 0" in joined
    assert len(info["problems"]) == 2


def test_missing_cell_listed_and_duplicates_not_double_counted(rendered):
    info, _ = rendered
    assert info["missing"] == ["model-b / pca / rank 0.25 / lama"]
    assert info["duplicates"] == 1
    rs = load_results(FIXTURE)
    ppl = [c for c in rs.cells if c["cell"]["method"] == "pca" and c["cell"]["rank"] == 0.5
           and c["cell"]["task"] == "ppl-token" and c["cell"]["model"] == "model-a"]
    assert len(ppl) == 1 and ppl[0]["metrics"]["ppl"] != 999.0  # the newer result wins


def test_csv_round_trip_equals_result_files(rendered):
    _, out = rendered
    rows = list(csv.DictReader(open(out / "LEADERBOARD.csv")))
    rs = load_results(FIXTURE)
    columns = {"mmlu": ("MMLU acc", "acc"), "lama": ("LAMA P@1", "p@1"), "ppl-token": ("PPL (ppl-token)", "ppl")}
    checked = 0
    for c in rs.cells:
        cell = c["cell"]
        if cell["task"] == "rho":
            continue
        col, metric = columns[cell["task"]]
        match = [r for r in rows if r["model"] == cell["model"] and r["method"] == cell["method"]
                 and (cell["method"] == "dense" or float(r["rank"]) == cell["rank"])]
        assert match, cell
        for r in match:
            assert float(r[col]) == pytest.approx(c["metrics"][metric], rel=1e-12)
            checked += 1
    assert checked >= 30
    data = json.loads((out / "LEADERBOARD.json").read_text())
    assert len(data) == len(rows)


def test_plots_are_valid_pngs(rendered):
    info, _ = rendered
    assert len(info["plots"]) == 5  # accuracy and perplexity plots for two models, rho by block for one
    for p in info["plots"]:
        head = Path(p).read_bytes()[:8]
        assert head == b"\x89PNG\r\n\x1a\n"
        assert Path(p).stat().st_size > 5000


def test_several_result_dirs_merge(tmp_path):
    """Two runs' directories (one per model, plus a repeated cell) merge into one leaderboard."""
    a, b = tmp_path / "run-a", tmp_path / "run-b"
    shutil.copytree(FIXTURE / "model-a", a / "model-a")
    shutil.copytree(FIXTURE / "model-b", b / "model-b")
    shutil.copytree(FIXTURE / "model-a" / "dense", b / "model-a" / "dense")  # the same dense cells again
    info = build([a, b], tmp_path / "merged.md")
    text = (tmp_path / "merged.md").read_text()
    assert "## model-a" in text and "## model-b" in text
    assert info["duplicates"] == 1 + 3  # the fixture's own repeated cell, and the three copied dense cells
    single = build([FIXTURE], tmp_path / "single.md")
    assert (tmp_path / "merged.md").read_text().split("## Skipped")[0] == \
        (tmp_path / "single.md").read_text().split("## Skipped")[0]


def test_unequal_parameter_ratios_flagged():
    from leaderboard.report import param_ratio_warning

    rows = [{"method": "dense", "param ratio": 1.0}, {"method": "pca", "param ratio": 0.708},
            {"method": "svd", "param ratio": 0.775}, {"method": "fasc", "param ratio": 0.712}]
    (line, _) = param_ratio_warning(rows)
    assert "0.708 (fasc, pca)" in line and "0.775 (svd)" in line
    assert param_ratio_warning(rows[:2] + rows[3:]) == []  # 0.004 apart: comparable
