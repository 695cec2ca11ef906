"""Leaderboard from the committed fixture results tree (no compute)."""

import csv
import json
import re
import shutil
from pathlib import Path

import pytest

from core.record import SCHEMA_VERSION
from leaderboard.load import SUPPORTED_SCHEMA, load_results
from bench.cli.display import report_display
from leaderboard.report import build

FIXTURE = Path(__file__).parent / "fixtures" / "results"
EXPECTED = Path(__file__).parent / "fixtures" / "expected_leaderboard.md"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """The fixture tree's leaderboard, rendered once: every test that takes it only reads it."""
    tmp_path = tmp_path_factory.mktemp("rendered")
    root = tmp_path / "results"
    shutil.copytree(FIXTURE, root)
    info = build([root], tmp_path / "LEADERBOARD.md", display=report_display())
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
    assert "svd/rank-0.5/mmlu-k1.json: schema version 0" in joined
    assert len(info["problems"]) == 2


def test_missing_cell_listed_and_duplicates_not_double_counted(rendered):
    info, _ = rendered
    assert info["missing"] == ["model-b / pca / rank 0.25 / lama"]
    assert info["duplicates"] == 1
    rs = load_results(FIXTURE)
    ppl = [c for c in rs.cells if c.cell.method == "pca" and c.cell.rank == 0.5
           and c.cell.task == "ppl-token" and c.cell.model == "model-a"]
    assert len(ppl) == 1 and ppl[0].metrics["ppl"] != 999.0  # the newer result wins


def test_csv_round_trip_equals_result_files(rendered):
    _, out = rendered
    rows = list(csv.DictReader(open(out / "LEADERBOARD.csv")))
    rs = load_results(FIXTURE)
    columns = {"mmlu": ("MMLU acc", "acc"), "lama": ("LAMA P@1", "p@1"), "ppl-token": ("PPL (ppl-token)", "ppl")}
    checked = 0
    for c in rs.cells:
        cell = c.cell
        if cell.task == "rho":
            continue
        col, metric = columns[cell.task]
        match = [r for r in rows if r["model"] == cell.model and r["method"] == cell.method
                 and (cell.method == "dense" or float(r["rank"]) == cell.rank)]
        assert match, cell
        for r in match:
            assert float(r[col]) == pytest.approx(c.metrics[metric], rel=1e-12)
            checked += 1
    assert checked >= 30
    data = json.loads((out / "LEADERBOARD.json").read_text())
    assert len(data) == len(rows)


def test_plots_are_valid_pngs(rendered):
    info, _ = rendered
    # accuracy and perplexity plots for two models, rho by block for one, quality vs measured speed for model-b
    assert len(info["plots"]) == 6
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
    assert info["duplicates"] == 3  # the three copied dense cells (the fixture's own older copy is in older-run/)
    build([FIXTURE], tmp_path / "single.md")
    assert (tmp_path / "merged.md").read_text().split("## Cells with other")[0] == \
        (tmp_path / "single.md").read_text().split("## Cells with other")[0]


def test_a_model_evaluated_only_as_loaded_gets_its_own_table(tmp_path):
    """Dense cells alone (a saved checkpoint run with --methods dense) are a table, with the density a threshold
    checkpoint's tokens kept; the compressed sections stay away."""
    root = tmp_path / "results"
    shutil.copytree(FIXTURE / "model-b" / "dense", root / "model-b" / "dense")
    cell = root / "model-b" / "dense" / "ppl-token-k1.json"
    rec = json.loads(cell.read_text())
    cell.write_text(json.dumps({**rec, "compression": {"measured_density": 0.4375}}))
    build([root], tmp_path / "lb.md")
    text = (tmp_path / "lb.md").read_text()
    table = text.split("### As loaded (no compression in this run)")[1].split("\n\n")[1]
    header, _, dense = table.splitlines()
    cols = [c.strip() for c in header.strip("|").split("|")]
    vals = dict(zip(cols, (c.strip() for c in dense.strip("|").split("|"))))
    assert vals["method"] == "dense" and vals["measured density"] == "0.438"
    assert next(v for k, v in vals.items() if "ppl" in k).startswith("22.27"), vals
    assert "### Rank ratio" not in text and "Sparsity" not in text


def test_the_header_names_the_machine_its_cells_measured_on(tmp_path):
    """Cells that store the machine get a "machine" line in their model's header; cells written before that (the
    fixture tree, as the golden leaderboard shows) get none."""
    root = tmp_path / "results"
    shutil.copytree(FIXTURE / "model-b" / "dense", root / "model-b" / "dense")
    machine = {"cpu_model": "AMD EPYC 7B13", "cpus_available": 2, "cpu_vector_extensions": "avx2 fma",
               "torch_cpu_capability": "AVX2", "torch_blas": "mkl", "torch_onednn": "v3.12.0"}
    for cell in (root / "model-b" / "dense").glob("*.json"):
        rec = json.loads(cell.read_text())
        cell.write_text(json.dumps({**rec, "env": {**rec["env"], **machine, "cpu_threads": 2}}))
    build([root], tmp_path / "lb.md")
    text = (tmp_path / "lb.md").read_text()
    assert ("- machine: AMD EPYC 7B13; 2 CPUs available, 2 threads used; vector extensions avx2 fma; torch kernels "
            "AVX2, BLAS mkl, oneDNN v3.12.0") in text
    assert "- machine:" not in EXPECTED.read_text()


def test_cells_with_other_settings_are_named_not_merged(rendered):
    """Two cells at one table position whose settings keys differ (other shots, a new method version): the newer
    is shown and the older is named under the tables, never averaged or silently dropped."""
    info, out = rendered
    text = (out / "LEADERBOARD.md").read_text()
    assert "mmlu-k0.json (settings k0, 2026-10-15) is not shown" in text
    rs = load_results(FIXTURE)
    shown = [c for c in rs.cells if c.cell.model == "model-a" and c.cell.method == "fasc" and c.cell.rank == 0.5
             and c.cell.task == "mmlu"]
    assert [c.cell.key for c in shown] == ["k1"]


def test_unequal_parameter_ratios_flagged():
    from leaderboard.report import param_ratio_warning

    rows = [{"method": "dense", "param ratio": 1.0}, {"method": "pca", "param ratio": 0.708},
            {"method": "svd", "param ratio": 0.775}, {"method": "fasc", "param ratio": 0.712}]
    (line, _) = param_ratio_warning(rows)
    assert "0.708 (fasc, pca)" in line and "0.775 (svd)" in line
    assert param_ratio_warning(rows[:2] + rows[3:]) == []  # 0.004 apart: comparable


def _fixture_cell(model, method, rank, task):
    rs = load_results(FIXTURE)
    return next(c for c in rs.cells if c.cell.model == model and c.cell.method == method
                and c.cell.rank == rank and c.cell.task == task)


@pytest.mark.parametrize("task", ["mmlu", "lama"])
def test_paired_accuracy_pvalues_equal_scipy_mcnemar_and_marks_follow(rendered, task):
    from scipy.stats import binomtest

    _, out = rendered
    rows = [r for r in json.loads((out / "LEADERBOARD.json").read_text())
            if r["model"] == "model-a" and r["rank"] == 0.5]
    col = {"mmlu": "MMLU acc", "lama": "LAMA P@1"}[task]
    ref = _fixture_cell("model-a", "pca", 0.5, task).records
    for method in ("fasc", "dense"):
        cell = _fixture_cell("model-a", method, 0.5 if method != "dense" else None, task).records
        right = lambda r: (r["rank"] == 0) if task == "lama" else (r["pred"] == r["gold"])
        b = sum(right(x) and not right(y) for x, y in zip(ref, cell))
        c = sum(right(y) and not right(x) for x, y in zip(ref, cell))
        expected = binomtest(c, b + c, 0.5).pvalue
        row = next(r for r in rows if r["method"] == method)
        key = f"Δ {col} vs pca"
        assert row[key + " p"] == pytest.approx(expected, rel=1e-12)
        assert row[key] == pytest.approx((c - b) / len(ref))
        assert row[key + " lo"] <= row[key] <= row[key + " hi"]
    md = (out / "LEADERBOARD.md").read_text()
    for line in md.splitlines():  # the * mark follows p < 0.05 in every Δ cell
        for cellp in re.findall(r"\] p=([0-9.e+-]+)( \*)?", line):
            assert (float(cellp[0]) < 0.05) == bool(cellp[1]), line


def test_chance_aware_recovery(rendered):
    _, out = rendered
    md = (out / "LEADERBOARD.md").read_text()
    model_b = md.split("## model-b")[1]
    assert "mmlu dense 0.360 vs chance 0.250 (n=50, one-sided p=0.055): AT CHANCE" in model_b
    assert "mmlu dense 0.400 vs chance 0.250 (n=50, one-sided p=0.014): above chance" in md.split("## model-b")[0]
    rows = json.loads((out / "LEADERBOARD.json").read_text())
    fasc_b = next(r for r in rows if r["model"] == "model-b" and r["method"] == "fasc" and r["rank"] == 0.5)
    dense_b = next(r for r in rows if r["model"] == "model-b" and r["method"] == "dense")
    # model-b's MMLU is at chance: recovery is LAMA alone
    assert fasc_b["recovery %"] == pytest.approx(100 * fasc_b["LAMA P@1"] / dense_b["LAMA P@1"])
    fasc_a = next(r for r in rows if r["model"] == "model-a" and r["method"] == "fasc" and r["rank"] == 0.5)
    dense_a = next(r for r in rows if r["model"] == "model-a" and r["method"] == "dense")
    assert fasc_a["recovery %"] == pytest.approx(
        50 * (fasc_a["LAMA P@1"] / dense_a["LAMA P@1"] + fasc_a["MMLU acc"] / dense_a["MMLU acc"]))


def test_paired_perplexity_difference_is_the_mean_window_nll_difference(rendered):
    from scipy.stats import ttest_rel

    _, out = rendered
    ref = [r["nll"] for r in _fixture_cell("model-a", "pca", 0.25, "ppl-token").records]
    oth = [r["nll"] for r in _fixture_cell("model-a", "fasc", 0.25, "ppl-token").records]
    row = next(r for r in json.loads((out / "LEADERBOARD.json").read_text())
               if r["model"] == "model-a" and r["method"] == "fasc" and r["rank"] == 0.25)
    key = "Δ PPL (ppl-token) vs pca"
    assert row[key] == pytest.approx(sum(oth) / len(oth) - sum(ref) / len(ref))
    assert row[key + " p"] == pytest.approx(ttest_rel(oth, ref).pvalue, rel=1e-9)
    assert row[key + " lo"] < row[key] < row[key + " hi"]


def test_bos_protocol_in_the_header_and_mixed_protocols_flagged():
    from leaderboard.report import _header

    from core.record import CellId, CellRecord

    def cell(bos):
        return CellRecord(cell=CellId("m", "pca", 0.5, "rank", "lama", "k"), metrics={"p@1": 0.5},
                          primary_metric="p@1", bos=bos)

    cells = [cell("window"), cell("window")]
    assert any("BOS protocol" in l and l.endswith(": window") for l in _header(cells))
    mixed = _header(cells + [cell("none")])
    assert any("none, window" in l and "MIXED" in l for l in mixed)


def test_stage_totals_count_each_piece_once():
    """A variant's compression and latency are in each of its cells, a calibration in every variant's: counted
    once each; evaluations and analyses add up."""
    from core.record import CellId, CellRecord
    from leaderboard.report import stage_totals

    def cell(method, task, timings, kind="task", cache="c1"):
        return CellRecord(cell=CellId("m", method, 0.5, "rank", task, kind=kind), metrics={"x": 1.0},
                          primary_metric="x", timings=timings, calibration={"cache": cache})

    cells = [cell("pca", "lama", {"compress_s": 4.0, "latency_s": 2.0, "calibrate_s": 10.0, "evaluate_s": 3.0}),
             cell("pca", "ppl", {"compress_s": 4.0, "latency_s": 2.0, "calibrate_s": 10.0, "evaluate_s": 5.0}),
             cell("fasc", "lama", {"compress_s": 6.0, "allocate_s": 1.0, "calibrate_s": 10.0, "evaluate_s": 3.0}),
             cell("rho-analysis", "rho", {"rho_s": 20.0}, kind="analysis")]
    assert stage_totals(cells) == {"calibration": 10.0, "compress": 11.0, "latency": 2.0, "evaluation": 11.0,
                                   "analyses": 20.0}


def test_a_cell_without_a_text_date_sorts_as_the_oldest(tmp_path):
    """Found by the fuzz suite's ci profile: env.date = null beside a dated cell crashed the ordering."""
    import json

    root = tmp_path / "results"
    shutil.copytree(FIXTURE, root)
    p = root / "model-b" / "fasc" / "rank-0.5" / "lama-k1.json"
    rec = json.loads(p.read_text())
    rec["env"]["date"] = None
    p.write_text(json.dumps(rec))
    info = build([root], tmp_path / "LEADERBOARD.md", display=report_display())
    assert (tmp_path / "LEADERBOARD.md").exists() and info["markdown"]


def test_a_compressed_cell_without_a_ratio_is_named_and_skipped(tmp_path):
    # found by the fuzz suite: a fasc cell whose cell.rank was null reached the section heading and crashed it
    src = next((FIXTURE / "model-b").rglob("fasc/**/lama-k1.json"))
    cell = json.loads(src.read_text())
    cell["cell"]["rank"] = None
    root = tmp_path / "results"
    (root / "m" / "fasc").mkdir(parents=True)
    (root / "m" / "fasc" / "lama.json").write_text(json.dumps(cell))
    rs = load_results(root)
    assert rs.cells == [] and "cell.rank missing for method 'fasc'" in rs.problems[0]


@pytest.mark.parametrize("edit,why", [
    (lambda r: r["cell"].update(method="fasc"), "belongs at model-b/fasc/rank-0.5/lama-k1.json, not here"),
    (lambda r: r["cell"].update(key="k9"), "belongs at model-b/pca/rank-0.5/lama-k9.json"),
    (lambda r: r["cell"].update(rank=0.25), "belongs at model-b/pca/rank-0.25/lama-k1.json"),
    (lambda r: r["metrics"].update({"p@1": 1.5}), "metric p@1 = 1.5 is outside its domain [0, 1]"),
    (lambda r: r.pop("env"), "no env"),
    (lambda r: r.pop("model_fingerprint"), "no model_fingerprint"),
    (lambda r: r.pop("compression"), "no compression summary"),
])
def test_a_cell_that_disagrees_with_its_place_or_domain_is_named_and_skipped(tmp_path, edit, why):
    """A pca cell edited to say fasc would have shown as fasc's row with pca's number (and pca's row gone)."""
    root = tmp_path / "results"
    shutil.copytree(FIXTURE, root)
    p = root / "model-b" / "pca" / "rank-0.5" / "lama-k1.json"
    rec = json.loads(p.read_text())
    edit(rec)
    p.write_text(json.dumps(rec))
    rs = load_results(root)
    named = [x for x in rs.problems if x.startswith("results/model-b/pca/rank-0.5/lama-k1.json")]
    assert len(named) == 1 and why in named[0] and named[0].endswith(", skipped")
    fasc = [c for c in rs.cells if (c.cell.model, c.cell.method, c.cell.rank, c.cell.task) == ("model-b", "fasc", 0.5,
                                                                                              "lama")]
    assert len(fasc) == 1 and fasc[0].source.endswith("fasc/rank-0.5/lama-k1.json")


def test_perplexity_below_one_is_outside_its_domain(tmp_path):
    root = tmp_path / "results"
    shutil.copytree(FIXTURE, root)
    p = root / "model-b" / "pca" / "rank-0.5" / "ppl-token-k1.json"
    rec = json.loads(p.read_text())
    rec["metrics"]["ppl"] = -1.0
    p.write_text(json.dumps(rec))
    assert any("metric ppl = -1.0 is outside its domain [1, inf]" in x for x in load_results(root).problems)
