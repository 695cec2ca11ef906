"""The plan is a pure function of the run, the model's identity and the results on disk; a Run is frozen."""

from __future__ import annotations

import dataclasses

import pytest

from acbench.core.errors import UserError

from acbench.runner.cells import ModelInfo, plan
from acbench.runner.config import RunConfig
from acbench.runner.resolve import resolve_run
from acbench.results.store import write_cell
from acbench.core.record import DENSE, CellRecord

MODEL = ModelInfo("tiny", {"sha256": "abc", "dtype": "float32"}, n_blocks=2)


def make_run(tmp_path, **kw):
    config = RunConfig(output=str(tmp_path), methods=["pca", "svd", "act-sparse"], ranks=[0.5, 0.25],
                       sparsity=["2:4"], tasks=["ppl-token", "lama", "rho"], **kw)
    return resolve_run(config)


def test_plan_lists_every_missing_cell_and_loads_nothing(tmp_path, monkeypatch):
    import transformers

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda *a, **k: pytest.fail("the plan loaded a model"))
    cells = plan(make_run(tmp_path), MODEL)
    tasks = [c for c in cells if not c.id.is_analysis]
    # dense + (pca, svd) x 2 ratios + act-sparse x 1 pattern, two tasks each; rho once per ratio
    assert len(tasks) == 2 * (1 + 2 * 2 + 1)
    assert [c.id.rank for c in cells if c.id.is_analysis] == [0.5, 0.25]
    assert cells[0].id.method == DENSE and all(c.why == "missing" for c in cells)
    assert len({c.path for c in cells}) == len(cells)
    assert len({c.variant for c in tasks}) == 1 + 2 * 2 + 1  # the cells of one variant share one compression
    sparse = [c for c in cells if c.id.method == "act-sparse"]
    assert {c.id.budget for c in sparse} == {"2:4"} and "2of4-0.5" in str(sparse[0].path)
    assert plan(make_run(tmp_path), MODEL) == cells  # the same inputs, the same plan


def test_a_stored_cell_is_not_planned_again_unless_overwritten(tmp_path):
    run = make_run(tmp_path)
    cells = plan(run, MODEL)
    first = cells[0]
    write_cell(first.path, CellRecord(cell=first.id, metrics={"ppl": 10.0}, primary_metric="ppl",
                                      env={"date": "2026-12-02"}, model_fingerprint=MODEL.fingerprint))
    again = plan(run, MODEL)
    assert first.path not in {c.path for c in again} and len(again) == len(cells) - 1
    assert len(plan(run, MODEL, overwrite=True)) == len(cells)
    first.path.write_text("{truncated")
    broken = [c for c in plan(run, MODEL) if c.path == first.path]
    assert broken and broken[0].why.startswith("unreadable")


def test_the_run_is_frozen_and_bos_settles_into_a_new_run(tmp_path):
    run = make_run(tmp_path)
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.bos = "window"
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.config.model = "other"
    settled = run.with_bos("window")
    assert run.bos == "auto" and run.tasks["ppl-token"].settings.bos == "auto"
    assert settled.tasks["ppl-token"].settings.bos == "window" and settled.calibration.bos == "window"
    # the keys move with the protocol: a cell made under another BOS is never reused
    assert {c.id.key for c in plan(run, MODEL)} != {c.id.key for c in plan(settled, MODEL)}


def test_task_sizes_are_task_options_and_shortcuts_map_onto_them(tmp_path):
    from acbench.cli import run_config_from_argv

    a = run_config_from_argv(["--lama-limit", "5", "--ppl-windows", "3", "--limit", "2"])
    # a flag several tasks share sets only the tasks the run reads (the default: lama, ppl-token and rho, whose
    # probes are sized from ppl-token's, lama's and mmlu's settings)
    assert a.task_options == {"lama": {"per_relation": 5}, "mmlu": {"limit": 2}, "ppl-token": {"max_windows": 3}}
    with pytest.raises(UserError, match="mmlu.format .set by --mmlu-format or --task-option. applies to mmlu, "
                                        "which this run does not score"):
        resolve_run(run_config_from_argv(["--tasks", "lama", "--mmlu-format", "cloze", "--output", str(tmp_path)]))
    b = run_config_from_argv(["--lama-limit", "5", "--task-option", "lama.per_relation=7"])
    assert b.task_options["lama"] == {"per_relation": 7}  # the explicit option wins
    run = resolve_run(run_config_from_argv(["--tasks", "lama", "--lama-limit", "0", "--output", str(tmp_path)]))
    assert run.tasks["lama"].settings.per_relation is None  # 0 = all, one spelling in the key


def _keys(run, model=MODEL) -> dict:
    """(method, N:M pattern or None, ratio, task) -> key: the low-rank budget's name (rank / params) is left out,
    so that a change of budget shows as a change of key at the same place."""
    return {(c.id.method, c.id.budget if ":" in c.id.budget else None, c.id.rank, c.id.task): c.id.key
            for c in plan(run, model)}


def test_cell_keys_are_pinned(tmp_path):
    """A fixed configuration's keys, written down: a change to how keys are made (or to a default that enters
    them) shows here, and must come with a method / task version bump or a note that old cells are recomputed."""
    keys = _keys(make_run(tmp_path))
    assert keys == GOLDEN_KEYS, keys


# make_run's keys on MODEL, the same at 59ee857 and after (checked when this test was written)
GOLDEN_KEYS = {
    ("act-sparse", "2:4", 0.5, "lama"): "27c1c80fa4", ("act-sparse", "2:4", 0.5, "ppl-token"): "c73de60314",
    ("dense", None, None, "lama"): "68f6500698", ("dense", None, None, "ppl-token"): "7ee60481a3",
    ("pca", None, 0.25, "lama"): "f8a107ebcc", ("pca", None, 0.25, "ppl-token"): "b85be2d79b",
    ("pca", None, 0.5, "lama"): "f8a107ebcc", ("pca", None, 0.5, "ppl-token"): "b85be2d79b",
    ("rho-analysis", None, 0.25, "rho"): "5af98bd16f", ("rho-analysis", None, 0.5, "rho"): "5af98bd16f",  # rho v2
    ("svd", None, 0.25, "lama"): "230925c11b", ("svd", None, 0.25, "ppl-token"): "f78c004b36",
    ("svd", None, 0.5, "lama"): "230925c11b", ("svd", None, 0.5, "ppl-token"): "f78c004b36",
}


@pytest.mark.parametrize("change", ["method settings", "method version", "task settings", "task version",
                                    "calibration", "fingerprint", "budget", "solve precision"])
def test_every_ingredient_changes_the_key(tmp_path, monkeypatch, change):
    from acbench import methods
    from acbench import tasks

    base = _keys(make_run(tmp_path))
    model = MODEL
    run_kw = {}
    if change == "method settings":
        run_kw["method_options"] = {"act-sparse": {"score": "wina"}}
    elif change == "method version":
        monkeypatch.setattr(methods.get_method("pca"), "version", methods.get_method("pca").version + 1)
    elif change == "task settings":
        run_kw["task_options"] = {"lama": {"per_relation": 7}}
    elif change == "task version":
        monkeypatch.setattr(tasks.get_task("lama"), "version", tasks.get_task("lama").version + 1)
    elif change == "calibration":
        run_kw["calib_samples"] = 5
    elif change == "fingerprint":
        model = ModelInfo("tiny", {"sha256": "abd", "dtype": "float32"}, n_blocks=2)
    elif change == "budget":
        run_kw["budget"] = "params"
    elif change == "solve precision":
        run_kw["solve_dtype"] = "float32"
    after = _keys(make_run(tmp_path, **run_kw), model)
    changed = {k for k in base if k in after and base[k] != after[k]}
    expect = {
        "method settings": {k for k in base if k[0] == "act-sparse"},
        "method version": {k for k in base if k[0] == "pca"},
        "task settings": {k for k in base if k[3] == "lama" and k[0] != "rho-analysis"} |
                         {k for k in base if k[0] == "rho-analysis"},  # rho keys carry the tasks it reads
        "task version": {k for k in base if k[3] == "lama"} | {k for k in base if k[0] == "rho-analysis"},
        # data-free svd, act-sparse's default abs score and the dense model read no statistics
        "calibration": {k for k in base if k[0] in ("pca", "rho-analysis")},
        "fingerprint": set(base),
        "budget": {k for k in base if k[0] in ("pca", "svd", "rho-analysis")},
        "solve precision": {k for k in base if k[0] in ("pca", "svd", "rho-analysis")},
    }[change]
    assert changed == expect, (change, sorted(changed ^ expect))


def test_a_stored_cell_edited_to_another_identity_is_recomputed(tmp_path):
    """bench run's view of the same tampering: the cell at pca's place that says fasc is planned again."""
    import json

    run = make_run(tmp_path)
    cells = plan(run, MODEL)
    target = next(c for c in cells if c.id.method == "pca" and c.id.task == "lama" and c.id.rank == 0.5)
    rec = CellRecord(cell=target.id, metrics={"p@1": 0.5}, primary_metric="p@1", env={"date": "2026-12-02"},
                     model_fingerprint=MODEL.fingerprint, compression={"param_ratio": 0.75})
    write_cell(target.path, rec)
    assert target.path not in {c.path for c in plan(run, MODEL)}  # stored and valid: nothing to do
    raw = json.loads(target.path.read_text())
    raw["cell"]["method"] = "fasc"
    target.path.write_text(json.dumps(raw))
    again = {c.path: c.why for c in plan(run, MODEL)}
    assert "belongs at tiny/fasc/rank-0.5/lama-" in again[target.path]


# ---------------------------------------------------------------- the cell schema's rules word for word (issue 51)

def _valid():
    """The smallest cell the schema accepts: a compressed model's task cell."""
    return {"schema_version": 4, "cell": {"model": "m", "method": "pca", "rank": 0.5, "budget": "rank",
                                          "task": "lama", "key": "k1"},
            "metrics": {"acc": 0.5}, "primary_metric": "acc", "env": {"torch": "2"},
            "model_fingerprint": {"sha256": "abc"}, "compression": {"param_ratio": 0.5}}


def _with(edit):
    import copy

    rec = copy.deepcopy(_valid())
    edit(rec)
    return rec


@pytest.mark.parametrize("edit, problem", [
    (lambda r: r.update(schema_version=1), "schema version 1 (this version reads 2, 3, 4)"),
    (lambda r: r.pop("schema_version"), "schema version None (this version reads 2, 3, 4)"),
    (lambda r: r.update(cell=[1]), "no cell identity (model, method, rank, task)"),
    (lambda r: r["cell"].pop("model"), "cell.model missing or not a str"),
    (lambda r: r["cell"].update(key=3), "cell.key missing or not a str"),
    (lambda r: r["cell"].update(budget=None), "cell.budget missing or not a str"),
    (lambda r: r["cell"].update(scope=1), "cell.scope is not a str"),
    (lambda r: r["cell"].update(allocation=None), "cell.allocation is not a str"),
    (lambda r: r["cell"].update(kind="probe"), "cell.kind 'probe' is not one of task, analysis"),
    (lambda r: r["cell"].update(rank=0), "cell.rank 0 is not a ratio in (0, 1]"),
    (lambda r: r["cell"].update(rank=1.5), "cell.rank 1.5 is not a ratio in (0, 1]"),
    (lambda r: r["cell"].update(rank=float("nan")), "cell.rank nan is not a ratio in (0, 1]"),
    (lambda r: r["cell"].update(rank=True), "cell.rank True is not a ratio in (0, 1]"),
    (lambda r: r["cell"].pop("rank"), "cell.rank missing for method 'pca' (only the dense model's cells have no ratio)"),
    (lambda r: r.update(metrics={}), "no metrics"),
    (lambda r: r.update(metrics=[0.5]), "no metrics"),
    (lambda r: r.update(metrics={"acc": 0.5, "n": float("inf")}), "metric n is not a finite number"),
    (lambda r: r.update(metrics={"acc": 1.5}), "metric acc = 1.5 is outside its domain [0, 1]"),
    (lambda r: r.update(metrics={"acc": -0.1}), "metric acc = -0.1 is outside its domain [0, 1]"),
    (lambda r: r.update(metrics={"word_perplexity": 0.5}, primary_metric=None),
     "metric word_perplexity = 0.5 is outside its domain [1, inf]"),
    (lambda r: r.pop("env"), "no env (the provenance every cell carries)"),
    (lambda r: r.update(model_fingerprint=None), "no model_fingerprint (which weights a task cell measured)"),
    (lambda r: r.update(compression={}),
     "no compression summary (a compressed model's cell carries what was deployed)"),
    (lambda r: r.update(stderr=[]), "stderr is not a dict"),
    (lambda r: r.update(seed=True), "seed is not a int or null"),
    (lambda r: r.update(compression=True), "compression is not a dict or null"),
    (lambda r: r.update(stderr={"acc": float("nan")}), "stderr.acc is not a finite number"),
    (lambda r: r.update(higher_is_better={"acc": 1}), "higher_is_better holds a value that is not true, false or null"),
    (lambda r: r.update(records=[{}, 3]), "records holds an entry that is not a mapping"),
    (lambda r: r.update(env={"a": [1]}), "env holds a value that is not a string, number or null"),
    (lambda r: r["model_fingerprint"].update(x={}), "model_fingerprint holds a value that is not a string, number or null"),
    (lambda r: r["compression"].update(compute_ratio="half"), "compression.compute_ratio is not a finite number"),
    (lambda r: r.update(memory={"weight_bytes": float("inf")}), "memory.weight_bytes is not a finite number"),
    (lambda r: r.update(latency={"decode_ms_per_token": "fast"}), "latency.decode_ms_per_token is not a finite number"),
    (lambda r: r["compression"].update(groups={}), "compression.groups is not a list"),
    (lambda r: r.update(memory={"peak": []}), "memory.peak is not a dict"),
    (lambda r: r.update(calibration={"spec": "x"}), "calibration.spec is not a dict"),
    (lambda r: r["compression"].update(groups=[{}, "g"]), "compression.groups holds an entry that is not a mapping"),
    (lambda r: r.update(memory={"peak": {"working_bytes": float("nan")}}),
     "memory.peak.working_bytes is not a finite number"),
    (lambda r: r.update(memory={"peak": {"bytes": "many"}}), "memory.peak.bytes is not a finite number"),
    (lambda r: r.update(primary_metric="ppl"), "primary metric 'ppl' is not among its metrics"),
])
def test_each_invalid_cell_is_named_in_a_few_words(edit, problem):
    from acbench.core.record import cell_problem

    assert cell_problem(_valid()) is None
    assert cell_problem(_with(edit)) == problem


def test_cells_the_schema_accepts():
    from acbench.core.record import cell_problem

    assert cell_problem("[]") == "not a JSON object"
    ok = [
        lambda r: r["cell"].update(method="dense", rank=None) or r.pop("compression"),  # dense: no ratio, no summary
        lambda r: r["cell"].update(method="rho-analysis") or r.update(model_fingerprint=None, compression=None,
                                                                     metrics={"acc": 7.0}),  # analyses: no domain
        lambda r: r["cell"].update(rank=1.0),
        lambda r: r.update(schema_version=2),
        lambda r: r.update(metrics={"acc": None, "ppl": 1.0, "nll": 0.0}, primary_metric=None),
        lambda r: r.update(stderr={"acc": None}, higher_is_better={"acc": None}, seed=None, memory=None),
        lambda r: r.update(memory={"peak": {"bytes": None}, "weight_bytes": 3}),
        lambda r: r.update(metrics={"acc": 1.0, "p@1": 0.0}, primary_metric=None),  # a domain's ends are in it
    ]
    for edit in ok:
        assert cell_problem(_with(edit)) is None


def test_metric_domains_and_places():
    from acbench.core.record import ALL_GROUPS, cell_relpath, metric_domain, place_problem, rank_label
    from pathlib import Path

    inf = float("inf")
    assert [metric_domain(n) for n in ("ppl", "word_perplexity", "wikitext/word_perplexity,none", "nll",
                                        "bits_per_byte", "acc", "acc_norm,none", "p@1", "mrr", "exact_match", "f1",
                                        "rho", "seconds", "mmlu/acc,none")] == [
        (1.0, inf), (1.0, inf), (1.0, inf), (0.0, inf), (0.0, inf), (0.0, 1.0), (0.0, 1.0), (0.0, 1.0), (0.0, 1.0),
        (0.0, 1.0), (0.0, 1.0), None, None, (0.0, 1.0)]
    assert rank_label(None, "rank") == "full" and rank_label(0.25, "2:4") == "2:4-0.25"
    assert cell_relpath("org/model", "dense", None, "rank", "lama", "k1") == Path("org__model/dense/lama-k1.json")
    assert cell_relpath("m", "act-sparse:score=fisher", 0.5, "2:4", "ppl", "k2", "uniform", ALL_GROUPS) == Path(
        "m/act-sparse@score=fisher/2of4-0.5/ppl-k2.json")
    assert cell_relpath("m", "pca", 0.5, "rank", "lama", "k", "fisher", "groups=mlp_in;blocks=0-3") == Path(
        "m/pca+fisher/groups_mlp_in_blocks_0-3/rank-0.5/lama-k.json")
    rec = _valid()
    assert place_problem(rec, "/results/m/pca/rank-0.5/lama-k1.json") is None
    assert place_problem(rec, "/results/m/svd/rank-0.5/lama-k1.json") == (
        "its identity (m / pca / rank-0.5 / lama, key k1) belongs at m/pca/rank-0.5/lama-k1.json, not here")
    fisher = _with(lambda r: r["cell"].update(allocation="fisher"))
    assert place_problem(fisher, "m/pca/rank-0.5/lama-k1.json") == (
        "its identity (m / pca+fisher / rank-0.5 / lama, key k1) belongs at m/pca+fisher/rank-0.5/lama-k1.json, "
        "not here")
    assert place_problem(_with(lambda r: r["cell"].update(model=3)), "x.json") == "its identity does not name a place"


def test_older_cells_upgrade_to_todays_form():
    from acbench.core.record import CellRecord, cell_kind, upgrade

    assert cell_kind({"method": "rho-analysis"}) == "analysis" and cell_kind({"method": "pca"}) == "task"
    assert cell_kind({"method": "rho-analysis", "kind": "task"}) == "task"
    today = _valid()
    assert upgrade(today) is today
    old = _with(lambda r: r.update(schema_version=3, records=[{"rank": 0, "n_candidates": 4}, {"rank": 2},
                                                              {"rank": 1, "relation": "P1"}],
                                   details={"n_candidates": {"P1": 5}}))
    new = upgrade(old)
    assert new["records"] == [{"rank": 0, "n_candidates": 4, "correct": 1.0, "chance": 0.25},
                              {"rank": 2, "correct": 0.0},  # no count anywhere: no chance level
                              {"rank": 1, "relation": "P1", "correct": 0.0, "chance": 0.2}]
    assert new["cell"]["kind"] == "task" and "kind" not in old["cell"] and "correct" not in old["records"][0]
    mmlu = upgrade(_with(lambda r: r.update(schema_version=2, records=[{"pred": "A", "gold": "A"},
                                                                     {"pred": "B", "gold": "C"}])
                         or r["cell"].update(task="mmlu")))
    assert mmlu["records"] == [{"pred": "A", "gold": "A", "correct": 1.0, "chance": 0.25},
                               {"pred": "B", "gold": "C", "correct": 0.0, "chance": 0.25}]
    # records that already say, or a record without the legacy field, or another task: left as they are
    for recs, task in (([{"rank": 0, "correct": 0.0}], "lama"), ([{"rank": 0}, {"x": 1}], "lama"),
                       ([{"rank": 0}], "ppl"), ([], "lama")):
        r = upgrade(_with(lambda r: r.update(schema_version=3, records=recs) or r["cell"].update(task=task)))
        assert r["records"] == recs
    assert upgrade(_with(lambda r: r.update(schema_version=3, details=[1], records=[{"rank": 0, "relation": "P"}])))[
        "records"] == [{"rank": 0, "relation": "P", "correct": 1.0}]
    # from_json: the primary metric falls back to the first metric when missing or not among them
    rec = CellRecord.from_json(_with(lambda r: r.update(primary_metric=None, metrics={"p@1": 0.5, "acc": 0.2})))
    assert rec.primary_metric == "p@1" and rec.cell.kind == "task" and rec.model_hash == "abc"
    kept = CellRecord.from_json(_with(lambda r: r.update(primary_metric="acc", metrics={"p@1": 0.5, "acc": 0.2})))
    assert kept.primary_metric == "acc"  # a stored primary metric stands, first or not
    with pytest.raises(ValueError, match="no metrics"):
        CellRecord.from_json(_with(lambda r: r.update(metrics={})))


def test_a_cell_round_trips_through_its_json():
    from acbench.core.record import SCHEMA_VERSION, CellRecord

    rec = CellRecord.from_json(_valid())
    out = rec.to_json()
    assert out["cell"] == {"model": "m", "method": "pca", "rank": 0.5, "budget": "rank", "task": "lama", "key": "k1",
                           "allocation": "uniform", "scope": "all", "kind": "task"}
    assert {k: v for k, v in out.items() if k != "cell"} == {
        "metrics": {"acc": 0.5}, "primary_metric": "acc", "higher_is_better": {}, "stderr": {}, "details": {},
        "task_config": {}, "records": [], "versions": {}, "compression": {"param_ratio": 0.5}, "calibration": None,
        "memory": None, "latency": None, "timings": {}, "model_fingerprint": {"sha256": "abc"}, "seed": None,
        "bos": None, "env": {"torch": "2"}, "schema_version": 4}
    assert CellRecord.from_json(out) == rec and SCHEMA_VERSION == 4
