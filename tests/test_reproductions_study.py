"""studies/reproductions.py and studies/calibration.py on hand-made cells: a verdict for every claim (reproduces,
contradicts, not detected, level), the detectable difference by hand, the cause of a contradiction named from the
cell's calibration against its authors', and the calibration study's saturation and parts."""

import math

import pytest

from conftest import hand_cell
from acbench.core.significance import Z_DETECT, detectable_difference


def _cell(model, method, task, budget, rank, values, calibration=None):
    return hand_cell(model, method, task, rank, values, budget=budget, compute=0.5, calibration=calibration)


def test_detectable_difference_by_hand():
    # NLL: paired differences 0.1, 0.3, 0.2, 0.2 -> sd 0.0816..., n 4
    a = _cell("m", "x", "ppl-token", "unstructured", 0.5, [3.0, 3.0, 3.0, 3.0])
    b = _cell("m", "y", "ppl-token", "unstructured", 0.5, [3.1, 3.3, 3.2, 3.2])
    sd = math.sqrt(sum((d - 0.2) ** 2 for d in (0.1, 0.3, 0.2, 0.2)) / 3)
    assert detectable_difference(a, b) == pytest.approx(Z_DETECT * sd / 2)
    # accuracy: 10 items, 3 discordant (2 for the second cell, 1 against), d = 0.1
    x = _cell("m", "x", "lama", "unstructured", 0.5, [1, 1, 0, 0, 1, 0, 1, 0, 1, 0])
    y = _cell("m", "y", "lama", "unstructured", 0.5, [1, 0, 1, 1, 1, 0, 1, 0, 1, 0])
    # Connor (1987) at psi 0.3, n 10, solved by hand for delta: (1.0735 + 0.2857)^2 / delta^2 = 10
    assert detectable_difference(x, y) == pytest.approx(0.429828, abs=1e-5)
    assert Z_DETECT == pytest.approx(2.8016, abs=1e-4)


AUTHORS = {"samples": 128, "seq_len": 2048, "mode": "sequential", "data": "C4 train segments", "source": "x"}
# SmolLM2 as the cells record it: 134,515,008 parameters from a 4-bit GGUF of the instruct model
SMOL = {"source": "gguf", "sha256": "x", "file": "SmolLM2-135M-Instruct.Q4_1.gguf", "alias": "m",
        "dtype": "float32", "parameters": 134515008, "loaded_dtype": "float32"}
STREAM = {"seq_len": 2048, "scored": None, "bos": "stream", "max_windows": 32, "source": "wiki"}


def _calibrated(mode=None, samples=12, seq_len=256):
    spec = {"samples": samples, "seq_len": seq_len, "seed": 0, "source": "wiki", "bos": "none", "pair_tokens": 512}
    if mode:
        spec["mode"] = mode
    return {"spec": spec, "stats": ["C"], "authors": AUTHORS}


def _paper_cell(method, budget, rank, values, calibration=None, config=STREAM, fingerprint=SMOL, allocation="uniform",
                settings=None):
    """A cell as the study stores it: 2,048-token windows of one stream, SmolLM2's fingerprint."""
    return hand_cell("m", method, "ppl-token", rank, values, budget=budget, compute=0.5, calibration=calibration,
                     task_config=dict(config), fingerprint=dict(fingerprint), allocation=allocation,
                     compression={"density": rank, "method_settings": settings or {}})


def _rows(cells):
    from acbench.studies.reproductions import rows

    return {(r[2], r[3], r[4]): r for r in rows(cells)}


def test_each_verdict_and_every_difference_computed_from_the_cells():
    from acbench.studies.reproductions import CLAIMS, rows

    dense = [3.0 + 0.01 * i for i in range(8)]
    cells = [_paper_cell("dense", "", None, dense)]
    # wanda clearly ahead of magnitude per layer (claim: reproduces); sparsegpt behind wanda on a level claim, on
    # 3,072 one-pass tokens against its authors' 262,144 sequential: contradicts, and every difference is named
    cells.append(_paper_cell("wanda", "unstructured", 0.5, [x + 0.3 for x in dense], _calibrated("sequential", 128,
                                                                                                  2048)))
    cells.append(_paper_cell("magnitude-prune:comparison=layer", "unstructured", 0.5, [x + 1.0 for x in dense],
                             settings={"comparison": "layer"}))
    cells.append(_paper_cell("sparsegpt", "unstructured", 0.5, [x + 0.5 + 0.01 * (i % 2) for i, x in enumerate(dense)],
                             _calibrated()))
    out = _rows(cells)
    level = out[("sparsegpt (density 0.5) level with wanda (density 0.5)", "ppl-token", "m")]
    assert level[10] == "contradicts (they differ)" and float(level[5]) == pytest.approx(-0.205, abs=1e-9)
    cond = level[11]
    assert "sparsegpt calibration: 12 x 256 (3,072 tokens); the authors 128 x 2048 (262,144)" in cond
    assert "sparsegpt calibration mode: one-pass; the authors sequential" in cond
    assert "wanda calibration:" not in cond and "wanda calibration mode" not in cond  # wanda ran as its authors
    # what cannot be closed offline, computed from the fingerprint: the size ratio from the parameter counts
    assert "model size: 135M parameters; the authors LLaMA-7B, 6.7B (50x larger)" in cond
    assert "model precision: float32 dequantised from 4-bit GGUF Q4_1; the authors float16" in cond
    assert "model tuning: instruct; the authors base" in cond
    assert "calibration text: acbench's Wikipedia sample; the authors C4 train segments" in cond
    assert "evaluation text: acbench's Wikipedia sample; the authors WikiText-2" in cond
    assert "evaluation windows" not in cond and "BOS" not in cond  # the paper's windows were run
    assert "25-50x" not in cond and "open question" not in cond
    ahead = out[("wanda (density 0.5) better than magnitude-prune:comparison=layer (density 0.5)", "ppl-token", "m")]
    assert ahead[10] == "reproduces" and float(ahead[5]) == pytest.approx(0.7)
    assert "magnitude-prune comparison" not in ahead[11]  # magnitude ran per layer, as Wanda's baseline
    assert float(level[8]) >= float(level[7]) and ahead[7] != ""
    assert out[("svd-llm-v2 (params 0.8) better than whitened-svd:per_site=true (params 0.8)", "ppl-token", "m")][
        10] == "not yet measured"
    assert len(rows(cells)) == sum(len(c.tasks) for c in CLAIMS)


def test_a_cell_off_the_papers_protocol_is_never_read_as_it_and_each_setting_off_it_is_named():
    """A 256-token cell is not the row's (it is the former protocol's); a recipe setting left at acbench's default
    is a difference the row names."""
    base = [3.0, 3.4, 2.9, 3.3, 3.1, 2.8]
    short = {**STREAM, "seq_len": 256, "max_windows": 16}
    cells = [_paper_cell("dense", "", None, base, config=short),
             _paper_cell("wanda", "unstructured", 0.5, [b + 0.3 for b in base], config=short),
             _paper_cell("sparsegpt", "unstructured", 0.5, [b + 0.3 for b in base], config=short)]
    assert _rows(cells)[("sparsegpt (density 0.5) level with wanda (density 0.5)", "ppl-token", "m")][10] == \
        "not yet measured"
    teal = [_paper_cell("dense", "", None, base, config={**STREAM, "seq_len": 2560, "scored": 512, "bos": "window"}),
            _paper_cell("teal:prefill_half=true", "unstructured", 0.5, [b + 0.2 for b in base],
                        config={**STREAM, "seq_len": 2560, "scored": 512, "bos": "window"}, allocation="greedy",
                        settings={"prefill_half": True}),
            _paper_cell("act-sparse", "unstructured", 0.5, [b + 0.5 for b in base],
                        config={**STREAM, "seq_len": 2560, "scored": 512, "bos": "window"})]
    row = _rows(teal)[("teal:prefill_half=true (density 0.5, greedy) level with act-sparse (density 0.5)",
                       "ppl-token", "m")]
    assert "teal allocation" not in row[11] and "teal prefill_half" not in row[11]
    assert "evaluation windows" not in row[11] and "the authors Alpaca" in row[11]


def test_open_question_only_where_no_recorded_condition_differs(monkeypatch):
    """A contradiction whose cells match every field of the paper's protocol is the only row that reads "open
    question"; change one recorded field and the row names it instead."""
    from dataclasses import replace

    from acbench.studies import Side, reproductions
    from acbench.studies.protocols import Evaluation, PaperModel, Protocol, Reported

    own = PaperModel("SmolLM2-135M", 134515008, "float32", "base", "test")
    ev = Evaluation("perplexity", "acbench's Wikipedia sample", "its eval split", 2048, 2047, "stream", "test")
    claim = reproductions.Claim("P", "x ahead of y", Side("act-sparse", "density 0.5"),
                                Side("act-sparse:mitigation=shift", "density 0.5"),
                                Protocol(own, ev, "density 0.5", "test", "density", (Reported("r", "test"),)))
    monkeypatch.setattr(reproductions, "CLAIMS", (claim,))
    base = [3.0 + 0.01 * i for i in range(8)]
    plain = {**SMOL, "file": "plain.safetensors", "source": "local", "alias": "m"}
    cells = [_paper_cell("dense", "", None, base, fingerprint=plain),
             _paper_cell("act-sparse", "unstructured", 0.5, [b + 0.4 for b in base], fingerprint=plain),
             _paper_cell("act-sparse:mitigation=shift", "unstructured", 0.5, [b + 0.1 for b in base],
                         fingerprint=plain)]
    row = reproductions.rows(cells)[0]
    assert row[10] == "contradicts" and row[11].startswith("open question")
    cells[1].model_fingerprint["parameters"] = 13_451_500
    row = reproductions.rows(cells)[0]
    assert row[10] == "contradicts" and row[11].startswith("model size: 13M parameters") and "open" not in row[11]
    # the budget is read off the cells: the paper at 40 % sparsity, the cells at 50 %
    monkeypatch.setattr(reproductions, "CLAIMS", (replace(claim, protocol=replace(claim.protocol,
                                                                                  budget="density 0.6")),))
    assert "budget: density 0.5; the authors density 0.6" in reproductions.rows(cells)[0][11]


def test_every_claim_carries_every_protocol_field_with_a_source_and_the_check_can_fail():
    from dataclasses import replace

    from acbench.studies.protocols import NOT_LOCATED
    from acbench.studies.reproductions import CLAIMS

    for c in CLAIMS:
        assert c.protocol.problems() == [], (c.paper, c.claim)
        assert all(r.source for r in c.protocol.reported)
    assert any(r.source == NOT_LOCATED for c in CLAIMS for r in c.protocol.reported)
    broken = replace(CLAIMS[0].protocol, model=replace(CLAIMS[0].protocol.model, source=""))
    assert broken.problems() == ["PaperModel.source"]
    assert "Evaluation.window/scored/bos" in " ".join(replace(CLAIMS[0].protocol, evaluation=replace(
        CLAIMS[0].protocol.evaluation, window=None)).problems())


def test_accuracy_claims_are_also_tested_on_accuracy_and_the_metric_difference_is_named():
    from acbench.studies.reproductions import CLAIMS

    accuracy = [c for c in CLAIMS if c.protocol.evaluation.metric == "accuracy"]
    assert {c.paper.split(" (")[0] for c in accuracy} >= {"CATS", "LaRoSa", "R-Sparse", "WINA", "SparseGPT"}
    for c in accuracy:
        assert {"lama", "mmlu"} <= set(c.tasks)
        assert c.task_options("mmlu") == {"format": "cloze"} and c.task_options("lama") == {"per_relation": 0}
    larosa = [c for c in CLAIMS if c.paper.startswith("LaRoSa")]
    assert {c.better.budget for c in larosa} == {"density 0.6"}  # 40 % sparsity, as the paper
    teal = next(c for c in CLAIMS if c.paper.startswith("TEAL"))
    assert teal.task_options("ppl-token") == {"seq_len": 2560, "scored": 512, "bos": "window", "max_windows": 32}
    assert teal.better.allocation == "greedy" and "prefill_half=true" in teal.better.method


SVD_LLM_SIDE = "whitened-svd:per_site=true"


def test_a_destroyed_budget_is_named_with_the_differences():
    base = [3.0 + 0.02 * i for i in range(6)]
    cells = [_paper_cell("dense", "", None, base),
             _paper_cell(SVD_LLM_SIDE, "params", 0.8, [b + 3.0 for b in base]),
             _paper_cell("asvd", "params", 0.8, [b + 2.0 for b in base])]
    row = _rows(cells)[("whitened-svd:per_site=true (params 0.8) better than asvd (params 0.8)", "ppl-token", "m")]
    assert row[10] == "contradicts"
    assert "the budget destroys the model (whitened-svd:per_site=true, asvd above 5x" in row[11]


def test_a_difference_inside_the_noise_is_not_detected_with_what_it_could_miss():
    base = [3.0, 3.4, 2.9, 3.3, 3.1, 2.8]
    noise = [0.05, -0.04, 0.03, -0.05, 0.02, -0.01]
    teal = "teal:prefill_half=true"
    cells = [_paper_cell("dense", "", None, base),
             _paper_cell("wina", "unstructured", 0.5, [b + 0.2 + e for b, e in zip(base, noise)], allocation="greedy"),
             _paper_cell(teal, "unstructured", 0.5, [b + 0.2 for b in base], allocation="greedy",
                         settings={"prefill_half": True})]
    row = _rows(cells)[("wina (density 0.5, greedy) better than teal:prefill_half=true (density 0.5, greedy)",
                        "ppl-token", "m")]
    assert row[10].startswith("not detected (could miss ") and float(row[9]) > abs(float(row[5]))
    # WINA's orthogonal transform is not in acbench: named, as a difference acbench cannot close
    assert "wina recipe: not available in acbench; the authors an orthogonal transform" in row[11]
    assert "metric: perplexity; the authors accuracy on zero-shot lm-eval tasks (average)" in row[11]


def test_calibration_study_saturation_and_budget_labels():
    from acbench.studies import budget_label
    from acbench.studies.calibration import saturation

    pts = {t: _cell("m", "pca", "ppl-token", "params", 0.8, [v] * 4) for t, v in
           ((4096, 3.50), (16384, 3.31), (65536, 3.305), (262144, 3.30))}
    assert saturation(pts) == "16,384"  # within 0.02 nats of the largest from there on
    assert saturation({4096: pts[4096], 262144: _cell("m", "pca", "ppl-token", "params", 0.8, [2.0] * 4)}) == \
        "not by 262,144"
    assert saturation({4096: pts[4096]}) == "-"
    # the best size is not the largest: saturation is read against the best, and the worse larger size is named
    dip = {t: _cell("m", "pca", "ppl-token", "params", 0.8, [v] * 4) for t, v in
           ((4096, 3.50), (16384, 3.31), (65536, 3.30), (262144, 3.40))}
    assert saturation(dip) == "16,384; 262,144 worse by 0.100 nats"
    # within the margin of the best only from the best itself, and a size below it that is close by chance
    dip[16384] = _cell("m", "pca", "ppl-token", "params", 0.8, [3.40] * 4)
    dip[4096] = _cell("m", "pca", "ppl-token", "params", 0.8, [3.31] * 4)
    assert saturation(dip) == "65,536; 262,144 worse by 0.100 nats"
    assert budget_label(pts[4096]) == "params 0.8"
    assert budget_label(_cell("m", "wanda", "ppl-token", "2:4", 0.5, [1.0])) == "2:4"
    assert budget_label(_cell("m", "wanda", "ppl-token", "unstructured", 0.5, [1.0])) == "density 0.5"


@pytest.mark.parametrize("argv,says", [
    (["--tokens", "1000"], "multiple of 2048"), (["--doc", "x.txt"], "markdown"),
    (["--modes", "twice"], "invalid choice")])
def test_calibration_study_flags_are_one_line(capsys, argv, says):
    from acbench.studies.calibration import main

    with pytest.raises(SystemExit) as e:
        main(argv + ["--report-only"])
    assert e.value.code == 2 and says in capsys.readouterr().err


def test_calibration_study_report_from_no_cells_lists_what_is_missing(tmp_path):
    from acbench.studies.calibration import main

    doc = tmp_path / "calibration.md"
    assert main(["--report-only", "--root", str(tmp_path / "cells"), "--doc", str(doc), "--models", "m",
                 "--tokens", "4096", "--modes", "one-pass"]) == 0
    text = doc.read_text()
    assert "Parts measured (model, mode, tokens): none yet." in text
    # the whole study's parts are listed as missing, whichever this call asked for
    assert "smollm2-135m sequential 262,144" in text and "; m one-pass 4,096" in text


def test_a_part_stopped_before_its_end_says_how_much_it_holds():
    """A part counts as measured once one cell is stored; the page says when it is not whole (a part stopped at the
    end of a sitting once read as measured). The sizes are the stored whole parts' (42 and 17 cells at 4,096)."""
    from acbench.studies.calibration import part_size, part_state

    assert (part_size("one-pass", 4096), part_size("sequential", 4096)) == (42, 17)
    # later parts leave out the methods that read no calibration (their cells are stored once, in the first): 8
    # low-rank methods at three budgets, 5 sparsity methods, 2 of them at 2:4 too, and dense
    assert part_size("one-pass", 16384) == 8 * 3 + 5 + 2 + 1
    assert part_state(17, "sequential", 16384) == ""
    assert part_state(3, "sequential", 16384) == " (part: 3 of its 17 cells)"
    # beyond 16,384 tokens sequential keeps its authors' methods only: SparseGPT and Wanda at 50 % and 2:4, and dense
    assert part_size("sequential", 65536) == part_size("sequential", 262144) == 2 + 2 + 1
    assert part_size("one-pass", 262144) == part_size("one-pass", 16384)


def test_the_cost_table_names_the_threads_each_size_ran_on():
    """A part run pinned to one core beside another costs more per second of work than one on both cores: the
    table says which it was (it once said "2 cores" for every part)."""
    from acbench.studies.calibration import cost_lines

    cells = []
    for threads, method in ((2, "pca"), (1, "teal")):
        c = hand_cell("m", method, "ppl-token", 0.8, [3.0], budget="params", calibration={"cached": False},
                      timings={"calibrate_s": 10.0 * threads})
        c.env["cpu_threads"] = threads
        cells.append(("one-pass", 4096, c))
    row = next(ln for ln in "\n".join(cost_lines(cells)).splitlines() if ln.startswith("| m "))
    assert row.replace(" ", "").endswith("|20|||||1or2|")


def test_the_cost_table_gives_each_modes_largest_calibration_peak_and_blank_where_none_was_recorded():
    """The peak column reads the cells' calibration.peak.bytes, the largest of the part's (a sequential part
    calibrates once per variant); a cell without one, or with one not shaped as a peak (valid cells can hold any
    shape there), adds nothing."""
    from acbench.studies.calibration import cost_lines

    def cell(method, mode, peak, tokens=4096):
        cal = {"cached": False} if peak is None else {"cached": False, "peak": peak}
        c = hand_cell("m", method, "ppl-token", 0.8, [3.0], budget="params", calibration=cal,
                      timings={"calibrate_s": 10.0})
        return mode, tokens, c

    cells = [cell("pca", "one-pass", {"kind": "rss_high_water", "bytes": 3 << 30}),
             cell("wanda", "sequential", {"bytes": 1 << 30}), cell("sparsegpt", "sequential", {"bytes": 2 << 30}),
             cell("wanda", "sequential", [5 << 30]),
             cell("pca", "one-pass", None, tokens=16384), cell("teal", "one-pass", "3 GB", tokens=16384)]
    rows = {ln.split("|")[2].strip(): [x.strip() for x in ln.split("|")[3:-1]]
            for ln in "\n".join(cost_lines(cells)).splitlines() if ln.startswith("| m ")}
    assert rows["4,096"][1] == "3.2 GB" and rows["4,096"][4] == "2.1 GB"
    assert rows["16,384"][1] == "" and rows["16,384"][4] == ""
    # a sequential peak measured while the capture still computed a batch of logits is said to include them
    for date, said in (("2026-12-07T00:53:36Z", True), ("2026-12-07T02:00:00Z", False)):
        for _, _, c in cells:
            c.env["date"] = date
        assert ("include one batch of its logits" in "\n".join(cost_lines(cells))) is said


def test_objectives_study_on_the_tiny_model(tiny, tmp_path):
    """studies/objectives.py end to end on the smoke model: a row per claim and group it applies to, objectives
    measured on the held-out draw, and the page's table from them."""
    from acbench.studies.objectives import CLAIMS, main, measure, summary

    rows = measure(str(tiny), samples=2, seq_len=32, progress=False)
    assert {(r["method"], r["rival"], r["objective"]) for r in rows} == set(CLAIMS)
    assert all(r["mine"] >= 0 and r["theirs"] >= 0 for r in rows)
    table = summary(rows)
    assert len(table) == len(CLAIMS)
    for row in table:
        n = sum(1 for r in rows if (r["method"], r["rival"], r["objective"]) == tuple(row[1:4]))
        assert row[4].endswith(f"of {n}")
    doc = tmp_path / "objectives.md"
    assert main(["--models", str(tiny), "--samples", "2", "--seq-len", "32", "--doc", str(doc), "--quiet"]) == 0
    import re

    assert re.search(r"\| fasc-kfac +\| pca +\| kfac +\| \d+ of \d+ ", doc.read_text())


def test_a_pair_off_the_papers_basis_is_named():
    """SVD-LLM compares at the same parameters: sides whose parameter ratios differ say so, with both ratios."""
    base = [3.0 + 0.02 * i for i in range(6)]
    cells = [_paper_cell("dense", "", None, base),
             _paper_cell("svd-llm-v2", "params", 0.8, [b + 0.4 for b in base]),
             _paper_cell(SVD_LLM_SIDE, "params", 0.8, [b + 0.2 for b in base])]
    cells[1].compression["param_ratio"], cells[2].compression["param_ratio"] = 0.8, 0.9
    key = ("svd-llm-v2 (params 0.8) better than whitened-svd:per_site=true (params 0.8)", "ppl-token", "m")
    row = _rows(cells)[key]
    assert row[10] == "contradicts"
    assert "comparison basis: parameters differs (svd-llm-v2 0.80, whitened-svd:per_site=true 0.90)" in row[11]
    cells[2].compression["param_ratio"] = 0.8
    assert "comparison basis" not in _rows(cells)[key][11]


def test_the_authors_one_pass_calibration_is_kept_between_the_budgets_it_serves(monkeypatch, tmp_path):
    """Each budget is its own sweep; without the shared cache each would calibrate whitened SVD's 524,288 tokens
    again (a sweep's statistics are otherwise removed after it)."""
    import acbench
    from acbench.studies.reproductions import run_part

    calls = []
    monkeypatch.setattr(acbench, "sweep", lambda **kw: calls.append(kw))
    run_part("smollm2-135m", tmp_path, progress=False)
    authors = [c for c in calls if c.get("calibration") == "authors" and "whitened-svd" in c["methods"]]
    assert len(authors) >= 3 and all(c.get("cache") is True for c in calls)


@pytest.mark.parametrize("mode,tokens", [("one-pass", 262144), ("sequential", 16384)])
def test_a_calibration_part_keeps_its_statistics_between_its_sweeps_and_runs_sparsity_first(monkeypatch, tmp_path,
                                                                                          mode, tokens):
    """The two low-rank sweeps (parameter and rank budgets) read the same one-pass statistics: without the shared
    cache the second calibrated again (1.5 h of one core for SmolLM2 at 262,144 tokens). The sparsity sweeps, whose
    calibration reads no gradient, come first."""
    import acbench
    from acbench.studies.calibration import run_part

    calls = []
    monkeypatch.setattr(acbench, "sweep", lambda **kw: calls.append(kw) or [])
    run_part("smollm2-135m", tokens, mode, tmp_path, progress=False)
    assert calls and all(c["cache"] is True and c["calib_samples"] * c["calib_seq_len"] == tokens for c in calls)
    kinds = ["rank" if "rank" in c else "sparsity" for c in calls]
    assert kinds == sorted(kinds, key=lambda k: k == "rank") and kinds.count("rank") == 2


def test_the_fallbacks_each_size_records_and_a_rank_clipped_to_one():
    """SVD-LLM V2's perplexity rose from 4,096 to 16,384 calibration tokens because its rule clipped a rank to 1:
    the page lists each row's fallbacks by size, and explains the rule only where a clip to 1 is recorded."""
    from acbench.studies.calibration import V2_RULE, fallback_lines, series

    def cell(tokens, fallbacks):
        c = hand_cell("m", "svd-llm-v2", "ppl-token", 0.8, [3.0], budget="params")
        c.compression["fallbacks"] = fallbacks
        return ("one-pass", tokens, c)

    uniform = {"fallback": "svd-llm-v2 uniform ranks", "site": "s"}
    clip = {"fallback": "svd-llm-v2 rank clipped", "group": "layers.0.attn_out", "k": -480, "clipped_to": 1}
    whiten = {"op": "whiten", "kind": "rank-deficient", "group": "g"}
    text = "\n".join(fallback_lines(series([cell(4096, [uniform]), cell(16384, [clip, whiten])])))
    assert "4,096: 1 svd-llm-v2 uniform ranks; 16,384: 1 svd-llm-v2 rank clipped, 1 whiten rank-deficient: " \
        "layers.0.attn_out (k -480) to rank 1" in text and V2_RULE in text
    assert V2_RULE not in "\n".join(fallback_lines(series([cell(4096, [uniform]), cell(16384, [whiten])])))
    assert fallback_lines(series([cell(4096, []), cell(16384, [])])) == []


def test_an_allocation_that_clipped_a_rank_to_one_is_named_as_a_cause():
    """SVD-LLM V2 at 16,384 tokens: its rule clipped layer 0's o_proj to rank 1 and put it behind whitened SVD;
    kept at its uniform rank, that one matrix took its perplexity from 1,010 to 332 (docs/methods.md)."""
    from acbench.studies.reproductions import rows

    dense = [3.0 + 0.01 * i for i in range(8)]
    v2 = _paper_cell("svd-llm-v2", "params", 0.8, [x + 1.0 + 0.01 * (i % 2) for i, x in enumerate(dense)])
    v2.compression["fallbacks"] = [{"fallback": "svd-llm-v2 rank clipped", "group": "layers.0.attn_out", "k": -480,
                                    "clipped_to": 1, "site": "model.layers.0.self_attn.o_proj"}]
    cells = [_paper_cell("dense", "", None, dense), v2,
             _paper_cell("whitened-svd:per_site=true", "params", 0.8, [x + 0.5 for x in dense])]
    claim = "svd-llm-v2 (params 0.8) better than whitened-svd:per_site=true (params 0.8)"
    row = {(r[2], r[4]): r for r in rows(cells) if r[3] == "ppl-token"}[(claim, "m")]
    assert row[10].startswith("contradicts")
    assert "svd-llm-v2's allocation clipped layers.0.attn_out (k -480) to rank 1" in row[11]


def test_calibration_page_gives_each_model_its_own_page(tmp_path):
    """One page for both models ran past 150 lines: each model's tables and plots go on a page of their own, which
    the study's page links; parts, fallbacks and costs stay on the study's page."""
    from acbench.studies.calibration import render

    cells = [("one-pass", tokens, hand_cell(model, "pca", "ppl-token", 0.8, [3.0 + tokens / 1e5], budget="params",
                                            calibration={"cached": False}, timings={"calibrate_s": 1.0}))
             for model in ("m", "other") for tokens in (4096, 16384)]
    doc = tmp_path / "calibration.md"
    pages = render(cells, doc, tmp_path / "plots", {"models": ["m", "other"], "modes": ["one-pass"],
                                                    "tokens": [4096, 16384]})
    assert set(pages) == {doc, tmp_path / "calibration-m.md", tmp_path / "calibration-other.md"}
    assert "[m](calibration-m.md), [other](calibration-other.md)" in pages[doc] and "| pca " not in pages[doc]
    own = pages[tmp_path / "calibration-m.md"]
    assert "| params 0.8 | pca " in own and "](plots/calibration_m_low-rank.png)" in own
    assert "other" not in own and "## What each size costs" in pages[doc]


def test_the_verdict_reads_the_holm_corrected_p_and_a_level_claim_the_90_interval():
    """Hand-made differences that separate the swaps: a raw p of 0.03 whose Holm-corrected p is 0.2 is not detected
    (reading the raw p would say 'reproduces'); a level claim whose 90 % interval lies inside the 0.02 margin while
    its 95 % interval does not reproduces (two one-sided tests at 5 % each read the 90 % interval)."""
    from acbench.studies.reproductions import CLAIMS, verdict

    ordered = next(c for c in CLAIMS if not c.level and "ppl-token" in c.tasks)
    level = next(c for c in CLAIMS if c.level and "ppl-token" in c.tasks)
    # NLL differences (worse - better side's, as compare(worse, better) gives): negative means the better side won
    d = {"diff": -0.05, "ci95": [-0.09, -0.01], "ci90": [-0.08, -0.02], "p": 0.03, "detectable": 0.06}
    assert verdict(ordered, "ppl-token", d, p_holm=0.2)["verdict"] == "not detected (could miss 0.060)"
    assert verdict(ordered, "ppl-token", d, p_holm=0.03)["verdict"] == "reproduces"
    flat = {"diff": 0.001, "ci95": [-0.025, 0.023], "ci90": [-0.018, 0.017], "p": 0.9, "detectable": 0.03}
    assert verdict(level, "ppl-token", flat, p_holm=1.0)["verdict"] == "reproduces (level within 0.02)"
    wide = {**flat, "ci90": [-0.021, 0.017]}  # the 90 % interval past the margin on one side: not level
    assert verdict(level, "ppl-token", wide, p_holm=1.0)["verdict"].startswith("not detected")


@pytest.mark.parametrize("study", ["calibration", "reproductions", "objectives", "claims"])
@pytest.mark.parametrize("models, says", [
    (["smollm2-135m", ""], "names no model"), (["smollm2-135m", "/no/such/folder"], "does not exist"),
    (["smollm2-135m", "smollm2-135m"], "names a model twice")])
def test_a_bad_model_name_is_refused_before_any_part(monkeypatch, capsys, tmp_path, study, models, says):
    """A study computes model by model: a bad second name is refused before the first model's part starts."""
    import importlib

    import acbench.runner.execute

    started = []
    monkeypatch.setattr(acbench.runner.execute, "sweep_runs", lambda runs: started.append(runs) or [])
    module = importlib.import_module(f"studies.{study}")
    argv = ["--models", *models, "--doc", str(tmp_path / "page.md")]
    with pytest.raises(SystemExit) as e:
        module.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and says in err.strip().splitlines()[-1] and "error: --models" in err and not started


@pytest.mark.parametrize("argv,says", [
    (["--max-calibration-tokens", "-5"], "give 0 or more tokens"), (["--max-calibration-tokens", "x"], "invalid int"),
    (["--doc", "x.txt"], "markdown"), (["--literal", "--doc", "x"], "markdown")])
def test_reproductions_study_flags_are_one_line(capsys, argv, says):
    from acbench.studies.reproductions import main

    with pytest.raises(SystemExit) as e:
        main(argv + ["--report-only"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and says in err and len(err.strip().splitlines()) <= 2


def test_the_literal_page_reads_its_own_cells(tmp_path):
    from acbench.studies.reproductions import main

    doc = tmp_path / "literal.md"
    assert main(["--literal", "--report-only", "--root", str(tmp_path / "none"), "--doc", str(doc),
                 "--models", "smollm2-135m"]) == 0
    text = doc.read_text()
    assert "not yet measured" in text and "## Where each protocol is stated" in text


def test_a_pair_at_neither_the_same_compute_density_nor_parameters_is_refused_and_says_which_it_shares():
    base = [3.0 + 0.02 * i for i in range(6)]
    cells = [_paper_cell("dense", "", None, base), _paper_cell("wanda", "unstructured", 0.5, [b + 0.1 for b in base]),
             _paper_cell("magnitude-prune:comparison=layer", "unstructured", 0.5, [b + 0.9 for b in base],
                         settings={"comparison": "layer"})]
    key = ("wanda (density 0.5) better than magnitude-prune:comparison=layer (density 0.5)", "ppl-token", "m")
    row = _rows(cells)[key]
    assert row[10] == "reproduces" and row[1].endswith("at the same density and compute and parameters")
    cells[2].compression.update(density=0.7, compute_ratio=0.77, param_ratio=0.8)
    row = _rows(cells)[key]
    assert row[10].startswith("refused: the sides share neither") and row[5] == ""
    assert "comparison basis: density differs (wanda 0.50, magnitude-prune:comparison=layer 0.70)" in row[11]
