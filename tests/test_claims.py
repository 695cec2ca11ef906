"""The claims study (studies/claims.py): its verdicts from hand-built cells whose intervals are known, the page it
writes, and the sweep it asks bench for."""

from __future__ import annotations

import math

import pytest

from acbench.core.record import CellRecord

TASK_METRIC = {"mmlu": "acc_norm", "lama": "p@1", "ppl-token": "ppl"}


def _cell(model: str, method: str, task: str, rank, values: list) -> CellRecord:
    """A stored cell: accuracy records (mmlu, lama; chance 0.25) or per-window NLL records (ppl-token)."""
    if task == "ppl-token":
        records = [{"window": i, "nll": float(v)} for i, v in enumerate(values)]
        metrics = {"ppl": math.exp(sum(values) / len(values))}
    else:
        records = [{"id": i, "correct": bool(v), "chance": 0.25} for i, v in enumerate(values)]
        metrics = {TASK_METRIC[task]: sum(map(bool, values)) / len(values)}
    return CellRecord.from_json({
        "schema_version": 4,
        "cell": {"model": model, "method": method, "rank": None if method == "dense" else rank, "budget": "rank",
                 "task": task, "key": "k1"},
        "higher_is_better": {TASK_METRIC[task]: task != "ppl-token"}, "metrics": metrics,
        "primary_metric": TASK_METRIC[task], "versions": {"task": 1, "method": None if method == "dense" else 1},
        "model_fingerprint": {"source": "gguf", "sha256": f"{model}-sha", "dtype": "float32"}, "seed": 0,
        "stderr": {}, "details": {}, "compression": None if method == "dense" else {"param_ratio": rank},
        "records": records, "timings": {"calibrate_s": 60.0, "compress_s": 10.0, "evaluate_s": 20.0},
        "env": {"cpu_threads": 2, "cpu_model": "test CPU", "device": "cpu", "git_commit": "abcdef1234",
                "date": "2026-12-05T00:00:00Z"}})


def _set(spec: dict) -> dict:
    from acbench.studies.claims import index

    return index([_cell(m, meth, t, r, v) for (m, meth, t, r), v in spec.items()])


N = 40
DENSE_ABOVE = [1] * 30 + [0] * 10  # 75 % against chance 25 %
DENSE_AT_CHANCE = [1] * 10 + [0] * 30  # 25 %


def test_one_model_above_chance_reads_its_own_exact_interval():
    from acbench.core.significance import detectable_accuracy, mcnemar
    from acbench.studies.claims import comparison

    base = [1] * 10 + [0] * 30
    claim = [1] * 25 + [0] * 15  # 15 discordant pairs, all for the claimant
    cells = _set({("a", "dense", "mmlu", None): DENSE_ABOVE, ("a", "pca", "mmlu", 0.5): base,
                  ("a", "fasc", "mmlu", 0.5): claim,
                  ("b", "dense", "mmlu", None): DENSE_AT_CHANCE, ("b", "pca", "mmlu", 0.5): claim,
                  ("b", "fasc", "mmlu", 0.5): base})  # b would reverse it, but b is at chance: left out
    r = comparison(cells, ["a", "b"], 0.5, "mmlu", "fasc", "pca")
    assert list(r["per_model"]) == ["a"] and r["pooled"] is None and r["common"] is None
    want = mcnemar([float(x) for x in base], [float(x) for x in claim])
    assert r["estimate"] == pytest.approx(15 / N) and r["interval"] == pytest.approx(want["ci95"])
    assert r["detectable"] == pytest.approx(detectable_accuracy(15 / N, N))  # 15 of 40 pairs discordant
    assert r["verdict"] == "holds in 1 of 1"


def test_two_models_count_each_models_verdict_and_pool_a_common_effect():
    from acbench.core.meta_analysis import common_effect, paired_effect
    from acbench.studies.claims import comparison

    base = [1] * 20 + [0] * 20
    worse = [1] * 12 + [0] * 28  # the claimant loses 8 items on each model
    spec = {}
    for m in ("a", "b"):
        spec.update({(m, "dense", "lama", None): DENSE_ABOVE, (m, "whitened-svd", "lama", 0.75): base,
                     (m, "fasc-kfac", "lama", 0.75): worse})
    r = comparison(_set(spec), ["a", "b"], 0.75, "lama", "fasc-kfac", "whitened-svd")
    d, v = paired_effect([float(x) for x in base], [float(x) for x in worse])
    want = common_effect([d, d], [v, v])
    assert r["interval"] == pytest.approx(want["ci95"]) and r["estimate"] == pytest.approx(-8 / N)
    assert r["pooled"] is None  # two models: no random effects
    # each model: 8 discordant pairs, all against, exact p = 2 / 2^8; Holm over the two: 4 / 2^8
    assert [p["holm_p"] for p in r["per_model"].values()] == pytest.approx([4 / 256, 4 / 256])
    assert r["verdict"] == "reversed in 2 of 2"


def test_perplexity_counts_a_lower_nll_for_the_claim_and_a_tie_as_not_detected():
    from acbench.studies.claims import comparison

    base = [3.0, 3.2, 2.9, 3.1, 3.05, 2.95]
    lower = [x - 0.1 for x in base]
    noisy = [x + e for x, e in zip(base, [0.2, -0.2, 0.1, -0.1, 0.15, -0.15])]
    spec = {("a", "dense", "ppl-token", None): base, ("a", "pca", "ppl-token", 0.9): base,
            ("a", "fasc", "ppl-token", 0.9): lower, ("a", "fasc-kfac", "ppl-token", 0.9): noisy}
    cells = _set(spec)
    assert comparison(cells, ["a"], 0.9, "ppl-token", "fasc", "pca")["verdict"] == "holds in 1 of 1"
    noise = comparison(cells, ["a"], 0.9, "ppl-token", "fasc-kfac", "pca")
    assert noise["verdict"] == f"not detected (could miss {noise['detectable']:.4f})"


def test_every_model_at_chance_says_so_and_missing_cells_are_not_compared():
    from acbench.studies.claims import comparison

    spec = {("a", "dense", "mmlu", None): DENSE_AT_CHANCE, ("a", "pca", "mmlu", 0.5): DENSE_ABOVE,
            ("a", "fasc", "mmlu", 0.5): DENSE_AT_CHANCE, ("b", "dense", "mmlu", None): DENSE_ABOVE,
            ("b", "pca", "mmlu", 0.5): DENSE_ABOVE}  # b lacks fasc
    r = comparison(_set(spec), ["a", "b"], 0.5, "mmlu", "fasc", "pca")
    assert r["verdict"] == "at chance" and r["per_model"] == {} and r["detectable"] is None


def test_verdict_counts_the_models_by_direction_after_holm():
    from acbench.studies.claims import correct_across_study, verdict

    def row(*per, task="lama"):
        return {"task": task, "detectable": 0.05, "per_model": {
            f"m{i}": {"shown": {"diff": d, "p": p}, "holm_p": q} for i, (d, p, q) in enumerate(per)}}

    assert verdict(row((0.1, 0.001, 0.002), (0.05, 0.2, 0.2)), True) == "holds in 1 of 2"
    assert verdict(row((0.1, 0.001, 0.002), (0.05, 0.2, 0.2)), False) == "reversed in 1 of 2"
    assert verdict(row((0.1, 0.001, 0.002), (-0.1, 0.01, 0.02)), True) == "holds in 1 of 2, reversed in 1 of 2"
    assert verdict(row((0.1, 0.04, 0.08), (0.1, 0.04, 0.08)), True) == "not detected (could miss 5.0)"
    assert verdict(row(task="ppl-token"), False) == "at chance"
    # across the study: two rows' three tests, p 0.01 0.02 0.04 -> Holm 0.03 0.04 0.04: the 0.04 survives alone
    rows = [row((0.1, 0.01, 0.01), (0.1, 0.04, 0.04)), row((0.1, 0.02, 0.02))]
    assert correct_across_study(rows) == 3
    assert [p["holm_p"] for r in rows for p in r["per_model"].values()] == pytest.approx([0.03, 0.04, 0.04])
    assert rows[0]["verdict"] == "holds in 2 of 2" and rows[1]["verdict"] == "holds in 1 of 1"
    rows = [row((0.1, 0.01, 0.01), (0.1, 0.03, 0.03)), row((0.1, 0.02, 0.02)), row((0.1, 0.5, 0.5))]
    correct_across_study(rows)  # four tests, p 0.01 0.03 0.02 0.5 -> Holm 0.04 0.06 0.06 0.5
    assert rows[0]["verdict"] == "holds in 1 of 2"


def test_the_page_carries_every_comparison_its_scores_and_its_figure(tmp_path):
    from acbench.studies.claims import BASELINES, CLAIMANTS, TASKS, Settings, write_doc

    ranks = (0.9, 0.5)
    values = {"mmlu": (DENSE_ABOVE, [1] * 20 + [0] * 20), "lama": (DENSE_ABOVE, [1] * 18 + [0] * 22),
              "ppl-token": ([3.0, 3.1, 2.9], [3.4, 3.6, 3.3])}
    cells = []
    for m in ("a", "b"):
        for task, (dense, comp) in values.items():
            cells.append(_cell(m, "dense", task, None, dense))
            for method in (*CLAIMANTS, *BASELINES):
                for r in ranks:
                    cells.append(_cell(m, method, task, r, comp))
    s = Settings(models=("a", "b"), ranks=ranks, mmlu_limit=3, output="out", doc=str(tmp_path / "claims.md"))
    page = write_doc(s, cells).read_text()
    lines = page.splitlines()
    assert len(lines) <= 150
    table = [ln for ln in lines if ln.startswith("| 0.")]
    assert len(table) == len(ranks) * len(TASKS) * len(CLAIMANTS) * len(BASELINES)
    # equal scores: every difference is 0, nothing is detected, and each benchmark's sentence says so
    assert all("not detected (could miss" in ln for ln in table)
    assert sum(ln.startswith("- **") for ln in lines) == len(TASKS)
    tests = len(ranks) * len(TASKS) * len(CLAIMANTS) * len(BASELINES) * 2
    assert f"- Holm's correction across the study's {tests} per-model tests: every test significant alone" in page
    assert "Hartung-Knapp" not in page and "holds" not in [ln.rstrip(" |").rsplit("|", 1)[-1].strip() for ln in table]
    assert "(plots/claims.png)" in page and (tmp_path / "plots" / "claims.png").stat().st_size > 10_000
    # compute: per cell 30 s of compression and evaluation, plus one calibration (60 s) per model
    n = len(cells)
    assert f"Compute: {(n * 30 + 2 * 60) / 60:.0f} minutes" in page
    assert "| a       | dense" in page or "| a | dense" in page.replace("  ", " ")
    assert "on 2 threads of test CPU" in page
    # the compressed models score 20 of 40 (above chance 25 %); a page of models at chance marks every such score
    assert "| 50.0 " in page and "50.0†" not in page


def test_a_score_at_chance_is_marked_so():
    from acbench.studies.claims import AT_CHANCE, score_table

    cells = _set({("a", "dense", "lama", None): DENSE_ABOVE, ("a", "pca", "lama", 0.5): DENSE_AT_CHANCE})
    rows = {row[1]: row for row in score_table(cells, ["a"], [0.5])}
    lama = 2 + 1  # after model and method: MMLU's one rank, then LAMA's
    assert rows["dense"][lama] == "75.0" and rows["pca"][lama] == f"25.0{AT_CHANCE}"


def test_the_compute_line_names_every_thread_count_its_cells_ran_on():
    """Parts run side by side, each pinned to a core, store cells of 1 thread beside cells of 2: the page says both
    (it once named the first cell's alone)."""
    from acbench.studies.claims import compute_time

    one, two = _cell("a", "dense", "lama", None, [1, 0]), _cell("a", "pca", "lama", 0.5, [1, 0])
    two.env["cpu_threads"] = 1
    assert compute_time([one, two])[1]["cpu_threads"] == "1 or 2"
    assert compute_time([one])[1]["cpu_threads"] == "2"


def test_the_sweep_asks_for_cloze_mmlu_every_pair_and_rank_without_latency():
    from acbench.api.sweep_call import sweep_configs
    from acbench.studies.claims import Settings, sweep_keywords

    kw = sweep_keywords(Settings(mmlu_limit=7, output="x"))
    models = kw.pop("model")
    configs = sweep_configs(models, kw)
    assert [c.model for c in configs] == ["gemma-3-270m", "smollm2-135m"]
    c = configs[0]
    assert c.methods == ["fasc-kfac", "fasc", "pca", "whitened-svd"] and c.ranks == [0.9, 0.75, 0.5]
    assert c.tasks == ["mmlu", "lama", "ppl-token"] and not c.measure_latency and c.output == "x"
    assert c.task_options["mmlu"] == {"format": "cloze", "limit": 7}
