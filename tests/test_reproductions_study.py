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


AUTHORS = {"samples": 128, "seq_len": 2048, "mode": "sequential", "data": "C4", "source": "x"}


def _calibrated(mode=None, samples=12, seq_len=256):
    spec = {"samples": samples, "seq_len": seq_len, "seed": 0, "source": "wiki", "bos": "none", "pair_tokens": 512}
    if mode:
        spec["mode"] = mode
    return {"spec": spec, "stats": ["C"], "authors": AUTHORS}


def test_each_verdict_and_the_cause_of_a_contradiction():
    from acbench.studies.reproductions import CLAIMS, rows

    dense = [3.0 + 0.01 * i for i in range(8)]
    cells = [_cell("m", "dense", "ppl-token", "", None, dense)]
    # wanda clearly ahead of magnitude (claim: reproduces); sparsegpt behind wanda on a level claim, on 3,072
    # one-pass tokens against its authors' 262,144 sequential: contradicts, and the cause says so
    cells.append(_cell("m", "wanda", "ppl-token", "unstructured", 0.5, [x + 0.3 for x in dense],
                       _calibrated("sequential", 128, 2048)))
    cells.append(_cell("m", "magnitude-prune", "ppl-token", "unstructured", 0.5, [x + 1.0 for x in dense]))
    cells.append(_cell("m", "sparsegpt", "ppl-token", "unstructured", 0.5,
                       [x + 0.5 + 0.01 * (i % 2) for i, x in enumerate(dense)], _calibrated()))
    out = {(r[3], r[5]): r for r in rows(cells)}
    level = out[("sparsegpt (density 0.5) level with wanda (density 0.5)", "m")]
    assert level[11] == "contradicts (they differ)" and float(level[6]) == pytest.approx(-0.205, abs=1e-9)
    assert "sparsegpt calibrated on 3,072 tokens, its authors on 262,144" in level[12]
    assert "sparsegpt one-pass, its authors sequential" in level[12]
    assert "wanda" not in level[12]  # wanda ran in its authors' conditions
    ahead = out[("wanda (density 0.5) better than magnitude-prune (density 0.5)", "m")]
    assert ahead[11] == "reproduces" and float(ahead[6]) == pytest.approx(0.7)
    # Holm across the page's measured comparisons (four here: sparsegpt and wanda each against magnitude too)
    assert float(level[9]) >= float(level[8]) and ahead[8] != ""
    # a claim whose cells are missing says so, and every claim has a row per model
    assert out[("svd-llm-v2 (params 0.8) better than whitened-svd:per_site=true (params 0.8)", "m")][11] == \
        "not yet measured"
    assert len(rows(cells)) == len(CLAIMS)


def test_a_difference_inside_the_noise_is_not_detected_with_what_it_could_miss():
    from acbench.studies.reproductions import rows

    base = [3.0, 3.4, 2.9, 3.3, 3.1, 2.8]
    noise = [0.05, -0.04, 0.03, -0.05, 0.02, -0.01]
    cells = [_cell("m", "dense", "ppl-token", "", None, base),
             _cell("m", "wina", "ppl-token", "unstructured", 0.5, [b + 0.2 + e for b, e in zip(base, noise)]),
             _cell("m", "teal", "ppl-token", "unstructured", 0.5, [b + 0.2 for b in base])]
    row = next(r for r in rows(cells) if r[3].startswith("wina"))
    assert row[11].startswith("not detected (could miss ") and row[12] == ""
    assert float(row[10]) > abs(float(row[6]))


def test_a_destroyed_budget_is_named_as_the_cause():
    from acbench.studies.reproductions import rows

    base = [3.0 + 0.02 * i for i in range(6)]
    cells = [_cell("m", "dense", "ppl-token", "", None, base),
             _cell("m", "whitened-svd:per_site=true", "ppl-token", "params", 0.8, [b + 3.0 for b in base]),
             _cell("m", "asvd", "ppl-token", "params", 0.8, [b + 2.0 for b in base])]
    row = next(r for r in rows(cells) if r[3] == "whitened-svd:per_site=true (params 0.8) better than asvd (params 0.8)")
    assert row[11] == "contradicts"
    assert "budget destroys the model (whitened-svd:per_site=true, asvd above 5x" in row[12]


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


def test_unequal_compute_is_named_as_a_cause():
    from acbench.studies.reproductions import rows

    base = [3.0 + 0.02 * i for i in range(6)]
    cells = [_cell("m", "dense", "ppl-token", "", None, base),
             hand_cell("m", "larosa", "ppl-token", 0.5, [b + 0.4 for b in base], budget="unstructured", compute=0.5),
             hand_cell("m", "cats", "ppl-token", 0.5, [b + 0.2 for b in base], budget="unstructured", compute=0.77)]
    row = next(r for r in rows(cells) if r[3] == "larosa (density 0.5) better than cats (density 0.5)")
    assert row[11] == "contradicts" and "unequal compute (larosa 0.50, cats 0.77 of dense's)" in row[12]


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
    v2 = _cell("m", "svd-llm-v2", "ppl-token", "params", 0.8, [x + 1.0 + 0.01 * (i % 2) for i, x in enumerate(dense)])
    v2.compression["fallbacks"] = [{"fallback": "svd-llm-v2 rank clipped", "group": "layers.0.attn_out", "k": -480,
                                    "clipped_to": 1, "site": "model.layers.0.self_attn.o_proj"}]
    cells = [_cell("m", "dense", "ppl-token", "", None, dense), v2,
             _cell("m", "whitened-svd:per_site=true", "ppl-token", "params", 0.8, [x + 0.5 for x in dense])]
    claim = "svd-llm-v2 (params 0.8) better than whitened-svd:per_site=true (params 0.8)"
    row = {(r[3], r[5]): r for r in rows(cells)}[(claim, "m")]
    assert row[11].startswith("contradicts")
    assert "svd-llm-v2's allocation clipped layers.0.attn_out (k -480) to rank 1" in row[12]


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

    ordered = next(c for c in CLAIMS if not c.level and c.task == "ppl-token")
    level = next(c for c in CLAIMS if c.level and c.task == "ppl-token")
    a = _cell("m", "x", "ppl-token", "unstructured", 0.5, [3.0, 3.1])
    # NLL differences (worse - better side's, as compare(worse, better) gives): negative means the better side won
    d = {"diff": -0.05, "ci95": [-0.09, -0.01], "ci90": [-0.08, -0.02], "p": 0.03, "detectable": 0.06}
    assert verdict(ordered, a, a, None, d, p_holm=0.2)["verdict"] == "not detected (could miss 0.060)"
    assert verdict(ordered, a, a, None, d, p_holm=0.03)["verdict"] == "reproduces"
    flat = {"diff": 0.001, "ci95": [-0.025, 0.023], "ci90": [-0.018, 0.017], "p": 0.9, "detectable": 0.03}
    assert verdict(level, a, a, None, flat, p_holm=1.0)["verdict"] == "reproduces (level within 0.02)"
    wide = {**flat, "ci90": [-0.021, 0.017]}  # the 90 % interval past the margin on one side: not level
    assert verdict(level, a, a, None, wide, p_holm=1.0)["verdict"].startswith("not detected")


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
