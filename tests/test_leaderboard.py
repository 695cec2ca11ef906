"""Leaderboard from the committed fixture results tree (no compute)."""

import csv
import json
import math
import re
import shutil
from pathlib import Path

import pytest

from acbench.core.record import SCHEMA_VERSION
from acbench.leaderboard.load import SUPPORTED_SCHEMA, read_result_set
from acbench.results.leaderboard_display import report_display
from acbench.leaderboard import formatting, plots, report, sections
from acbench.leaderboard.report import build_report

FIXTURE = Path(__file__).parent / "fixtures" / "results"
EXPECTED = Path(__file__).parent / "fixtures" / "expected_leaderboard.md"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """The fixture tree's leaderboard, rendered once: every test that takes it only reads it."""
    tmp_path = tmp_path_factory.mktemp("rendered")
    root = tmp_path / "results"
    shutil.copytree(FIXTURE, root)
    info = build_report([root], tmp_path / "LEADERBOARD.md", display=report_display())
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
    rs = read_result_set(FIXTURE)
    ppl = [c for c in rs.cells if c.cell.method == "pca" and c.cell.rank == 0.5
           and c.cell.task == "ppl-token" and c.cell.model == "model-a"]
    assert len(ppl) == 1 and ppl[0].metrics["ppl"] != 999.0  # the newer result wins


def test_csv_round_trip_equals_result_files(rendered):
    _, out = rendered
    rows = list(csv.DictReader(open(out / "LEADERBOARD.csv")))
    rs = read_result_set(FIXTURE)
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
    info = build_report([a, b], tmp_path / "merged.md")
    text = (tmp_path / "merged.md").read_text()
    assert "## model-a" in text and "## model-b" in text
    assert info["duplicates"] == 3  # the three copied dense cells (the fixture's own older copy is in older-run/)
    build_report([FIXTURE], tmp_path / "single.md")
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
    build_report([root], tmp_path / "lb.md")
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
    build_report([root], tmp_path / "lb.md")
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
    rs = read_result_set(FIXTURE)
    shown = [c for c in rs.cells if c.cell.model == "model-a" and c.cell.method == "fasc" and c.cell.rank == 0.5
             and c.cell.task == "mmlu"]
    assert [c.cell.key for c in shown] == ["k1"]


def test_unequal_parameter_ratios_flagged():
    from acbench.leaderboard.formatting import param_ratio_warning

    rows = [{"method": "dense", "param ratio": 1.0}, {"method": "pca", "param ratio": 0.708},
            {"method": "svd", "param ratio": 0.775}, {"method": "fasc", "param ratio": 0.712}]
    (line, _) = param_ratio_warning(rows)
    assert "0.708 (fasc, pca)" in line and "0.775 (svd)" in line
    assert param_ratio_warning(rows[:2] + rows[3:]) == []  # 0.004 apart: comparable


def _fixture_cell(model, method, rank, task):
    rs = read_result_set(FIXTURE)
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
    from acbench.leaderboard.sections import _header

    from acbench.core.record import CellId, CellRecord

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
    from acbench.core.record import CellId, CellRecord
    from acbench.leaderboard.sections import stage_totals

    def cell(method, task, timings, kind="task", cache="c1"):
        return CellRecord(cell=CellId("m", method, 0.5, "rank", task, kind=kind), metrics={"x": 1.0},
                          primary_metric="x", timings=timings, calibration={"cache": cache})

    cells = [cell("pca", "lama", {"compress_s": 4.0, "latency_s": 2.0, "calibrate_s": 10.0, "evaluate_s": 3.0}),
             cell("pca", "ppl", {"compress_s": 4.0, "latency_s": 2.0, "calibrate_s": 10.0, "evaluate_s": 5.0}),
             cell("fasc", "lama", {"compress_s": 6.0, "allocate_s": 1.0, "calibrate_s": 10.0, "evaluate_s": 3.0}),
             cell("rho-analysis", "rho", {"rho_s": 20.0}, kind="analysis")]
    assert stage_totals(cells) == {"calibration": 10.0, "compress": 11.0, "latency": 2.0, "evaluation": 11.0,
                                   "analyses": 20.0}
    # a second statistics cache is a second calibration; every analysis adds its "_s" timings, nothing else
    more = [cell("svd", "lama", {"calibrate_s": 5.0, "latency_s": 0.5}, cache="c2"),
            cell("rho-analysis", "rho2", {"rho_s": 4.0, "units": 3}, kind="analysis")]
    assert stage_totals(cells + more) == {"calibration": 15.0, "compress": 11.0, "latency": 2.5, "evaluation": 11.0,
                                          "analyses": 24.0}
    assert stage_totals([cell("pca", "lama", {"evaluate_s": 0.5})]) == {"evaluation": 0.5}  # under a second: kept


def test_a_cell_without_a_text_date_sorts_as_the_oldest(tmp_path):
    """Found by the fuzz suite's ci profile: env.date = null beside a dated cell crashed the ordering."""
    import json

    root = tmp_path / "results"
    shutil.copytree(FIXTURE, root)
    p = root / "model-b" / "fasc" / "rank-0.5" / "lama-k1.json"
    rec = json.loads(p.read_text())
    rec["env"]["date"] = None
    p.write_text(json.dumps(rec))
    info = build_report([root], tmp_path / "LEADERBOARD.md", display=report_display())
    assert (tmp_path / "LEADERBOARD.md").exists() and info["markdown"]


def test_a_compressed_cell_without_a_ratio_is_named_and_skipped(tmp_path):
    # found by the fuzz suite: a fasc cell whose cell.rank was null reached the section heading and crashed it
    src = next((FIXTURE / "model-b").rglob("fasc/**/lama-k1.json"))
    cell = json.loads(src.read_text())
    cell["cell"]["rank"] = None
    root = tmp_path / "results"
    (root / "m" / "fasc").mkdir(parents=True)
    (root / "m" / "fasc" / "lama.json").write_text(json.dumps(cell))
    rs = read_result_set(root)
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
    rs = read_result_set(root)
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
    assert any("metric ppl = -1.0 is outside its domain [1, inf]" in x for x in read_result_set(root).problems)


def test_write_report_writes_where_asked_and_says_what_it_skipped(tmp_path, capsys):
    """The CLI's entry point: the default place beside the results, --out elsewhere, one line per skipped file and
    one for the cells stored twice (the fixture tree has two bad files and one repeated cell)."""
    from acbench.core.log import console_lines
    from acbench.leaderboard.report import write_report

    root = tmp_path / "results"
    shutil.copytree(FIXTURE, root)
    with console_lines():  # as the CLI says them (a library call says them to the caller's handlers)
        assert write_report(str(root)) == root / "LEADERBOARD.md"
    assert (root / "LEADERBOARD.md").read_text().startswith("# acbench leaderboard\n")
    out = capsys.readouterr().out.splitlines()
    assert [line for line in out if line.startswith("skipped: ")] == [
        "skipped: results/model-a/svd/rank-0.5/lama-corrupt.json: unreadable JSON (JSONDecodeError), skipped",
        "skipped: results/model-a/svd/rank-0.5/mmlu-k1.json: schema version 0 (this version reads 2, 3, 4), skipped"]
    assert out[-1] == "1 cell(s) stored more than once: the most recent result of each was used"
    (root / "LEADERBOARD.md").unlink()
    elsewhere = tmp_path / "board" / "mine.md"
    elsewhere.parent.mkdir()
    assert write_report([root], out=str(elsewhere)) == elsewhere
    assert elsewhere.exists() and elsewhere.with_suffix(".csv").exists() and not (root / "LEADERBOARD.md").exists()


def test_write_report_refusals_in_full(tmp_path, monkeypatch):
    from acbench.core.errors import UserError
    root = tmp_path / "results"
    shutil.copytree(FIXTURE, root)
    with pytest.raises(UserError) as e:
        report.write_report([root, tmp_path / "nope"])
    assert str(e.value) == (f"results folder {tmp_path / 'nope'} does not exist: run `bench run` first or pass "
                            "--results DIR")
    with pytest.raises(UserError) as e:
        report.write_report(str(root), out=str(tmp_path))
    assert str(e.value) == (f"--out {tmp_path} is a folder: pass the markdown file to write, e.g. "
                            f"{tmp_path / 'LEADERBOARD.md'}")
    seen = []

    def refused(roots, out_md, ref, display):
        seen.append((roots, out_md, ref, display))
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(report, "build_report", refused)
    mine = report.Display()  # equal to the default, so forwarded is checked by identity
    with pytest.raises(UserError) as e:
        report.write_report(str(root), out=str(tmp_path / "b.md"), ref="svd", display=mine)
    assert str(e.value) == (f"cannot write the leaderboard to {tmp_path / 'b.md'} (Permission denied): pass --out "
                            "<path in a writable folder>")
    assert seen[0][:3] == ([root], tmp_path / "b.md", "svd") and seen[0][3] is mine
    monkeypatch.setattr(report, "build_report", lambda *a: (_ for _ in ()).throw(OSError()))
    with pytest.raises(UserError, match=r"\(OSError\): pass --out"):
        report.write_report(str(root))


# ---------------------------------------------------------------- the tables' arithmetic on hand rows (issue 51)

def _rec(method, task, value, metric, higher, *, model="m", rank=0.5, budget="rank", allocation="uniform",
         scope="all", kind="task", stderr=None, **parts):
    from acbench.core.record import CellId, CellRecord

    return CellRecord(cell=CellId(model=model, method=method, rank=None if method == "dense" else rank, budget=budget,
                                  task=task, allocation=allocation, scope=scope, kind=kind),
                      metrics={metric: value}, primary_metric=metric, higher_is_better={metric: higher},
                      stderr=stderr or {}, **parts)


def test_a_row_in_full_from_its_cells():
    from acbench.leaderboard.tables import metric_columns, variant_row

    lama = _rec("pca", "lama", 0.6, "acc", True, stderr={"acc": 0.02},
                compression={"compute_ratio": 0.4, "n_fallbacks": 2, "measured_density": 0.45},
                memory={"weight_bytes": 3 * 2 ** 20, "peak": {"working_bytes": 2 ** 20}},
                latency={"prefill_ms_per_token": 1.5, "decode_ms_per_token": 20.0, "converged": True,
                         "speedup": {"decode_body": {"ratio": 1.4, "ci95": [1.3, 1.5]},
                                     "decode": {"ratio": 1.2, "ci95": [1.1]},
                                     "prefill_body": {"ratio": float("nan"), "ci95": [1.0, 2.0]}},
                         "body_overhead": {"dense_body_ms": 30.0, "floor_ms": 10.0}})
    ppl = _rec("pca", "ppl", 12.0, "ppl", False,
               compression={"param_ratio": 0.5, "activation_ratio": 0.3, "compute_ratio": 0.9, "n_fallbacks": 0,
                            "measured_density": 0.55},
               memory={"weight_bytes": 1, "peak": {"working_bytes": 3 * 2 ** 20}})
    columns = metric_columns([lama, ppl])
    assert [(c.label, c.task, c.metric, c.higher) for c in columns] == [("lama acc", "lama", "acc", True),
                                                                        ("ppl ppl", "ppl", "ppl", False)]
    row = variant_row([lama, ppl], columns)
    assert row.pop("decode speedup (body) ci") == (1.3, 1.5)
    assert row == pytest.approx({
        "lama acc": 0.6, "lama acc stderr": 0.02, "ppl ppl": 12.0, "ppl ppl stderr": None,
        "param ratio": 0.5, "compute ratio": 0.4, "activation ratio": 0.3,  # the first cell that has each
        "weight MB": 3.0, "peak MB": 6.0,  # 3 MiB of weights + the larger working set, 3 MiB
        "prefill ms/tok": 1.5, "decode ms/tok": 20.0,
        "decode speedup (body)": 1.4, "decode speedup": 1.2,
        "decode speedup ci": None,  # an interval of one end is no interval
        "fallbacks": 2, "measured density": 0.5, "decode converged": True,
        # the bytes bound from the measured density (0.5, not the compute ratio), the ceiling from the floor
        "bytes bound": 2.0, "of bound": 0.7, "ceiling (body)": 30 / (10 + 20 / 2), "of ceiling": 1.4 / 1.5})
    bare = variant_row([_rec("svd", "lama", 0.5, "acc", True)], columns)
    assert bare == {"lama acc": 0.5, "lama acc stderr": None, "ppl ppl": None, "ppl ppl stderr": None,
                    "param ratio": None, "compute ratio": None, "activation ratio": None, "weight MB": None,
                    "peak MB": None, "prefill ms/tok": None, "decode ms/tok": None, "fallbacks": None,
                    "measured density": None, "decode converged": None}
    # working sets without weights, and weights without working sets: no peak
    assert variant_row([_rec("svd", "lama", 0.5, "acc", True, memory={"peak": {"working_bytes": 5}})],
                       columns)["peak MB"] is None
    assert variant_row([_rec("svd", "lama", 0.5, "acc", True, memory={"weight_bytes": 2 ** 20})],
                       columns)["peak MB"] is None


def test_columns_follow_the_display_and_analyses_have_none():
    from acbench.leaderboard.tables import Display, metric_columns

    cells = [_rec("dense", "zeta", 1.0, "acc", True), _rec("dense", "ppl", 3.0, "ppl", False),
             _rec("dense", "alpha", 2.0, "f1", None), _rec("dense", "lama", 0.5, "acc", True),
             _rec("rho-analysis", "rho", 0.1, "rho", None, kind="analysis")]
    display = Display(labels={"lama": "LAMA acc", "ppl": "PPL"}, order={"lama": 0, "ppl": 1})
    cols = metric_columns(cells, display)
    # labelled tasks in their order, then the others by name; a task without a label is "<task> <metric>"
    assert [(c.label, c.higher) for c in cols] == [("LAMA acc", True), ("PPL", False), ("alpha f1", None),
                                                   ("zeta acc", True)]
    assert [c.label for c in metric_columns(cells)] == ["alpha f1", "lama acc", "ppl ppl", "zeta acc"]
    # a task seen again (another method's cell) does not stop the ones after it
    again = [_rec("dense", "lama", 0.5, "acc", True), _rec("pca", "lama", 0.4, "acc", True),
             _rec("pca", "ppl", 3.0, "ppl", False)]
    assert [c.label for c in metric_columns(again)] == ["lama acc", "ppl ppl"]
    assert [c.label for c in metric_columns(cells, Display(order={"zeta": 5}))] == [
        "zeta acc", "alpha f1", "lama acc", "ppl ppl"]  # unordered tasks after the highest position


def test_rank_table_recovery_deltas_and_speedups_on_hand_rows(monkeypatch):
    """Recovery averages over the tasks dense is above chance on, higher-is-better only; paired differences against
    the reference on the tasks both have; an old cell's speedup is dense's time over its own; dense's are 1."""
    import acbench.leaderboard.tables as tables

    monkeypatch.setattr(tables, "above_chance", lambda c: {"above": c.cell.task == "lama"})  # mmlu at chance

    def compare(ref, other):
        if ref.cell.task == "mmlu":
            return None  # no paired records
        m = ref.primary_metric
        return {"diff": other.metrics[m] - ref.metrics[m], "ci95": (-1.0, 1.0), "p": 0.04, "test": "hand"}

    monkeypatch.setattr(tables, "compare", compare)
    dense = [_rec("dense", "lama", 0.8, "acc", True, latency={"decode_ms_per_token": 50.0,
                                                               "prefill_ms_per_token": 2.0}),
             _rec("dense", "mmlu", 0.3, "acc", True), _rec("dense", "ppl", 10.0, "ppl", False)]
    pca = [_rec("pca", "lama", 0.6, "acc", True, compression={"param_ratio": 0.5, "compute_ratio": 0.5}),
           _rec("pca", "mmlu", 0.3, "acc", True), _rec("pca", "ppl", 12.0, "ppl", False)]
    svd = [_rec("svd", "lama", 0.4, "acc", True, latency={"decode_ms_per_token": 40.0, "prefill_ms_per_token": 1.0}),
           _rec("svd", "mmlu", 0.25, "acc", True), _rec("svd", "ppl", 20.0, "ppl", False)]
    rows = tables.rank_table(dense, {"svd": svd, "pca": pca})
    assert [r["method"] for r in rows] == ["dense", "pca", "svd"]
    d, p, s = rows
    assert (d["param ratio"], d["compute ratio"], d["activation ratio"], d["recovery %"]) == (1.0, 1.0, 1.0, 100.0)
    assert [(d[k], d[k + " ci"]) for k in tables.SPEEDUP_COLUMNS] == [(1.0, None)] * 3
    assert p["recovery %"] == pytest.approx(75.0) and s["recovery %"] == pytest.approx(50.0)  # lama alone
    assert not any(k.startswith("Δ") for k in p)  # the reference has no difference to itself
    assert {k: v for k, v in s.items() if k.startswith("Δ")} == pytest.approx({
        "Δ lama acc vs pca": -0.2, "Δ lama acc vs pca lo": -1.0, "Δ lama acc vs pca hi": 1.0,
        "Δ lama acc vs pca p": 0.04, "Δ lama acc vs pca test": "hand",
        "Δ ppl ppl vs pca": 8.0, "Δ ppl ppl vs pca lo": -1.0, "Δ ppl ppl vs pca hi": 1.0, "Δ ppl ppl vs pca p": 0.04,
        "Δ ppl ppl vs pca test": "hand",
        # significant (p 0.04) in each metric's worse direction; no records, so no count and nothing detectable
        "Δ lama acc vs pca verdict": "worse", "Δ ppl ppl vs pca verdict": "worse",
        "Δ lama acc vs pca n": None, "Δ ppl ppl vs pca n": None,
        "Δ lama acc vs pca detectable": None, "Δ ppl ppl vs pca detectable": None})
    # an old cell (its own times only): dense's over its own, no interval; a row without times gets none
    assert (s["decode speedup"], s["decode speedup ci"]) == (1.25, None)
    assert (s["prefill speedup (body)"], s["prefill speedup (body) ci"]) == (2.0, None)
    assert "decode speedup" not in p
    broken = [_rec("asvd", "lama", 0.4, "acc", True, latency={"decode_ms_per_token": 0.0})]
    assert "decode speedup" not in tables.rank_table(dense, {"asvd": broken})[1]  # a time of 0 is no time
    # chance is asked only of dense's higher-is-better tasks, in column order; a column dense lacks is skipped
    cols = tables.metric_columns(dense) + [tables.Column("NQ acc", "nq", "acc", True)]
    assert tables.chance_table(dense, cols) == {"lama": {"above": True}, "mmlu": {"above": False}}
    # against svd instead: pca's differences are svd's negated, and nothing at all without a compressed ratio
    rows = tables.rank_table(dense, {"svd": svd}, ref="svd")
    assert rows[0]["compute ratio"] is None and rows[0]["activation ratio"] is None
    assert [r["method"] for r in rows] == ["dense", "svd"]
    # without dense cells: no recovery, no speedups from times
    rows = tables.rank_table([], {"svd": svd, "pca": pca})
    assert [r["method"] for r in rows] == ["pca", "svd"] and rows[1]["recovery %"] is None
    assert "decode speedup" not in rows[1]


def test_missing_cells_and_section_order():
    from acbench.leaderboard.tables import group_cells, missing_cells, section_order

    cells = [_rec("dense", "lama", 0.8, "acc", True), _rec("pca", "lama", 0.5, "acc", True),
             _rec("pca", "ppl", 9.0, "ppl", False), _rec("svd", "lama", 0.4, "acc", True, rank=0.25),
             _rec("fasc", "lama", 0.4, "acc", True, rank=0.5, scope="groups=mlp_in"),
             _rec("wanda", "lama", 0.4, "acc", True, rank=0.5, budget="2:4"),
             _rec("rho-analysis", "rho", 0.1, "rho", None, kind="analysis")]
    g = group_cells(cells)
    assert set(g) == {"m"} and [c.cell.task for c in g["m"]["dense"]] == ["lama"]
    assert set(g["m"]["analyses"]) == {"rho"} and set(g["m"]["analyses"]["rho"]) == {("rank", 0.5)}
    assert missing_cells(g) == [
        # every row of a budget and scope at every ratio seen there, every task seen for the model
        "m / svd / rank 0.5 / lama", "m / svd / rank 0.5 / ppl",  # the sections in order, the rows by name
        "m / pca / rank 0.25 / lama", "m / pca / rank 0.25 / ppl", "m / svd / rank 0.25 / ppl",
        "m / wanda / 2:4 0.5 / ppl", "m / fasc / rank 0.5 (groups mlp_in) / ppl", "m / dense / ppl"]
    keys = [("rank", 0.25, "all"), ("unstructured", 0.5, "all"), ("16:32", 0.5, "all"), ("2:4", 0.5, "all"),
            ("params", 0.5, "all"), ("rank", 0.5, "groups=mlp_in"), ("rank", 0.5, "all"), ("2:4", 0.25, "all"),
            ("rank", 0.5, "blocks=0"), ("params", 0.25, "all"), ("64:128", 0.5, "all")]
    assert sorted(keys, key=section_order) == [
        ("params", 0.5, "all"), ("params", 0.25, "all"), ("rank", 0.5, "all"), ("rank", 0.25, "all"),  # by budget,
        # then ratio descending; sparsity at density 0.5: by M (a block of 128 included), unstructured last
        ("2:4", 0.5, "all"), ("16:32", 0.5, "all"), ("64:128", 0.5, "all"), ("unstructured", 0.5, "all"),
        ("2:4", 0.25, "all"),  # then the lower density
        ("rank", 0.5, "blocks=0"), ("rank", 0.5, "groups=mlp_in")]  # scoped sections last, by scope


def test_allocation_k_reads_well_formed_groups_only():
    from acbench.leaderboard.tables import allocation_k

    groups = [{"group": "layers.0.mlp_in", "k": 4, "d_in": 8}, {"group": "layers.x.mlp_in", "k": 4, "d_in": 8},
              {"group": "lm_head", "k": 4, "d_in": 8}, {"group": "layers.1.attn_in", "k": None, "d_in": 8},
              {"group": "layers.2.attn_in", "k": 2, "d_in": True}, {"group": "layers.3.mlp_out", "k": 2.5,
                                                                    "d_in": 16}, {"k": 3, "d_in": 8}]  # unnamed
    first = _rec("pca", "lama", 0.5, "acc", True, allocation="fisher", compression={"groups": groups})
    later = _rec("pca", "ppl", 9.0, "ppl", False, allocation="fisher", compression={"groups": groups[:1]})
    empty = _rec("svd", "lama", 0.5, "acc", True, compression={"groups": [{"group": "lm_head"}]})
    assert allocation_k([first, later, empty, _rec("asvd", "lama", 0.5, "acc", True)]) == {"pca+fisher": [
        {"group": "layers.0.mlp_in", "block": 0, "kind": "mlp_in", "k": 4, "d_in": 8},
        {"group": "layers.3.mlp_out", "block": 3, "kind": "mlp_out", "k": 2.5, "d_in": 16}]}


def test_small_formatters():
    from acbench.leaderboard.tables import budget_title, fmt_interval, file_slug, is_number

    assert fmt_interval(0.1524, 0.0581, 0.2069, 0.0015) == "+0.152 [+0.058, +0.207] p=0.0015 *"
    assert fmt_interval(-0.1, -0.3, 0.1, 0.05) == "-0.100 [-0.300, +0.100] p=0.05"  # p = alpha is not below it
    assert fmt_interval(0.0, 0.0, 0.0, 0.0499) == "+0.000 [+0.000, +0.000] p=0.05 *"
    assert file_slug("fasc-kfac+fisher @ rank 0.5/x_y.z") == "fasc-kfac_fisher___rank_0.5_x_y.z"
    assert [is_number(x) for x in (1, 0.5, True, float("nan"), float("inf"), "1", None)] == [
        True, True, False, False, False, False, False]
    assert budget_title("rank", 0.5) == "rank ratio 0.5" and budget_title("params", 0.25) == "params ratio 0.25"
    assert budget_title("2:4", 0.5) == "N:M 2:4 sparsity (density 0.5)"
    assert budget_title("unstructured", 0.3) == "unstructured sparsity, density 0.3"


def test_golden_markdown_of_both_families(tmp_path):
    """A full sweep's leaderboard on one model (tests/fixtures/make_results.py writes its tree): low-rank at two
    ratios with a Fisher allocation and a scoped section, N:M and unstructured sparsity, measured speed with its
    bounds and ceilings (one row not converged), a task at chance, the machine line, both families at one compute
    ratio, and the quality-against-speed figure. Every number and sentence of it checked once by hand."""
    root = tmp_path / "results"
    shutil.copytree(Path(__file__).parent / "fixtures" / "results_families", root)
    info = build_report([root], tmp_path / "LEADERBOARD.md", display=report_display())
    assert (info["missing"], info["problems"], info["duplicates"]) == ([], [], 0)
    assert [p.name for p in info["plots"]] == [
        "model-c_k_rank_0.5.png", "model-c_k_rank_0.25.png", "model-c_accuracy_vs_rank.png",
        "model-c_ppl_vs_params.png", "model-c_ppl-token_vs_compute.png", "model-c_quality_vs_speed.png"]
    expected = (Path(__file__).parent / "fixtures" / "expected_leaderboard_families.md").read_text()
    assert (tmp_path / "LEADERBOARD.md").read_text() == expected
    # the same rows as JSON and CSV: each row's place first (model, budget, ratio, scope, method), then its values
    text = (tmp_path / "LEADERBOARD.json").read_text()
    assert text.startswith('[\n  {\n    "model": "model-c",\n    "budget": "rank",\n    "rank": 0.5,\n    "scope": "all"')
    golden = Path(__file__).parent / "fixtures" / "expected_leaderboard_families"
    assert rounded(json.loads(text)) == rounded(json.loads(golden.with_suffix(".json").read_text()))
    assert _csv_values(tmp_path / "LEADERBOARD.csv") == _csv_values(golden.with_suffix(".csv"))


def rounded(v):
    """Floats to 10 digits, tuples as lists, keys as strings: data compared across machines' last bits."""
    if isinstance(v, float):
        return float(f"{v:.10g}")
    if isinstance(v, dict):
        return {str(k): rounded(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [rounded(x) for x in v]
    return v


def _csv_values(path):
    """A CSV's header, then its cells with every JSON-readable value (numbers, lists) read and rounded."""
    def value(v):
        try:
            return rounded(json.loads(v))
        except ValueError:
            return v

    header, *rows = csv.reader(open(path, newline=""))
    return header, [[value(v) for v in r] for r in rows]


def _plot_inputs(root, out, monkeypatch):
    """What the leaderboard hands each figure of `root`'s tree: (figure, its data, file name), floats to 10 digits."""
    import acbench.leaderboard.plots as plots

    calls = []

    for name in ("k_by_block", "metric_vs_compute", "quality_vs_speed", "accuracy_vs_rank", "ppl_vs_params"):
        monkeypatch.setattr(plots, name, lambda *a, _n=name: calls.append([_n, rounded(list(a[:-1])), a[-1].name])
                            or a[-1])
    build_report([root], out, display=report_display())
    return calls


def test_what_each_figure_of_both_families_plots(tmp_path, monkeypatch):
    """The figures' data, pinned as the tables' are (the PNGs themselves are only checked to be images): k per
    block, accuracy against rank ratio, perplexity against parameters, each family's series against compute ratio
    (a line per low-rank method, per sparsity method and M, per unstructured method), quality against measured
    decode speed with each row's interval."""
    root = tmp_path / "results"
    shutil.copytree(Path(__file__).parent / "fixtures" / "results_families", root)
    got = _plot_inputs(root, tmp_path / "LEADERBOARD.md", monkeypatch)
    want = json.loads((Path(__file__).parent / "fixtures" / "expected_plot_inputs_families.json").read_text())
    assert got == want


def test_what_each_figure_of_the_low_rank_tree_plots(tmp_path, monkeypatch):
    root = tmp_path / "results"
    shutil.copytree(FIXTURE, root)
    got = _plot_inputs(root, tmp_path / "LEADERBOARD.md", monkeypatch)
    assert got == json.loads((Path(__file__).parent / "fixtures" / "expected_plot_inputs.json").read_text())


def test_report_lines_in_full_on_hand_input(tmp_path):
    """The small pieces the goldens pass through only one way: the perplexity format past 1e5, the parameter and
    compute warnings word for word, the machine and bounds lines with parts missing, the header of an undated
    compressed checkpoint, rows of one allocation sharing a label, an analysis whose details cannot be rendered."""
    from acbench.core.record import CellId, CellRecord
    from acbench.leaderboard.tables import Display

    assert [formatting._num(v, "ppl") for v in (12.3456, 99999.994, 1e5, 4.671e8)] == ["12.35", "99999.99", "1e+05",
                                                                                   "4.67e+08"]
    assert formatting._num(0.12345, "{:.3f}") == "0.123"
    rows = [{"method": "dense", "compute ratio": 1.0}, {"method": "wanda", "compute ratio": 0.5},
            {"method": "act-sparse", "compute ratio": 0.52}, {"method": "teal", "compute ratio": 0.504}]
    assert formatting.param_ratio_warning(rows, "compute ratio") == [
        "**Unequal budgets:** compute ratios in this table range from 0.500 (teal, wanda) to 0.520 (act-sparse).", ""]
    assert formatting.param_ratio_warning([{"method": "a", "param ratio": 0.5}, {"method": "b", "param ratio": 0.52}]) == [
        "**Unequal budgets:** parameter ratios in this table range from 0.500 (a) to 0.520 (b), more than 0.01 "
        "apart; rows are not compared at equal size (`--budget params` sets the same parameter ratio for every "
        "method).", ""]
    assert formatting.param_ratio_warning([{"method": "a", "param ratio": 0.0}, {"method": "b", "param ratio": 0.01}]) == []
    assert sections.machine_line({"cpu_model": "X"}) == "- machine: X"
    assert sections.machine_line({"cpu_model": "X", "cpus_available": 2, "torch_blas": "openblas"}) == (
        "- machine: X; 2 CPUs available, None threads used; torch BLAS openblas")

    def cell(**kw):
        return CellRecord(cell=CellId("m", "pca", 0.5, "rank", "lama", "k"), metrics={"p@1": 0.5},
                          primary_metric="p@1", **kw)

    assert sections.bounds_line([cell(latency={"conditions": {"memory_bandwidth": {}}})]) == []
    assert sections.bounds_line([cell(latency={"conditions": {"memory_bandwidth": {"copy_gb_s": 1.0}},
                                             "body_overhead": {"dense_body_ms": 3.0, "floor_ms": 1.25}})]) == [
        "- what bounds decode here: dense body decode 3.00 ms/token, of which 1.25 ms outside the linear products "
        "(the overhead floor)"]
    assert sections.bounds_line([cell(latency={"conditions": None}), cell()]) == []
    # a probe's part is printed only whole: a speed without its shape, a body time without its floor
    assert sections.bounds_line([cell(latency={"conditions": {"memory_bandwidth": {}, "dense_product": {"gb_s": 5.0}},
                                             "body_overhead": {"dense_body_ms": 3.0}})]) == []
    head = sections._header([cell(model_fingerprint={"sha256": "a" * 40, "compressed": "from pca at 0.5"})])
    assert head[:2] == ["- model fingerprint: sha256=aaaaaaaaaaaaaaaa", "- compressed checkpoint: from pca at 0.5"]
    assert head[-1] == "- results undated" and "- seed: " in head
    # two rows whose allocations put the same k everywhere share one line of the k table
    ks = [{"group": f"layers.{b}.mlp_in", "k": 2 + b, "d_in": 8} for b in range(2)]
    alloc = {"rule": "fisher", "allocated_params": 1234, "budget_params": 1300, "allocated_ratio": 0.25,
             "seconds": {"scores": 0.5, "allocate": 0.25}}

    def fisher(method):
        return CellRecord(cell=CellId("m", method, 0.5, "rank", "lama", "k", allocation="fisher"),
                          metrics={"p@1": 0.5}, primary_metric="p@1",
                          compression={"allocation": alloc, "groups": ks})

    written = []
    lines = sections.allocation_section({"pca+fisher": [fisher("pca")], "svd+fisher": [fisher("svd")],
                                       "asvd": [_rec("asvd", "lama", 0.5, "p@1", True, compression={"groups": ks})]},
                                      "m", "rank", 0.5, "groups=mlp_in", tmp_path, written)
    assert lines[:5] == ["Rank allocation (budget over the compressed groups):", "",
                         "- pca+fisher: 1,234 of a 1,300-parameter budget (0.2500 of dense), allocated in 0.75 s",
                         "- svd+fisher: 1,234 of a 1,300-parameter budget (0.2500 of dense), allocated in 0.75 s", ""]
    assert "| asvd, pca+fisher, svd+fisher | mlp_in  | 2 3          |" in lines[7]
    assert [p.name for p in written] == ["m_k_rank_0.5_groups_mlp_in.png"]
    assert sections.allocation_section({"asvd": [_rec("asvd", "lama", 0.5, "p@1", True, compression={"groups": ks})]},
                                     "m", "rank", 0.5, "all", tmp_path, written) == []

    def broken(cell, plot_dir, stem, title):
        raise KeyError("units")

    g = {"analyses": {"rho": {("rank", 0.5): _rec("rho-analysis", "rho", 0.25, "rho_mean", None, kind="analysis")}}}
    assert sections.analysis_sections(g, "m", Display(sections={"rho": broken}), tmp_path, []) == [
        "### rho at rank ratio 0.5", "", "*rho: its details could not be rendered (KeyError); its metrics:*", "",
        "| metric   | value   |\n|----------|---------|\n| rho_mean | 0.25    |", ""]
    assert sections.analysis_sections(g, "m", Display(), tmp_path, [])[2:] == [
        "| metric   | value   |\n|----------|---------|\n| rho_mean | 0.25    |", ""]


def test_bold_chance_and_the_cross_family_reference_edges(tmp_path, monkeypatch):
    from acbench.leaderboard.load import read_result_set
    from acbench.leaderboard.tables import Column, group_cells, metric_columns

    col = Column("acc", "t", "acc", True)
    rows = [{"method": "dense", "acc": 0.5}, {"method": "a", "acc": 0.5}, {"method": "b", "acc": 0.4}]
    table = formatting.markdown_table(rows, "b", [col])
    assert table.splitlines()[2:] == ["| dense    | 0.500     |", "| a        | **0.500** |",  # dense: never bold
                                      "| b (ref)  | 0.400     |"]
    # a task without a chance level is skipped, not the end of the note
    monkeypatch.setattr(formatting, "chance_table", lambda cells, columns=None: {
        "x": None, "lama": {"acc": 0.6, "chance": 0.1, "n": 40, "p": 1e-9, "above": True}})
    assert formatting.chance_note([]) == [
        "- recovery % averages the accuracy tasks where dense is significantly above chance (each item's chance "
        "level as its task records it): lama dense 0.600 vs chance 0.100 (n=40, one-sided p=1e-09): above chance"]
    monkeypatch.undo()
    g = group_cells(read_result_set(Path(__file__).parent / "fixtures" / "results_families").cells)["model-c"]
    cells = g["dense"] + [c for per in g["ranks"].values() for cs in per.values() for c in cs]
    columns = metric_columns(cells)
    # a reference method that is not among the matched rows: no differences, no failure
    lines = sections.cross_family_section(g, {}, columns, "model-c", "svd", tmp_path, [])
    assert lines[0] == "### Both families at compute ratio 0.5" and not any("Δ" in line for line in lines)
    asked = []
    monkeypatch.setattr(sections, "matched_compute", lambda sections, target: asked.append(target) or {})
    sections.cross_family_section(g, {}, columns, "model-c", "pca", tmp_path, [], target=0.25)
    assert asked == [0.25]


def test_the_both_families_figure_on_hand_rows(tmp_path, monkeypatch):
    """The compute-ratio figure's data on hand rows: the first loss-like column, else the first column; no dense
    line without a dense row; a scoped section skipped (not the end of the loop); a row without a value or a
    compute ratio left out; no columns, no figure."""
    from acbench.core.record import ALL_GROUPS
    from acbench.leaderboard.tables import Column

    got = []
    monkeypatch.setattr(plots, "metric_vs_compute", lambda points, dense, label, lower, title, path:
                        got.append([points, dense, label, lower, path.name]) or path)
    monkeypatch.setattr(sections, "matched_compute", lambda sections, target: {})
    g = {"dense": [], "ranks": {("rank", 0.5, ALL_GROUPS): {}, ("2:4", 0.5, ALL_GROUPS): {}}}
    acc, acc2 = Column("lama p@1", "lama", "p@1", True), Column("mmlu acc", "mmlu", "acc", True)
    nll = Column("wikitext ppl", "wikitext", "ppl", False)
    section_rows = {
        ("rank", 0.5, "groups=mlp_in"): [{"method": "pca", "compute ratio": 0.1, "lama p@1": 0.9}],
        ("rank", 0.5, ALL_GROUPS): [{"method": "dense", "compute ratio": 1.0, "lama p@1": 0.8, "wikitext ppl": 9.0},
                                    {"method": "pca", "compute ratio": 0.6, "lama p@1": 0.5, "wikitext ppl": 12.0},
                                    {"method": "svd", "compute ratio": 0.6},
                                    {"method": "asvd", "lama p@1": 0.45, "wikitext ppl": 11.0}],
        ("2:4", 0.5, ALL_GROUPS): [{"method": "act-sparse", "compute ratio": 0.5, "lama p@1": 0.4}],
        ("unstructured", 0.3, ALL_GROUPS): [{"method": "teal", "param ratio": 0.3, "lama p@1": 0.2}],
    }
    written = []
    lines = sections.cross_family_section(g, section_rows, [acc, acc2], "m", "pca", tmp_path, written)
    assert got == [[{"pca": [(0.6, 0.5)], "act-sparse @ N:4": [(0.5, 0.4)], "teal (unstructured)": [(0.3, 0.2)]},
                    None, "lama p@1", False, "m_lama_vs_compute.png"]]
    assert lines[-2:] == ["![lama p@1 vs compute ratio](plots/m_lama_vs_compute.png)", ""]
    assert [p.name for p in written] == ["m_lama_vs_compute.png"]
    got.clear()
    sections.cross_family_section(g, section_rows, [acc, nll], "m", "pca", tmp_path, [])
    assert got == [[{"pca": [(0.6, 12.0)]}, None, "wikitext ppl", True, "m_wikitext_vs_compute.png"]]
    got.clear()
    sections.cross_family_section(g, {}, [acc], "m", "pca", tmp_path, written)
    assert got == [] and len(written) == 1  # a column but no row to plot: no figure
    lines = sections.cross_family_section(g, section_rows, [], "m", "pca", tmp_path, written)
    assert got == [] and len(written) == 1 and lines[0] == "### Both families at compute ratio 0.5"


def test_the_quality_against_speed_figure_on_hand_rows(tmp_path, monkeypatch):
    """The frontier figure's data on hand rows: only sections over all groups that open with dense, only rows
    with a measured interval; Δ NLL only where both perplexities are positive numbers, each accuracy wherever
    the row has it; point labels per family."""
    from acbench.core.record import ALL_GROUPS
    from acbench.leaderboard.tables import Column

    got = []
    monkeypatch.setattr(plots, "quality_vs_speed", lambda panels, title, path: got.append([panels, path.name]) or path)
    columns = [Column("ppl ppl", "ppl", "ppl", False), Column("lama p@1", "lama", "p@1", True)]
    t = {"decode speedup": 1.5, "decode speedup ci": (1.25, 1.75)}
    dense = {"method": "dense", "ppl ppl": 10.0, "lama p@1": 0.5}
    scoped = {("rank", 0.5, "groups=mlp_in"): [dense, {"method": "pca", **t, "ppl ppl": 11.0, "lama p@1": 0.4}]}
    section_rows = {
        **scoped,
        ("rank", 0.4, ALL_GROUPS): [],
        ("rank", 0.3, ALL_GROUPS): [{"method": "pca", **t, "ppl ppl": 11.0}],  # no dense row
        ("rank", 0.5, ALL_GROUPS): [dense, {"method": "pca", **t, "ppl ppl": 20.0, "lama p@1": 0.4},
                                    {"method": "svd", **t, "lama p@1": 0.3},
                                    {"method": "asvd", **t, "ppl ppl": 0.0, "lama p@1": 0.2},
                                    {"method": "fasc", **t, "ppl ppl": 0.5, "lama p@1": 0.1},
                                    {"method": "whitened", "decode speedup": 1.2, "lama p@1": 0.3}],
        ("2:4", 0.5, ALL_GROUPS): [{"method": "dense", "ppl ppl": 0.0, "lama p@1": 0.5},
                                   {"method": "act-sparse", **t, "ppl ppl": 12.0, "lama p@1": 0.45}],
        ("unstructured", 0.25, ALL_GROUPS): [{"method": "dense", "ppl ppl": 0.5},
                                             {"method": "teal", **t, "ppl ppl": 1.0}],
    }
    written = []
    lines = sections.frontier_section({}, section_rows, columns, "m", tmp_path, written)
    band = (1.5, 1.25, 1.75)
    assert got == [[{"Δ NLL vs dense (ppl ppl)": {"low-rank": [("pca @ rank 0.5", *band, math.log(2.0)),
                                                                ("fasc @ rank 0.5", *band, math.log(0.05))],
                                                   "sparsity": [("teal @ 0.25", *band, math.log(2.0))]},
                     "lama p@1": {"low-rank": [("pca @ rank 0.5", *band, 0.4), ("svd @ rank 0.5", *band, 0.3),
                                               ("asvd @ rank 0.5", *band, 0.2), ("fasc @ rank 0.5", *band, 0.1)],
                                  "sparsity": [("act-sparse @ 2:4", *band, 0.45)]}},
                    "m_quality_vs_speed.png"]]
    assert lines[0] == "### Quality against measured speed" and lines[-2:] == [
        "![quality vs measured decode speedup](plots/m_quality_vs_speed.png)", ""]
    assert [p.name for p in written] == ["m_quality_vs_speed.png"]
    got.clear()
    assert sections.frontier_section({}, scoped, columns, "m", tmp_path, written) == [] and got == []


def test_a_model_evaluated_as_loaded(tmp_path):
    """A model with dense cells only (a saved checkpoint evaluated as it is) gets its own section, its columns
    labelled as the display asks, and its row in the JSON and CSV after the other models' rows."""
    from acbench.leaderboard.tables import Display

    root = tmp_path / "results"
    for part in ("model-a/dense", "model-a/pca", "model-b/dense"):
        shutil.copytree(FIXTURE / part, root / part)
    out = tmp_path / "LEADERBOARD.md"
    build_report([root], out, display=Display(labels={"lama": "LAMA p@1"}))
    text = out.read_text()
    section = text[text.index("## model-b"):].splitlines()
    at = section.index("### As loaded (no compression in this run)")
    assert section[at + 2].split("|")[1:5] == [" method   ", " LAMA p@1 ↑    ", " mmlu acc ↑    ", " ppl-token ppl ↓   "]
    assert section[at + 4].split("|")[1:5] == [" dense    ", " 0.640 ± 0.050 ", " 0.360 ± 0.020 ", " 22.27 ± 1.00      "]
    rows = json.loads(out.with_suffix(".json").read_text())
    assert [r["model"] for r in rows][-1] == "model-b" and rows[0]["model"] == "model-a"
    loaded = rows[-1]
    assert {k: loaded[k] for k in ("model", "budget", "rank", "scope", "method", "LAMA p@1", "mmlu acc")} == {
        "model": "model-b", "budget": None, "rank": None, "scope": None, "method": "dense", "LAMA p@1": 0.64,
        "mmlu acc": 0.36}
    table = list(csv.DictReader(out.with_suffix(".csv").open()))
    assert (table[-1]["model"], table[-1]["budget"], table[-1]["LAMA p@1"]) == ("model-b", "", "0.64")
    build_report([root / "model-b"], out, ref="dense")  # --vs dense: the loaded row is the reference
    assert "| dense (ref) | 0.640 ± 0.050 |" in out.read_text()


def test_the_across_ranks_table_and_figures_on_hand_rows(tmp_path, monkeypatch):
    """Across rank ratios on hand rows: one accuracy column alone stays as printed ("0.500", not re-read as a
    number), a missing value is blank; without a dense row the figures get no dense mark; without a loss column
    no loss figure; the loss figure takes only rows with both a parameter ratio and a loss."""
    from acbench.leaderboard.tables import Column

    calls = []
    monkeypatch.setattr(plots, "accuracy_vs_rank", lambda series, dense, model, path:
                        calls.append(["accuracy", series, dense]) or path)
    monkeypatch.setattr(plots, "ppl_vs_params", lambda pts, dense, model, path: calls.append(["loss", pts, dense]) or path)
    acc, ppl = Column("lama p@1", "lama", "p@1", True), Column("ppl ppl", "ppl", "ppl", False)
    cross = {"pca": {0.5: {"lama p@1": 0.5, "ppl ppl": 12.0, "param ratio": 0.5},
                     0.25: {"lama p@1": 0.25, "param ratio": 0.25}},
             "svd": {0.5: {"ppl ppl": 20.0}}}
    assert sections.across_ranks_section({"dense": []}, cross, "m", "pca", [acc], tmp_path, []) == [
        "### Across rank ratios (lama p@1)", "",
        "| method   | 0.5   | 0.25   |\n|----------|-------|--------|\n| pca      | 0.500 | 0.250  |\n"
        "| svd      |       |        |", "", "![accuracy vs rank ratio](plots/m_accuracy_vs_rank.png)", ""]
    accuracy = ["accuracy", {"lama p@1": {"pca": [(0.5, 0.5), (0.25, 0.25)], "svd": []}}, {"lama p@1": None}]
    assert calls == [accuracy]
    calls.clear()
    written = []
    lines = sections.across_ranks_section({"dense": []}, cross, "m", "pca", [acc, ppl], tmp_path, written)
    assert calls == [accuracy, ["loss", {"pca": [(0.5, 12.0)], "svd": []}, None]]
    assert lines[2].splitlines()[2:] == ["| pca      | 0.500 / 12.00 | 0.250 / |", "| svd      | / 20.00       | /       |"]
    assert [p.name for p in written] == ["m_accuracy_vs_rank.png", "m_ppl_vs_params.png"]


def test_the_json_beside_the_table_writes_any_value(tmp_path):
    """A value JSON has no type for (a path) is written as its text, not an error; the CSV has every row's keys."""
    from acbench.leaderboard.report import write_tables

    write_tables(tmp_path / "L.md", ["# t"], [{"method": "a", "model": "m", "source": Path("x") / "y"}, {"extra": 1}])
    assert json.loads((tmp_path / "L.json").read_text()) == [{"method": "a", "model": "m", "source": "x/y"},
                                                              {"extra": 1}]
    assert (tmp_path / "L.csv").read_text().splitlines() == ["model,method,extra,source", "m,a,,x/y", ",,1,"]
    assert (tmp_path / "L.md").read_text() == "# t\n"


def test_no_cells_names_the_files_it_skipped(tmp_path):
    from acbench.core.errors import UserError

    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError) as e:
        build_report([tmp_path / "empty"], tmp_path / "LEADERBOARD.md")
    assert str(e.value) == (f"no result cells under {tmp_path / 'empty'}: run `bench run` first or pass --results "
                            "<dir with results>")
    bad = tmp_path / "bad" / "m" / "dense"
    bad.mkdir(parents=True)
    (bad / "lama-k1.json").write_text("{not json")
    (tmp_path / "bad2").mkdir()
    with pytest.raises(UserError) as e:
        build_report([tmp_path / "bad", tmp_path / "bad2"], tmp_path / "LEADERBOARD.md")
    assert str(e.value).startswith(f"no result cells under {tmp_path / 'bad'}, {tmp_path / 'bad2'} (1 unreadable or "
                                   f"invalid file(s) skipped: ")
    assert str(e.value).endswith(": run `bench run` first or pass --results <dir with results>")
    assert "lama-k1.json" in str(e.value)


def test_rank_sections_on_hand_rows(tmp_path, monkeypatch):
    """Each section's lines around its table on hand rows: a low-rank section warns on parameter ratios that
    differ, a sparsity section on compute ratios, every row's numeric fallbacks in one line; no blank line for
    speed notes a section without speedups does not have; the flat rows carry each row's place."""
    from acbench.core.record import ALL_GROUPS
    from acbench.leaderboard.tables import Column

    dense = {"method": "dense", "acc": 0.5, "param ratio": 1.0}
    rows = {("rank", 0.5, ALL_GROUPS): [
                dense, {"method": "pca", "acc": 0.4, "param ratio": 0.5, "compute ratio": 0.9, "fallbacks": "1 damped"},
                {"method": "svd", "acc": 0.3, "param ratio": 0.6, "compute ratio": 0.9, "fallbacks": "2 eigh"}],
            ("2:4", 0.5, ALL_GROUPS): [
                dense, {"method": "act-sparse", "acc": 0.45, "param ratio": 1.0, "compute ratio": 0.5},
                {"method": "teal", "acc": 0.35, "param ratio": 1.0, "compute ratio": 0.7}]}
    monkeypatch.setattr(sections, "rank_table", lambda dense, by, ref, columns, margins=None: rows[next(k for k in rows if k[0] == by)])
    monkeypatch.setattr(sections, "allocation_section", lambda *a: [])
    monkeypatch.setattr(sections, "item_set_warning", lambda *a: [])  # hand rows have no cells (its own test has)
    flat = [{"model": "earlier"}]
    md, shown, cross = sections.rank_sections({"dense": [], "ranks": {k: k[0] for k in rows}}, "m", "pca",
                                            [Column("acc", "t", "acc", True)], tmp_path, [], flat)
    tables = [line for line in md if line.startswith("| method")]
    assert [line for line in md if line not in tables] == [
        "### rank ratio 0.5", "", "",
        "**Unequal budgets:** parameter ratios in this table range from 0.500 (pca) to 0.600 (svd), more than 0.01 "
        "apart; rows are not compared at equal size (`--budget params` sets the same parameter ratio for every "
        "method).", "",
        "Numeric fallbacks recorded (see the result files): pca: 1 damped, svd: 2 eigh.", "",
        "### N:M 2:4 sparsity (density 0.5)", "", "",
        "- compute ratio (theory): multiply-adds per token vs dense, not a measured speedup.", "",
        "**Unequal budgets:** compute ratios in this table range from 0.500 (act-sparse) to 0.700 (teal).", ""]
    assert len(tables) == 2 and shown == rows
    assert [(r["model"], r.get("budget"), r.get("rank"), r.get("scope"), r.get("method")) for r in flat] == [
        ("earlier", None, None, None, None)] + [("m", b, 0.5, ALL_GROUPS, r["method"]) for (b, _, _), rs in rows.items()
                                                for r in rs]
    assert cross == {"pca": {0.5: rows[("rank", 0.5, ALL_GROUPS)][1]}, "svd": {0.5: rows[("rank", 0.5, ALL_GROUPS)][2]}}


def test_the_across_models_figures_land_beside_the_leaderboard(tmp_path):
    """Two models with three methods over six (model, task) scenarios: the critical-difference diagrams are
    drawn into the leaderboard's plots folder and listed with its other figures."""
    root = tmp_path / "results"
    for model in ("model-a", "model-z"):
        for f in sorted((FIXTURE / "model-a").rglob("*.json")):
            rel = f.relative_to(FIXTURE / "model-a")
            if rel.parts[0] == "svd" or rel.name == "mmlu-k0.json":  # svd's files there are broken on purpose
                continue
            cell = json.loads(f.read_text())
            cell["cell"]["model"] = model
            copies = [(rel, cell)]
            if rel.parts[0] == "pca":  # a third method: pca's cells 1 % higher
                svd = json.loads(json.dumps(cell))
                svd["cell"]["method"] = "svd"
                svd["metrics"][svd["primary_metric"]] *= 1.01
                svd["records"] = []  # the edited metric no longer sums its records: a cell without them is read
                copies.append((Path("svd", *rel.parts[1:]), svd))
            for r, c in copies:
                (root / model / r).parent.mkdir(parents=True, exist_ok=True)
                (root / model / r).write_text(json.dumps(c))
    out = tmp_path / "board" / "LEADERBOARD.md"
    info = build_report([root], out)
    cd = ["across_models_cd_rank_0.5.png", "across_models_cd_rank_0.25.png"]
    assert [p.name for p in info["plots"]][-2:] == cd
    assert all((out.parent / "plots" / name).stat().st_size > 0 for name in cd)
    assert "![critical difference diagram](plots/across_models_cd_rank_0.5.png)" in out.read_text()


def test_a_reference_method_that_is_not_there(tmp_path):
    from acbench.core.errors import UserError

    with pytest.raises(UserError) as e:
        build_report([FIXTURE / "model-b", FIXTURE / "older-run"], tmp_path / "L.md", ref="whitened-svd")
    assert str(e.value) == (f"--vs whitened-svd: no cells of that method under {FIXTURE / 'model-b'}, "
                            f"{FIXTURE / 'older-run'}; the methods there: dense, fasc, pca")


def test_the_header_counts_the_analyses_wall_time():
    task = _rec("pca", "lama", 0.5, "p@1", True, timings={"evaluate_s": 4.0})
    rho = _rec("rho-analysis", "rho", 0.25, "rho_mean", None, kind="analysis", timings={"rho_s": 12.0})
    assert "- wall time the cells record: evaluation 4.0 s, analyses 12 s (total 16 s)" in sections._header([task], [rho])


def test_rows_with_different_allocations_get_their_own_lines(tmp_path, monkeypatch):
    """Rows whose k differ keep separate lines of the k table (rows with the same k share one); a single block's
    k stays text, left-aligned like the others; the figure gets the same merged rows."""
    from acbench.core.record import CellId, CellRecord
    drawn = []
    monkeypatch.setattr(plots, "k_by_block", lambda ks, title, path: drawn.append(ks) or path)
    alloc = {"rule": "fisher", "allocated_params": 100, "budget_params": 120, "allocated_ratio": 0.5,
             "seconds": {"scores": 1.0}}

    def row(method, k):
        return [CellRecord(cell=CellId("m", method, 0.5, "rank", "lama", "k", allocation="fisher"),
                           metrics={"p@1": 0.5}, primary_metric="p@1",
                           compression={"allocation": alloc, "groups": [{"group": "layers.0.mlp_in", "k": k,
                                                                         "d_in": 16}]})]

    lines = sections.allocation_section({"pca+fisher": row("pca", 12), "svd+fisher": row("svd", 10),
                                       "asvd+fisher": row("asvd", 12)}, "m", "rank", 0.5, "all", tmp_path, [])
    assert lines[-4].splitlines() == ["| row                     | group   | k by block   |",
                                      "|-------------------------|---------|--------------|",
                                      "| asvd+fisher, pca+fisher | mlp_in  | 12           |",
                                      "| svd+fisher              | mlp_in  | 10           |"]
    assert [{name: [g["k"] for g in per] for name, per in ks.items()} for ks in drawn] == [
        {"asvd+fisher, pca+fisher": [12], "svd+fisher": [10]}]


def test_the_perplexity_column_the_frontier_reads():
    from acbench.leaderboard.formatting import _ppl_label
    from acbench.leaderboard.tables import Column

    loss, ppl = Column("lama nll", "lama", "nll", False), Column("PPL", "ppl-token", "ppl", False)
    assert _ppl_label([loss, ppl]) == "PPL" and _ppl_label([loss]) is None and _ppl_label([]) is None
    assert _ppl_label([Column("ppl acc", "ppl-x", "acc", True)]) is None


def test_analysis_sections_order_render_and_fall_back(tmp_path):
    """Analysis cells by budget, then ratio high to low, each rendered by its analysis with its file stem and
    title (figures added to the written list), else as its metrics (a missing value blank); a cell its analysis
    cannot read is named by its file."""
    from acbench.leaderboard.tables import Display

    def cell(budget, rank):
        return _rec("rho-analysis", "rho", 0.25, "rho_mean", None, kind="analysis", budget=budget, rank=rank)

    asked = []

    def render(c, plot_dir, stem, title):
        asked.append((c.cell.budget, c.cell.rank, stem, title))
        if c.cell.budget == "params":
            raise IndexError("units")
        return [f"rendered {c.cell.rank:g}"], [plot_dir / f"{stem}.png"]

    bad = cell("params", 0.5)
    bad.source = "results/m/rho-analysis/params-0.5/rho-r1.json"
    g = {"analyses": {"rho": {("rank", 0.25): cell("rank", 0.25), ("rank", 0.5): cell("rank", 0.5), ("params", 0.5): bad},
                      "other": {("rank", 0.5): cell("rank", 0.5)}}}
    written = [tmp_path / "earlier.png"]
    md = sections.analysis_sections(g, "m/x", Display(sections={"rho": render}), tmp_path, written)
    assert asked == [("params", 0.5, "m_x_rho_params_0.5", "m/x @ 0.5"), ("rank", 0.5, "m_x_rho_rank_0.5", "m/x @ 0.5"),
                     ("rank", 0.25, "m_x_rho_rank_0.25", "m/x @ 0.25")]
    table = "| metric   | value   |\n|----------|---------|\n| rho_mean | 0.25    |"
    assert md == ["### other at rank ratio 0.5", "", table, "",
                  "### rho at params ratio 0.5", "", "*results/m/rho-analysis/params-0.5/rho-r1.json: its details "
                  "could not be rendered (IndexError); its metrics:*", "", table, "",
                  "### rho at rank ratio 0.5", "", "rendered 0.5", "",
                  "### rho at rank ratio 0.25", "", "rendered 0.25", ""]
    assert [p.name for p in written] == ["earlier.png", "m_x_rho_rank_0.5.png", "m_x_rho_rank_0.25.png"]
    g = {"analyses": {"other": {("rank", 0.5): _rec("rho-analysis", "rho", None, "rho_mean", None, kind="analysis")}}}
    assert sections.analysis_sections(g, "m", Display(), tmp_path, [])[2].splitlines()[-1] == "| rho_mean |         |"


def test_the_header_on_hand_cells(monkeypatch):
    """Header lines a golden tree does not reach: a calibration without its spec, BOS protocols that differ, wall
    time printed to a tenth of a second below 10 s and to the second from 10 s; the budget warning names every
    row exactly half the tolerance from an end."""
    a = _rec("pca", "lama", 0.5, "p@1", True, bos="bos-1", calibration={"cache": "c1"}, timings={"evaluate_s": 10.0})
    b = _rec("svd", "lama", 0.5, "p@1", True, bos="bos-0")
    rho = _rec("rho-analysis", "rho", 0.25, "rho_mean", None, kind="analysis", timings={"rho_s": 0.5})
    head = sections._header([a, b], [rho])
    dated = [_rec("pca", "lama", 0.5, "p@1", True, seed=s, env={"date": d})
             for s, d in ((1, "2026-11-03T10:00"), (0, "2026-11-01T09:00"), (1, "2026-11-02T08:00"))]
    assert "- seed: 0, 1" in sections._header(dated)
    assert sections._header(dated)[-1] == "- results dated 2026-11-01 to 2026-11-03"
    assert head[1:4] == ["- calibration: None x None tokens from None, None (x, g) pairs/group, seed None",
                         "- BOS protocol (calibration and perplexity windows; BOS never scored): bos-0, bos-1 — MIXED: "
                         "these rows are not comparable",
                         "- wall time the cells record: evaluation 10 s, analyses 0.5 s (total 10 s)"]
    monkeypatch.setattr(formatting, "PARAM_RATIO_TOLERANCE", 0.25)  # a power of two: the half is exact
    rows = [{"method": m, "param ratio": r} for m, r in (("a", 0.5), ("b", 0.625), ("c", 1.0), ("d", 0.875))]
    assert formatting.param_ratio_warning(rows)[0].startswith(
        "**Unequal budgets:** parameter ratios in this table range from 0.500 (a, b) to 1.000 (c, d), more than 0.25")


def test_a_tree_with_timed_analyses_counts_them_in_its_header(tmp_path):
    root = tmp_path / "results"
    shutil.copytree(FIXTURE / "model-b", root / "model-b")
    shutil.copytree(FIXTURE / "model-a" / "rho-analysis", root / "model-b" / "rho-analysis")
    rho = root / "model-b" / "rho-analysis" / "rank-0.5" / "rho-r1.json"
    cell = json.loads(rho.read_text())
    some_b = json.loads(next((root / "model-b").rglob("*.json")).read_text())
    cell["cell"]["model"], cell["timings"] = "model-b", {"rho_s": 7.0}
    cell["model_fingerprint"] = some_b["model_fingerprint"]  # model-b's analysis, as a run of model-b writes it
    rho.write_text(json.dumps(cell))
    build_report([root], tmp_path / "L.md")
    assert "- wall time the cells record: analyses 7.0 s (total 7.0 s)" in (tmp_path / "L.md").read_text()


def test_rows_scored_on_different_items_are_said_to_be_incomparable(tmp_path):
    """A rerun at another --ppl-windows leaves pca's perplexity over 7 windows beside the others' 8: the table says
    so, naming the rows and their item counts."""
    import math

    root = tmp_path / "results"
    shutil.copytree(Path(__file__).parent / "fixtures" / "results_families", root)
    path = root / "model-c" / "pca" / "rank-0.5" / "ppl-token-c1.json"
    cell = json.loads(path.read_text())
    cell["records"] = cell["records"][:-1]
    cell["metrics"]["ppl"] = math.exp(sum(r["nll"] for r in cell["records"]) / len(cell["records"]))
    path.write_text(json.dumps(cell))
    build_report([root], tmp_path / "L.md")
    text = (tmp_path / "L.md").read_text()
    assert "**Different items:** the ppl-token rows of this table were scored on different items (" in text
    assert "pca: 7 items" in text and text.count("**Different items:**") == 1
    clean = tmp_path / "clean"
    shutil.copytree(Path(__file__).parent / "fixtures" / "results_families", clean / "results")
    build_report([clean / "results"], clean / "L.md")
    assert "Different items" not in (clean / "L.md").read_text()
