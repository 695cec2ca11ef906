"""The claims study (studies/claims.py): its verdicts from hand-built cells whose intervals are known (LAMA and MMLU
evaluated until decided, perplexity on fixed windows), MMLU read only where a model has room above chance, Holm's
correction per benchmark, what evaluating until decided spent, the claim's conditions, the page it writes, and the
sweeps it asks bench for."""

from __future__ import annotations

import math

import numpy as np
import pytest

from acbench.core.record import CellRecord, until_decided_digest

TASK_METRIC = {"mmlu": "acc_norm", "lama": "p@1", "ppl-token": "ppl"}


def _cell(model: str, method: str, task: str, rank, values: list, reference: str | None = None,
          budget: int | None = None, alpha: float = 0.05, decision: str | None = None,
          task_config: dict | None = None) -> CellRecord:
    """A stored cell: accuracy records (mmlu, lama; chance 0.25) or per-window NLL records (ppl-token); with a
    `reference`, evaluated until decided against it (its budget, level and decision as the run records them)."""
    if task == "ppl-token":
        records = [{"window": i, "nll": float(v)} for i, v in enumerate(values)]
        metrics = {"ppl": math.exp(sum(values) / len(values))}
    else:
        records = [{"id": i, "correct": bool(v), "chance": 0.25} for i, v in enumerate(values)]
        metrics = {TASK_METRIC[task]: sum(map(bool, values)) / len(values)}
    details = {}
    if reference is not None:
        budget = budget or len(values)
        details["until_decided"] = {"reference": reference, "looks": 20, "margin": None, "budget": budget,
                                    "block": -(-budget // 20), "items": len(values), "decision": decision,
                                    "stopped": "decided" if decision else "budget",
                                    **({} if alpha == 0.05 else {"alpha": alpha})}
        details["until_decided"]["digest"] = until_decided_digest(records, details["until_decided"])
    config = task_config if task_config is not None else \
        {"format": "cloze", "limit": None} if task == "mmlu" else {"source": "embedded", "per_relation": None} \
        if task == "lama" else {}
    return CellRecord.from_json({
        "schema_version": 4,
        "cell": {"model": model, "method": method, "rank": None if method == "dense" else rank, "budget": "rank",
                 "task": task, "key": "k1"},
        "higher_is_better": {TASK_METRIC[task]: task != "ppl-token"}, "metrics": metrics,
        "primary_metric": TASK_METRIC[task], "versions": {"task": 1, "method": None if method == "dense" else 1},
        "model_fingerprint": {"source": "gguf", "sha256": f"{model}-sha", "dtype": "float32",
                              "file": f"{model}-Q4_K_M.gguf", "parameters": 268_000_000, "loaded_dtype": "float32"},
        "seed": 0, "stderr": {}, "details": details, "task_config": config,
        "compression": None if method == "dense" else {"param_ratio": rank},
        "calibration": {"spec": {"samples": 12, "seq_len": 256, "source": "wiki"}},
        "records": records, "timings": {"calibrate_s": 60.0, "compress_s": 10.0, "evaluate_s": 20.0},
        "env": {"cpu_threads": 2, "cpu_model": "test CPU", "device": "cpu", "git_commit": "abcdef1234",
                "date": "2026-12-05T00:00:00Z"}})


def _set(cells: list[CellRecord]) -> dict:
    from acbench.studies.claims import index

    return index(cells)


N = 400
DENSE_ROOM = [1] * 160 + [0] * 240  # 40 % against chance 25 %: 15 points of room
DENSE_NO_ROOM = [1] * 580 + [0] * 1420  # 29 % on 2,000 items: above chance, by 4 points, under the claimed 6
DENSE_AT_CHANCE = [1] * 100 + [0] * 300  # 25 %


def _accuracy_pair(model, task, rank, claimant, baseline, base, claim, alpha=0.05, budget=None, decision=None):
    return [_cell(model, baseline, task, rank, base, reference=baseline, alpha=alpha, budget=budget),
            _cell(model, claimant, task, rank, claim, reference=baseline, alpha=alpha, budget=budget,
                  decision=decision)]


def test_a_sequential_comparison_reads_its_sequence_its_anytime_p_and_what_it_spent():
    from acbench.core.confidence_sequences import paired_cs
    from acbench.core.significance import anytime_p, fixed_items_needed, sequence_detectable
    from acbench.studies.claims import comparison

    base = [1] * 100 + [0] * 300
    claim = [1] * 100 + [0] * 300
    for i in range(0, 400, 4):  # the claimant right on 100 items more, wrong on 20 the baseline had
        claim[i] = 1
    for i in range(1, 80, 4):
        claim[i], base[i] = 0, 1
    alpha = 0.05 / 24
    cells = _set([_cell("a", "dense", "lama", None, DENSE_ROOM, reference="pca"),
                  *_accuracy_pair("a", "lama", 0.5, "fasc", "pca", base, claim, alpha=alpha, budget=1354)])
    r = comparison(cells, ["a"], 0.5, "lama", "fasc", "pca")
    p = r["per_model"]["a"]
    d = np.asarray(claim, float) - np.asarray(base, float)
    lo, hi = paired_cs("accuracy", d, 1354, alpha)
    assert p["shown"]["ci95"] == pytest.approx([lo[-1], hi[-1]]) and p["shown"]["alpha"] == alpha
    assert p["p"] == pytest.approx(anytime_p("accuracy", d, 1354)) and p["p"] < alpha  # decided at its level
    assert p["whole_detectable"] == pytest.approx(sequence_detectable("accuracy", d, 1354, alpha))
    assert r["detectable"] == p["whole_detectable"]  # the column reads the whole budget, not the items spent
    assert p["fixed_items"] == fixed_items_needed("accuracy", d, p["whole_detectable"], alpha)
    assert r["verdict"] == "holds in 1 of 1"


def test_the_anytime_p_is_the_level_at_which_the_sequence_first_excludes_zero():
    from acbench.core.confidence_sequences import paired_cs
    from acbench.core.significance import anytime_p

    rng = np.random.default_rng(0)
    for shift in (0.0, 0.04, 0.1):
        d = rng.choice([1.0, -1.0, 0.0], size=600, p=[0.1 + shift / 2, 0.1 - shift / 2, 0.8])
        p = anytime_p("accuracy", d, 1354)
        for level in (0.001, 0.01, 0.05, 0.2):
            lo, hi = paired_cs("accuracy", d, 1354, level)
            assert (lo[-1] > 0 or hi[-1] < 0) == (p <= level * (1 + 1e-6)), (shift, level, p)
    assert anytime_p("accuracy", np.zeros(50), 50) == 1.0


def test_the_fixed_n_count_inverts_the_detectable_difference():
    from acbench.core.significance import detectable_accuracy, fixed_items_needed

    d = np.array([1.0] * 30 + [-1.0] * 10 + [0.0] * 160)  # a fifth discordant
    for delta in (0.03, 0.05, 0.1):
        n = fixed_items_needed("accuracy", d, delta)
        assert detectable_accuracy(0.2, n) <= delta < detectable_accuracy(0.2, n - 1) + 1e-9
    assert fixed_items_needed("accuracy", d[:1], 0.05) is None and fixed_items_needed("accuracy", d, 0) is None
    assert fixed_items_needed("accuracy", d, 0.05, alpha=0.05 / 24) > fixed_items_needed("accuracy", d, 0.05)


def test_mmlu_is_read_only_on_a_model_with_room_for_the_claim():
    from acbench.studies.claims import comparison, room, verdict_rows

    base = [1] * 100 + [0] * 300
    better = [1] * 160 + [0] * 240  # 60 items more, none fewer
    cells = _set([_cell("a", "dense", "mmlu", None, DENSE_ROOM), _cell("b", "dense", "mmlu", None, DENSE_NO_ROOM),
                  *_accuracy_pair("a", "mmlu", 0.5, "fasc", "pca", base, better),
                  *_accuracy_pair("b", "mmlu", 0.5, "fasc", "pca", better, base)])  # b would reverse it: no room
    assert room(cells, "a")["room"] and not room(cells, "b")["room"]
    assert room(cells, "b")["above"] == pytest.approx(0.04)
    r = comparison(cells, ["a", "b"], 0.5, "mmlu", "fasc", "pca")
    assert list(r["per_model"]) == ["a"] and r["verdict"] == "holds in 1 of 1"
    row = verdict_rows([r], ["a", "b"], cells)[0]
    assert row[4] == "no room (+4.0 over chance)"
    none = comparison(_set([_cell("b", "dense", "mmlu", None, DENSE_NO_ROOM),
                            *_accuracy_pair("b", "mmlu", 0.5, "fasc", "pca", better, base)]),
                      ["b"], 0.5, "mmlu", "fasc", "pca")
    assert none["per_model"] == {} and none["verdict"] == "no room above chance"  # never "not detected"
    # 6.6 points over chance on 57 questions is not significantly above it: no room either
    small = _set([_cell("c", "dense", "mmlu", None, [1] * 18 + [0] * 39)])
    assert room(small, "c")["above"] > 0.06 and not room(small, "c")["room"]
    assert verdict_rows([comparison(small, ["c"], 0.5, "mmlu", "fasc", "pca")], ["c"], small)[0][3] == \
        "no room (+6.6 over chance, not significant)"


def test_lama_leaves_out_a_model_at_chance_and_missing_cells():
    from acbench.studies.claims import comparison

    cells = _set([_cell("a", "dense", "lama", None, DENSE_AT_CHANCE, reference="pca"),
                  *_accuracy_pair("a", "lama", 0.5, "fasc", "pca", DENSE_ROOM, DENSE_AT_CHANCE),
                  _cell("b", "dense", "lama", None, DENSE_ROOM, reference="pca"),
                  _cell("b", "pca", "lama", 0.5, DENSE_ROOM, reference="pca")])  # b lacks fasc
    r = comparison(cells, ["a", "b"], 0.5, "lama", "fasc", "pca")
    # b would be compared once its cell is stored: the row waits for it rather than reading "at chance"
    assert r["verdict"] == "not measured yet" and r["per_model"] == {} and r["detectable"] is None
    assert comparison(cells, ["a"], 0.5, "lama", "fasc", "pca")["verdict"] == "at chance"
    # one model decided, the other's cells still to come: the count says so
    cells.update(_set([*_accuracy_pair("c", "lama", 0.5, "fasc", "pca", [1] * 100 + [0] * 300, [1] * 250 +
                                       [0] * 150), _cell("c", "dense", "lama", None, DENSE_ROOM, reference="pca")]))
    assert comparison(cells, ["c", "b"], 0.5, "lama", "fasc", "pca")["verdict"] == \
        "holds in 1 of 1; 1 more not measured yet"
    mmlu = comparison(_set([]), ["a"], 0.5, "mmlu", "fasc", "pca")
    assert mmlu["verdict"] == "not measured yet"  # no dense MMLU stored: neither "no room" nor "not detected"


def test_a_pair_is_read_only_from_the_run_against_its_own_baseline():
    """fasc's cell decided against pca is never paired with whitened-svd's, nor a fixed-size cell with either."""
    from acbench.studies.claims import comparison

    base, claim = [1] * 100 + [0] * 300, [1] * 200 + [0] * 200
    cells = _set([_cell("a", "dense", "lama", None, DENSE_ROOM, reference="pca"),
                  *_accuracy_pair("a", "lama", 0.5, "fasc", "pca", base, claim),
                  _cell("a", "whitened-svd", "lama", 0.5, base, reference="whitened-svd"),
                  _cell("a", "fasc", "lama", 0.5, claim)])  # fixed size: another protocol
    assert comparison(cells, ["a"], 0.5, "lama", "fasc", "pca")["per_model"]
    assert comparison(cells, ["a"], 0.5, "lama", "fasc", "whitened-svd")["per_model"] == {}


def test_perplexity_counts_a_lower_nll_for_the_claim_and_a_tie_as_not_detected():
    from acbench.studies.claims import comparison

    base = [3.0, 3.2, 2.9, 3.1, 3.05, 2.95]
    lower = [x - 0.1 for x in base]
    noisy = [x + e for x, e in zip(base, [0.2, -0.2, 0.1, -0.1, 0.15, -0.15])]
    cells = _set([_cell("a", "dense", "ppl-token", None, base), _cell("a", "pca", "ppl-token", 0.9, base),
                  _cell("a", "fasc", "ppl-token", 0.9, lower), _cell("a", "fasc-kfac", "ppl-token", 0.9, noisy)])
    assert comparison(cells, ["a"], 0.9, "ppl-token", "fasc", "pca")["verdict"] == "holds in 1 of 1"
    noise = comparison(cells, ["a"], 0.9, "ppl-token", "fasc-kfac", "pca")
    assert noise["verdict"] == f"not detected (could miss {noise['detectable']:.4f})"


def test_verdict_counts_the_models_and_holm_corrects_each_benchmark_apart():
    from acbench.studies.claims import correct_per_benchmark, verdict

    def row(*per, task="lama"):
        return {"task": task, "detectable": 0.05, "per_model": {
            f"m{i}": {"shown": {"diff": d}, "p": p, "holm_p": q} for i, (d, p, q) in enumerate(per)}}

    assert verdict(row((0.1, 0.001, 0.002), (0.05, 0.2, 0.2)), True) == "holds in 1 of 2"
    assert verdict(row((0.1, 0.001, 0.002), (0.05, 0.2, 0.2)), False) == "reversed in 1 of 2"
    assert verdict(row((0.1, 0.001, 0.002), (-0.1, 0.01, 0.02)), True) == "holds in 1 of 2, reversed in 1 of 2"
    assert verdict(row((0.1, 0.04, 0.08), (0.1, 0.04, 0.08)), True) == "not detected (could miss 5.0)"
    assert verdict(row(task="ppl-token"), False) == "at chance"
    # LAMA's three tests, p 0.01 0.02 0.04 -> Holm 0.03 0.04 0.04; perplexity's one test is its own family
    rows = [row((0.1, 0.01, 0), (0.1, 0.04, 0)), row((0.1, 0.02, 0)), row((-0.1, 0.04, 0), task="ppl-token")]
    assert correct_per_benchmark(rows) == {"mmlu": 0, "lama": 3, "ppl-token": 1}
    assert [p["holm_p"] for r in rows for p in r["per_model"].values()] == pytest.approx([0.03, 0.04, 0.04, 0.04])
    assert [r["verdict"] for r in rows] == ["holds in 2 of 2", "holds in 1 of 1", "holds in 1 of 1"]


def test_a_sequence_at_the_familys_share_stays_decided_after_holm():
    """Each of m sequences runs at 0.05 / m: one that excludes zero has an anytime p at most that, which Holm's
    first step (0.05 / m) keeps, whatever the other tests show."""
    from acbench.core.confidence_sequences import paired_cs
    from acbench.core.meta_analysis import holm
    from acbench.core.significance import anytime_p
    from acbench.studies.claims import Settings, family_size, sequence_level

    s = Settings(models=("a", "b"), ranks=(0.9, 0.75, 0.5))
    assert family_size(s) == 24 and sequence_level(s) == pytest.approx(0.05 / 24)
    assert sequence_level(s, ["a"]) == pytest.approx(0.05 / 12)
    rng = np.random.default_rng(1)
    d = rng.choice([1.0, -1.0, 0.0], size=700, p=[0.16, 0.04, 0.8])
    lo, hi = paired_cs("accuracy", d, 1354, 0.05 / 24)
    assert lo[-1] > 0
    ps = [anytime_p("accuracy", d, 1354)] + [0.9] * 23
    assert holm(ps)[0] < 0.05


def test_the_spent_table_and_its_totals():
    from acbench.studies.claims import comparison, spent_rows, spent_totals

    base = [1] * 100 + [0] * 300
    claim = [1] * 200 + [0] * 200
    cells = _set([_cell("a", "dense", "lama", None, DENSE_ROOM, reference="pca"),
                  *_accuracy_pair("a", "lama", 0.5, "fasc", "pca", base, claim, budget=1354, decision="better")])
    rows = [comparison(cells, ["a"], 0.5, "lama", "fasc", "pca")]
    (line,) = spent_rows(rows)
    assert line[3:6] == ["a", "400 of 1,354", "better"]
    totals = spent_totals(rows)
    assert totals["spent"] == 400 and totals["budget"] == 1354 and totals["fixed"] == rows[0]["per_model"]["a"][
        "fixed_items"] > 0


def test_the_page_carries_every_comparison_its_costs_its_conditions_and_its_figure(tmp_path):
    from acbench.studies.claims import BASELINES, CLAIMANTS, TASKS, Settings, write_doc

    ranks = (0.9, 0.5)
    comp = [1] * 200 + [0] * 200
    cells = []
    for m in ("a", "b"):
        cells.append(_cell(m, "dense", "mmlu", None, DENSE_ROOM if m == "a" else DENSE_NO_ROOM))
        cells.append(_cell(m, "dense", "ppl-token", None, [3.0, 3.1, 2.9]))
        for b in BASELINES:
            cells.append(_cell(m, "dense", "lama", None, DENSE_ROOM, reference=b))
        for r in ranks:
            for method in (*CLAIMANTS, *BASELINES):
                cells.append(_cell(m, method, "ppl-token", r, [3.4, 3.6, 3.3]))
            for task in ("lama", "mmlu"):
                for b in BASELINES:
                    cells += _accuracy_pair(m, task, r, CLAIMANTS[0], b, comp, comp, budget=1354)[1:]
                    cells += _accuracy_pair(m, task, r, CLAIMANTS[1], b, comp, comp, budget=1354)
    s = Settings(models=("a", "b"), ranks=ranks, output="out", doc=str(tmp_path / "claims.md"))
    page = write_doc(s, cells).read_text()
    lines = page.splitlines()
    assert len(lines) <= 200
    table = [ln for ln in lines if ln.startswith("| 0.") and ("−" in ln)]
    verdicts = table[:len(ranks) * len(TASKS) * len(CLAIMANTS) * len(BASELINES)]
    assert len(verdicts) == len(ranks) * len(TASKS) * len(CLAIMANTS) * len(BASELINES)
    # equal scores: nothing is detected; MMLU rows read b as without room
    assert all("not detected (could miss" in ln for ln in verdicts)
    assert all("no room (+4.0 over chance)" in ln for ln in verdicts if "MMLU" in ln)
    assert "(fixed, inverse-variance)" in page and "(estimate only)" in page
    assert "## What evaluating until decided spent" in page and "of 1,354" in page
    assert "## The claim's conditions and acbench's" in page and "Mistral-7B (7.2B)" in page
    assert "model size: 268M parameters" in page and "4-bit GGUF Q4_K_M" in page
    assert "budget to detect 4 points" in page and "--lama-source lama:DIR:RELATIONS" in page
    assert sum(ln.startswith("- **") for ln in lines) == len(TASKS)
    assert "(plots/claims.png)" in page and (tmp_path / "plots" / "claims.png").stat().st_size > 10_000
    assert "on 2 threads of test CPU" in page


def test_a_score_at_chance_is_marked_so_and_a_partial_one_says_its_items():
    from acbench.studies.claims import AT_CHANCE, score_table

    cells = _set([_cell("a", "dense", "lama", None, DENSE_ROOM, reference="pca"),
                  _cell("a", "pca", "lama", 0.5, DENSE_AT_CHANCE, reference="pca"),
                  _cell("a", "fasc", "lama", 0.5, DENSE_ROOM[:200], reference="pca", budget=400)])
    rows = {row[1]: row for row in score_table(cells, ["a"], [0.5])}
    lama = 2 + 1  # after model and method: MMLU's one rank, then LAMA's
    assert rows["dense"][lama] == "40.0" and rows["pca"][lama] == f"25.0{AT_CHANCE}"
    assert rows["fasc"][lama] == "80.0 (200)"


def test_the_compute_line_names_every_thread_count_its_cells_ran_on():
    """Parts run side by side, each pinned to a core, store cells of 1 thread beside cells of 2: the page says both
    (it once named the first cell's alone)."""
    from acbench.studies.claims import compute_time

    one, two = _cell("a", "dense", "lama", None, [1, 0]), _cell("a", "pca", "lama", 0.5, [1, 0])
    two.env["cpu_threads"] = 1
    assert compute_time([one, two])[1]["cpu_threads"] == "1 or 2"
    assert compute_time([one])[1]["cpu_threads"] == "2"


def test_the_sweeps_ask_for_every_probe_until_decided_against_each_baseline():
    from acbench.api.sweep_call import sweep_configs
    from acbench.runner.resolve import resolve_run
    from acbench.studies.claims import Settings, ppl_keywords, room_keywords, sequential_keywords

    s = Settings(output="x", lama_source="lama:examples/sources/lama/TREx:examples/sources/lama/relations.jsonl")
    kw = sequential_keywords(s, "lama", "whitened-svd", ["gemma-3-270m", "smollm2-135m"])
    models = kw.pop("model")
    (c, _) = sweep_configs(models, kw)
    assert c.methods == ["fasc-kfac", "fasc", "whitened-svd"] and c.ranks == [0.9, 0.75, 0.5]
    assert c.tasks == ["lama"] and c.until_decided and c.reference == "whitened-svd" and not c.measure_latency
    assert c.until_decided_alpha == pytest.approx(0.05 / 24) and c.task_options["lama"]["source"] == s.lama_source
    task = resolve_run(c).task("lama")
    assert task.settings.per_relation is None and task.until_decided.alpha == pytest.approx(0.05 / 24)
    kw = sequential_keywords(s, "mmlu", "pca", ["gemma-3-270m"])
    (c,) = sweep_configs(kw.pop("model"), kw)
    assert c.task_options["mmlu"] == {"format": "cloze", "limit": 0} and c.until_decided_alpha == pytest.approx(
        0.05 / 12)
    kw = room_keywords(s, "gemma-3-270m")
    (c,) = sweep_configs(kw.pop("model"), kw)
    assert c.methods == ["dense"] and c.tasks == ["mmlu"] and not c.until_decided
    kw = ppl_keywords(s)
    c = sweep_configs(kw.pop("model"), kw)[0]
    assert c.tasks == ["ppl-token"] and not c.until_decided and c.methods == ["fasc-kfac", "fasc", "pca",
                                                                              "whitened-svd"]


def test_report_only_reads_the_cells_of_this_protocol_only():
    from acbench.studies.claims import Settings, matches

    s = Settings()
    assert matches(_cell("a", "fasc", "lama", 0.5, [1, 0], reference="pca"), s)
    assert not matches(_cell("a", "fasc", "lama", 0.5, [1, 0]), s)  # the former 105 probes, evaluated whole
    assert not matches(_cell("a", "fasc", "lama", 0.5, [1, 0], reference="pca",
                             task_config={"source": "embedded", "per_relation": 5}), s)
    assert not matches(_cell("a", "fasc", "lama", 0.5, [1, 0], reference="svd"), s)
    assert matches(_cell("a", "dense", "mmlu", None, [1, 0]), s)
    assert not matches(_cell("a", "dense", "mmlu", None, [1, 0], task_config={"format": "cloze", "limit": 10}), s)
    assert not matches(_cell("a", "fasc", "mmlu", 0.5, [1, 0]), s)  # a claimant's MMLU evaluated whole
    assert matches(_cell("a", "fasc", "ppl-token", 0.5, [3.0, 3.1]), s)


def test_the_claims_conditions_are_computed_from_the_cells():
    from acbench.studies.claims import conditions

    cells = _set([_cell("a", "dense", "lama", None, DENSE_ROOM, reference="pca"),
                  *_accuracy_pair("a", "lama", 0.5, "fasc-kfac", "pca", DENSE_ROOM, DENSE_ROOM)])
    rows, lines = conditions(cells, ["a"])
    table = {r[0]: r[1:] for r in rows}
    assert table["model"] == ["Mistral-7B (7.2B), Llama-3-8B (8.0B)", "a (268M)"]
    assert table["calibration"][0].startswith("not located") and table["calibration"][1].startswith("12 x 256")
    assert "LAMA P@1 on 400 probes (embedded), until decided" in table["evaluation"][1]
    assert any(line.startswith("model size: 268M parameters") and line.endswith("(a)") for line in lines)
    assert any(line.startswith("task set: LAMA") for line in lines)
    assert conditions(_set([]), ["a"])[1] == []


EXAMPLE_LAMA = "lama:examples/sources/lama/TREx:examples/sources/lama/relations.jsonl"


@pytest.mark.slow
def test_the_study_runs_end_to_end_on_a_users_lama_release(tiny, tmp_path, capsys):
    """The documented command on the examples' small copy of LAMA's own layout: every probe until decided against
    each baseline, the dense MMLU room check, perplexity; then --report-only writes the same page from the cells."""
    import json

    from acbench.core.log import console_lines
    from acbench.studies.claims import main

    out, doc = tmp_path / "cells", tmp_path / "claims.md"
    argv = ["--models", str(tiny), "--ranks", "0.5", "--mmlu-limit", "1", "--lama-source", EXAMPLE_LAMA,
            "--output", str(out), "--doc", str(doc)]
    with console_lines():
        assert main(argv) == 0, capsys.readouterr().err[-800:]
    page = doc.read_text()
    assert f"LAMA P@1 on 8 probes ({EXAMPLE_LAMA}), until decided" in page
    lama = [json.loads(p.read_text()) for p in out.rglob("lama-*.json")]
    refs = {c["details"]["until_decided"]["reference"] for c in lama}
    assert refs == {"pca", "whitened-svd"}
    assert all(c["task_config"]["source"] == EXAMPLE_LAMA for c in lama)
    assert {c["details"]["until_decided"].get("alpha") for c in lama} == {0.05 / 4}  # 1 model, 1 rank, 2 x 2
    first = page
    assert main([*argv, "--report-only"]) == 0
    assert doc.read_text().split("Compute:")[1].split("## Scores")[0] == first.split("Compute:")[1].split(
        "## Scores")[0]
