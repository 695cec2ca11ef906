"""The plan is a pure function of the run, the model's identity and the results on disk; a Run is frozen."""

from __future__ import annotations

import dataclasses

import pytest

from bench.cells import ModelInfo, plan
from bench.config import RunConfig, resolve_run
from bench.store import write_cell
from core.record import DENSE, CellRecord

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
    from bench.cli import run_config_from_argv

    a = run_config_from_argv(["--lama-limit", "5", "--ppl-windows", "3", "--limit", "2"])
    assert a.task_options == {"lama": {"per_relation": 5}, "mmlu": {"limit": 2},
                              "ppl-token": {"max_windows": 3}, "ppl-word": {"max_docs": 3}}
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
    import methods
    import tasks

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
