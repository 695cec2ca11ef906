"""The Python calls (`acbench.compress`, `acbench.evaluate`, `acbench.sweep`, `acbench.load_results`) on the smoke check's
tiny Llama: each equals what its CLI command computes on the same settings, to the last digit, and refuses what the
CLI refuses in the same one line."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import acbench
from acbench.cli import main
from acbench.core.errors import UserError

TEXTS = ["The capital of France is Paris. It lies on the Seine and has been the seat of the government for centuries.",
         "Water boils at one hundred degrees Celsius at sea level; on a mountain it boils at a lower temperature.",
         "A triangle has three sides and three angles, and the angles of a triangle add up to one hundred and eighty "
         "degrees in a flat plane."] * 6
SMALL = dict(calib_samples=2, calib_seq_len=32, pair_tokens=32, progress=False)
PPL = dict(tasks=["ppl-token"], ppl_windows=2, ppl_seq_len=32)


@pytest.fixture(scope="module")
def lm(tiny):
    return acbench.load_model(str(tiny), progress=False)


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_import_bench_is_light_and_names_the_calls():
    import subprocess
    import sys

    code = "import sys, acbench; print('torch' in sys.modules, sorted(acbench.__all__))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.startswith("False")  # the CLI's start and `import acbench` load no torch until a call needs it
    for name in ("compress", "evaluate", "sweep", "load_results", "load_model"):
        assert name in out and callable(getattr(acbench, name))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        acbench.nope  # noqa: B018
    from acbench.core.errors import UserError

    assert "UserError" in out and acbench.UserError is UserError  # what a program catches
    with pytest.raises(acbench.UserError, match="model of type Linear"):
        acbench.evaluate(torch.nn.Linear(2, 2), tasks=["ppl-token"])


def test_compress_deploys_in_place_restores_bit_for_bit_and_saves(lm, tmp_path):
    ids = torch.randint(3, 1000, (1, 16))
    dense = logits(lm.model, ids)
    with acbench.compress(lm, None, "pca", rank=0.5, calib_source=TEXTS, **SMALL) as c:
        assert c.model is lm.model and c.method == "pca"
        assert c.summary["param_ratio"] < 1 and len(c.summaries) == len(c.summary["groups"]) > 0
        assert c.calibration["stats"] == ["C"] and c.calibration["spec"]["source"].startswith("texts:")
        compressed = logits(c.model, ids)
        assert not torch.equal(compressed, dense)
        c.save(tmp_path / "ck")
    assert c.restored and torch.equal(logits(lm.model, ids), dense)
    with pytest.raises(UserError, match="pca compression was restored .* compress it anew to save"):
        c.save(tmp_path / "again")
    with pytest.raises(UserError, match="pca compression was restored .* evaluate the model itself"):
        acbench.evaluate(c, tasks=["ppl-token"], ppl_windows=1, ppl_seq_len=16)  # would score the dense model
    from acbench.model.checkpoint import load_checkpoint

    assert torch.allclose(logits(load_checkpoint(tmp_path / "ck"), ids), compressed, atol=1e-5)


def test_a_model_without_fingerprint_calibrates_in_memory_to_the_cached_values(lm, tiny):
    """A plain transformers model (no fingerprint: its weights may have changed since it was loaded) is calibrated
    in memory, rounded as the cache stores statistics: the same deployed model as the cached path."""
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(str(tiny), dtype=torch.float32)
    ids = torch.randint(3, 1000, (1, 16))
    with acbench.compress(lm, None, "fasc-kfac", rank=0.5, calib_source=TEXTS, **SMALL) as cached:
        want = logits(cached.model, ids)
    with acbench.compress(plain, lm.tokenizer, "fasc-kfac", rank=0.5, calib_source=TEXTS, **SMALL) as held:
        assert held.calibration["cache"] is None and held.calibration["cached"] is False
        assert held.calibration["peak"]["bytes"] > 0  # what calibrating it took, as a run's cells record
        assert torch.equal(logits(held.model, ids), want)


def test_compress_equals_bench_compress_on_the_same_text(lm, tiny, tmp_path):
    """A list of texts is the file holding them, blank-line separated: the checkpoint's weights are the CLI's."""
    text = tmp_path / "calib.txt"
    text.write_text("\n\n".join(TEXTS))
    assert main(["compress", "--model", str(tiny), "--method", "whitened-svd", "--rank", "0.5", "--save",
                 str(tmp_path / "cli"), "--calib-source", f"file:{text}", "--calib-samples", "2", "--calib-seq-len",
                 "32", "--pair-tokens", "32", "--quiet"]) == 0
    with acbench.compress(lm, None, "whitened-svd", rank=0.5, calib_source=TEXTS, **SMALL) as c:
        c.save(tmp_path / "api")
    cli, api = load_file(tmp_path / "cli" / "model.safetensors"), load_file(tmp_path / "api" / "model.safetensors")
    assert cli.keys() == api.keys() and all(torch.equal(cli[k], api[k]) for k in cli)
    prov = [json.loads((tmp_path / d / "compression.json").read_text()) for d in ("cli", "api")]
    assert prov[0]["compression"]["groups"] == prov[1]["compression"]["groups"]


def test_calibration_forms_give_the_same_windows(lm):
    """A datasets column is its texts; a token tensor is used as it is (its digest names it)."""
    import datasets

    from acbench.api.compress_call import calibration_tokens

    texts = calibration_tokens(TEXTS, lm.tokenizer, 2, 32, 0, "none")
    column = calibration_tokens(datasets.Dataset.from_dict({"body": TEXTS}), lm.tokenizer, 2, 32, 0, "none",
                                text_column="body")
    assert texts[0] == column[0] and torch.equal(texts[1], column[1]) and texts[1].shape == (2, 32)
    label, windows = calibration_tokens(texts[1], lm.tokenizer, 9, 9, 9, "none")
    assert label == texts[0].replace("texts:", "tokens:") and torch.equal(windows, texts[1])
    assert calibration_tokens("wiki", lm.tokenizer, 2, 32, 0, "none") == ("wiki", None)


@pytest.mark.parametrize("kwargs,needle", [
    (dict(method="pca"), "give rank= "),
    (dict(method="pca", rank=0.5, sparsity="2:4"), "one of the two"),
    (dict(method="pca", rank=1.5), "rank"),
    (dict(method="pca", rank="half"), "rank 'half'"),
    (dict(method="pcaa", rank=0.5), "pca"),
    (dict(method="all", rank=0.5), "compress with one"),
    (dict(method="act-sparse", sparsity="3:2"), "3:2"),
    (dict(method="pca", rank=0.5, calib_source=42), "calibration of type int"),
    (dict(method="pca", rank=0.5, calib_source=[]), "calibration of type list"),
    (dict(method="pca", rank=0.5, calib_source=torch.zeros(2, 8)), "2-D integer tensor"),
    (dict(method="pca", rank=0.5, calib_source="nowhere"), "text source 'nowhere' is unknown"),
    (dict(method="pca", rank=0.5, calibration=["some text"]), "the calibration text is calib_source="),
    (dict(method="pca", rank=0.5, calibration="wiki"), "'as-given' or 'authors'"),
    (dict(method="fasc", rank=0.5, method_options={"fasc": {"max_swapz": 3}}), "max_swapz"),
    (dict(method="fasc", rank=0.5, max_swapz=3), "unknown keyword max_swapz="),
    (dict(method="pca", rank=0.5, groups=["attn"]), "attn"),
    (dict(method="pca", rank=0.5, calib_seq_len=10**6), "longer than the model's"),
])
def test_compress_refuses_in_bench_runs_words(lm, kwargs, needle):
    with pytest.raises(UserError) as e:
        acbench.compress(lm, None, **{**dict(progress=False, calib_samples=2), **kwargs})
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_compress_refuses_what_is_not_a_model():
    with pytest.raises(UserError, match="pass a loaded transformers causal LM"):
        acbench.compress("smollm2-135m", None, "pca", rank=0.5)
    class Headless(torch.nn.Module):
        config = None

    with pytest.raises(UserError, match="no tokenizer"):
        acbench.compress(Headless(), None, "pca", rank=0.5)


def test_evaluate_scores_as_the_dense_cell_stores(lm, tiny, tmp_path):
    got = acbench.evaluate(lm, None, **PPL, progress=False)
    assert main(["run", "--model", str(tiny), "--methods", "dense", "--tasks", "ppl-token", "--ppl-windows", "2",
                 "--ppl-seq-len", "32", "--no-latency", "--no-report", "--quiet", "--output", str(tmp_path)]) == 0
    cell = json.loads(next(tmp_path.rglob("*ppl-token*.json")).read_text())
    assert got["ppl-token"].metrics == cell["metrics"] and len(got["ppl-token"].records) == len(cell["records"])


@pytest.mark.parametrize("kwargs,needle", [
    (dict(tasks=["lamaa"]), "lama"),
    (dict(tasks=["ppl-token"], ppl_windowz=2), "unknown task setting ppl_windowz"),
    (dict(tasks=["ppl-token"], ppl_windows=-1), "ppl"),
    (dict(tasks=["rho"]), "rho"),
])
def test_evaluate_refuses_in_one_line(lm, kwargs, needle):
    with pytest.raises(UserError) as e:
        acbench.evaluate(lm, None, progress=False, **kwargs)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_sweep_returns_its_cells_a_rerun_computes_nothing_and_load_results_frames_them(tiny, tmp_path):
    out = tmp_path / "results"
    kw = dict(methods=["pca"], rank=0.5, calib_samples=2, calib_seq_len=32, pair_tokens=32,
              measure_latency=False, output=str(out), progress=False, **PPL)
    cells = acbench.sweep(str(tiny), **kw)
    assert sorted(c["cell"]["method"] for c in cells) == ["dense", "pca"]
    assert (out / "LEADERBOARD.md").exists()
    mtimes = {p: p.stat().st_mtime_ns for p in out.rglob("*.json") if not p.name.startswith("LEADERBOARD")}
    assert acbench.sweep(str(tiny), **kw) == cells  # stored, not recomputed
    assert {p: p.stat().st_mtime_ns for p in mtimes} == mtimes
    frame = acbench.load_results(out)
    ppl = frame[(frame.metric == "ppl") & (frame.task == "ppl-token")].set_index("method")["value"]
    assert ppl.to_dict() == {c["cell"]["method"]: c["metrics"]["ppl"] for c in cells}
    assert set(frame.method) == {"dense", "pca"} and frame.attrs["problems"] == []
    assert frame.loc[frame.method == "pca", "param_ratio"].iloc[0] < 1
    (out / "bad.json").write_text("{")
    assert any("bad.json" in p for p in acbench.load_results(out).attrs["problems"])


@pytest.mark.parametrize("kwargs,needle", [
    (dict(methods=["pca"], rankz=0.5), "unknown sweep setting rankz="),
    (dict(methods=["pca"], rank=2.0), "rank"),
    (dict(methods=["pcaa"]), "pca"),
    (dict(executor="ray"), "bench run --executor ray"),
    (dict(model=[]), "names no model"),
])
def test_sweep_refuses_in_one_line_before_any_model_opens(kwargs, needle, tmp_path, monkeypatch):
    import acbench.model.sources

    monkeypatch.setattr(acbench.model.sources, "open_model", lambda *a, **k: pytest.fail("a model was opened"))
    with pytest.raises(UserError) as e:
        acbench.sweep(**{"output": str(tmp_path), **kwargs})
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_load_results_of_a_missing_folder_is_one_line(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        acbench.load_results(tmp_path / "none")


def test_method_settings_travel_apart_from_the_calls_keywords(lm):
    """A method's settings reach it only through method_options={method: {setting: value}} (the shape sweep and
    --method-option take) or its spec string: random's `seed` and svd-llm-v2's `allocate` share a name with the
    call's own keywords, and neither is routed: `seed=` seeds the call, `allocate=` is its rank allocation. A
    setting given as a keyword is refused, naming method_options."""
    ids = torch.randint(3, 1000, (1, 8))
    small = {"calib_samples": 2, "calib_seq_len": 32, "progress": False, "cache": False}
    outs = []
    for opts in (None, {"random": {"seed": 3}}):
        with acbench.compress(lm, None, "random", rank=0.5, method_options=opts, **small) as c:
            outs.append(logits(c.model, ids))
    assert not torch.equal(outs[0], outs[1])
    with acbench.compress(lm, "random:seed=3", rank=0.5, **small) as c:
        assert torch.equal(logits(c.model, ids), outs[1])  # the spec string, the same setting
    ks = []
    for opts in (None, {"svd-llm-v2": {"allocate": False}}):
        with acbench.compress(lm, None, "svd-llm-v2", rank=0.5, method_options=opts, **small) as c:
            ks.append({g["group"]: g["k"] for g in c.summary["groups"]})
    assert ks[0] != ks[1]  # its own allocation across groups, then none
    with acbench.compress(lm, "svd-llm-v2", rank=0.5, allocate="uniform", **small) as c:
        assert {g["group"]: g["k"] for g in c.summary["groups"]} == ks[0]  # the call's rank allocation
    with pytest.raises(acbench.UserError, match=r"^compress: max_swaps= is a setting of fasc, not a keyword of "
                                              r"compress: pass method_options=\{'fasc': \{'max_swaps': 3\}\}"):
        acbench.compress(lm, None, "fasc", rank=0.5, max_swaps=3, **small)
    with pytest.raises(acbench.UserError, match=r"unknown keyword merge= \(did you mean merged=\?\)"):
        acbench.compress(lm, "pca", rank=0.5, merge=False, **small)
    with pytest.raises(acbench.UserError, match="method_options"):
        acbench.compress(lm, None, "fasc", rank=0.5, method_options=["max_swaps"], **small)
    with pytest.raises(acbench.UserError, match="method_options"):
        acbench.compress(lm, None, "fasc", rank=0.5, method_options={"max_swaps": 4}, **small)


def test_one_vocabulary_across_the_calls(lm, tmp_path):
    """evaluate takes what compress returns and a comma list of tasks; sweep takes densities as numbers, refuses
    rank= with ranks= and a model in memory in one line; acbench.list_methods() and acbench.list_tasks() list the registries."""
    from acbench import methods as method_registry
    from acbench import tasks as task_registry
    from acbench.api.sweep_call import sweep_configs

    small = {"calib_samples": 2, "calib_seq_len": 32, "progress": False, "cache": False}
    with acbench.compress(lm, None, "pca", rank=0.5, **small) as c:
        got = acbench.evaluate(c, tasks="ppl-token", ppl_windows=1, ppl_seq_len=16, progress=False)
        again = acbench.evaluate(c.model, lm.tokenizer, tasks=["ppl-token"], ppl_windows=1, ppl_seq_len=16,
                               progress=False)
    assert got["ppl-token"].metrics == again["ppl-token"].metrics
    (config,) = sweep_configs("m", {"methods": "teal", "sparsity": [0.5, "2:4"]})
    assert config.sparsity == ["0.5", "2:4"]
    with pytest.raises(acbench.UserError, match="rank= and ranks= are the same setting"):
        sweep_configs("m", {"rank": [0.5], "ranks": [0.25]})
    stats_root = Path(os.environ["ACBENCH_STATS_CACHE"])
    before = sorted(stats_root.rglob("*"))
    sweep = {"methods": ["pca"], "rank": [0.5], "tasks": ["ppl-token"], "ppl_windows": 1, "ppl_seq_len": 16,
             "calib_samples": 2, "calib_seq_len": 32, "measure_latency": False, "progress": False}
    cells = acbench.sweep(model=lm, **sweep)  # opened again from its source; nothing kept
    assert sorted(c["cell"]["method"] for c in cells) == ["dense", "pca"]
    assert all(math.isfinite(c["metrics"][c["primary_metric"]]) for c in cells)
    assert sorted(stats_root.rglob("*")) == before  # the statistics cache is opt-in (cache=True)
    for method, budget in (("pca", {"rank": 0.5}), ("wanda", {"sparsity": 0.5})):  # modules replaced; weights masked
        with acbench.compress(lm, None, method, **budget, **small):
            with pytest.raises(acbench.UserError, match="compressed in place"):
                acbench.sweep(model=lm, **sweep)
    with pytest.raises(acbench.UserError, match="save it with save_pretrained"):
        acbench.sweep(model=lm.model, **sweep)
    listed = acbench.list_methods()
    assert [m["name"] for m in listed] == method_registry.known_methods()
    fasc = next(m for m in listed if m["name"] == "fasc-kfac")
    assert fasc["needs"] == ["activations", "gradients"] and fasc["family"] == "low-rank"
    assert next(m for m in listed if m["name"] == "sparsegpt")["authors_calibration"]["samples"] == 128
    found = {t["name"]: t for t in acbench.list_tasks()}
    assert list(found) == task_registry.known_tasks() and found["lama"]["margin"] == 0.02
    assert found["ppl-token"]["higher_is_better"] is False


def test_compare_gives_what_the_leaderboard_prints(lm, tiny, tmp_path):
    """acbench.compare on evaluate's results and on sweep's cells: the leaderboard's paired difference, interval,
    detectable difference and verdict (acbench.core.significance's, computed here another way: by the cells' own records)."""
    from acbench.core.record import CellRecord
    from acbench.core.significance import compare as paired, detectable_difference, verdict

    small = {"calib_samples": 2, "calib_seq_len": 32, "progress": False, "cache": False}
    sizes = {"ppl_windows": 4, "ppl_seq_len": 16, "lama_limit": 2, "progress": False}
    dense = acbench.evaluate(lm, tasks=["ppl-token", "lama"], **sizes)
    with acbench.compress(lm, None, "pca", rank=0.5, **small) as c:
        pca = acbench.evaluate(c, tasks=["ppl-token", "lama"], **sizes)
    got = acbench.compare(dense, pca, task="ppl-token")
    want = paired(dense["ppl-token"], pca["ppl-token"])
    assert got["diff"] == pytest.approx(want["diff"]) and got["ci95"] == pytest.approx(want["ci95"])
    assert got["verdict"] == verdict(want, 0.02, False) and got["margin"] == 0.02
    assert got["detectable"] == pytest.approx(detectable_difference(dense["ppl-token"], pca["ppl-token"]))
    lama = acbench.compare(dense["lama"], pca["lama"], task="lama", margin=0.5)
    assert lama["test"] == "McNemar exact" and lama["margin"] == 0.5
    with pytest.raises(acbench.UserError, match="name one of its tasks with task="):
        acbench.compare(dense, pca)
    with pytest.raises(acbench.UserError, match="pass what evaluate or sweep returned"):
        acbench.compare(3, pca["lama"])
    cells = acbench.sweep(model=str(tiny), methods=["pca", "svd"], rank=[0.5], tasks=["ppl-token"], ppl_windows=3,
                        ppl_seq_len=16, calib_samples=2, calib_seq_len=32, measure_latency=False,
                        output=str(tmp_path / "r"), progress=False, report=False)
    by = {c["cell"]["method"]: c for c in cells}
    got = acbench.compare(by["pca"], by["svd"])  # a stored cell names its own task
    want = paired(CellRecord.from_json(by["pca"]), CellRecord.from_json(by["svd"]))
    assert got["diff"] == pytest.approx(want["diff"]) and got["n"] == 3


def test_a_sweep_without_output_keeps_nothing(tiny, tmp_path, monkeypatch):
    """No `output`: the cells come back and nothing is left on disk, in the working directory or the temp folder."""
    import tempfile

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    cells = acbench.sweep(str(tiny), methods=["pca"], rank=0.5, calib_samples=2, calib_seq_len=32, pair_tokens=32,
                        measure_latency=False, progress=False, **PPL)
    assert sorted(c["cell"]["method"] for c in cells) == ["dense", "pca"]
    assert list(tmp_path.iterdir()) == [tmp_path / "tmp"] and not list((tmp_path / "tmp").iterdir())


def test_the_statistics_cache_is_listed_and_cleared(lm, tmp_path, monkeypatch):
    monkeypatch.setenv("ACBENCH_STATS_CACHE", str(tmp_path / "stats"))
    assert acbench.statistics_cache() == []
    with acbench.compress(lm, None, "pca", rank=0.5, calib_samples=2, calib_seq_len=32, progress=False, cache=True):
        pass
    (entry,) = acbench.statistics_cache()
    assert entry["bytes"] > 0 and entry["spec"]["samples"] == 2 and entry["stats"] == ["C"] and entry["tokens"] == 64
    busy = tmp_path / "stats" / "busy"
    busy.mkdir()
    (busy / ".calibration.lock").write_text("1")
    done = {e["key"]: e for e in acbench.statistics_cache(clear=True)}
    assert done[entry["key"]]["removed"] and done["busy"]["kept"] == "being written"
    assert [p.name for p in (tmp_path / "stats").iterdir()] == ["busy"]


def test_refusals_speak_the_calls_keywords(lm):
    """A refusal shared with the CLI names the keyword the Python caller typed, not a flag, and no config file."""
    from acbench.api.caller_state import api_words

    small = {"progress": False, "cache": False}
    with pytest.raises(acbench.UserError, match=r"^calib_samples= must be a positive integer, got 0$"):
        acbench.compress(lm, None, "pca", rank=0.5, calib_samples=0, **small)
    with pytest.raises(acbench.UserError, match=r"pass e\.g\. rank=0\.5 "):
        acbench.compress(lm, None, "pca", rank=2, **small)
    with pytest.raises(acbench.UserError) as e:
        acbench.compress(lm, None, "pca", rank=0.5, allocate="fishr", **small)
    assert "--" not in str(e.value) and "allocate=fishr" in str(e.value)
    assert api_words("run setting x: fix --calib-samples or that key in the --config file", "sweep") == \
        "run setting x: fix calib_samples="
    assert api_words("run a Ray sweep with `bench run --executor ray`", "sweep") == \
        "run a Ray sweep with `bench run --executor ray`"  # a command to type stays one


def test_compress_takes_the_tokenizer_from_the_loaded_model(lm):
    ids = torch.randint(3, 1000, (1, 8))
    small = {"calib_samples": 2, "calib_seq_len": 32, "progress": False, "cache": False}
    with acbench.compress(lm, "pca", rank=0.5, **small) as c:
        short = logits(c.model, ids)
    with acbench.compress(lm, None, "pca", rank=0.5, **small) as c:
        assert torch.equal(short, logits(c.model, ids))
    with pytest.raises(acbench.UserError, match="compress needs a method"):
        acbench.compress(lm, rank=0.5, **small)


def test_compress_names_the_calibration_size_as_sweep_does(lm):
    """calib_samples= and calib_seq_len=, as sweep, bench run and RunConfig name them; compress's old samples= and
    seq_len= are refused, naming the keyword."""
    with acbench.compress(lm, "pca", rank=0.5, calib_samples=2, calib_seq_len=32, progress=False, cache=False) as c:
        assert c.calibration["spec"]["samples"] == 2 and c.calibration["spec"]["seq_len"] == 32
    for old, new in (("samples", "calib_samples"), ("seq_len", "calib_seq_len")):
        with pytest.raises(acbench.UserError, match=rf"unknown keyword {old}= \(did you mean {new}=\?\)"):
            acbench.compress(lm, "pca", rank=0.5, progress=False, **{old: 2})


def test_every_result_converts_to_one_frame(lm, tiny, tmp_path):
    """to_frame of what sweep returned is what load_results reads from disk (same columns and values); evaluate's
    results give the same columns, with the task's metrics."""
    out = tmp_path / "r"
    cells = acbench.sweep(str(tiny), methods=["pca"], rank=0.5, calib_samples=2, calib_seq_len=32, pair_tokens=32,
                        measure_latency=False, output=str(out), progress=False, **PPL)
    mine, stored = acbench.to_frame(cells), acbench.load_results(out)
    assert list(mine.columns) == list(stored.columns)
    key = ["method", "metric"]
    left = mine.drop(columns=["file"]).sort_values(key).reset_index(drop=True)
    right = stored.drop(columns=["file"]).sort_values(key).reset_index(drop=True)
    assert left.equals(right)
    scores = acbench.evaluate(lm, tasks=["ppl-token"], ppl_windows=2, ppl_seq_len=16, progress=False)
    frame = acbench.to_frame(scores, model="tiny", method="dense")
    assert list(frame.columns) == list(stored.columns)
    ppl = frame[frame.metric == "ppl"].iloc[0]
    assert ppl.value == scores["ppl-token"].metrics["ppl"] and bool(ppl.primary) and not bool(ppl.higher_is_better)
    assert ppl.n_items == 2 and ppl.model == "tiny"
    with pytest.raises(acbench.UserError, match="to_frame takes"):
        acbench.to_frame(3)


def test_the_statistics_cache_is_opt_in_bounded_and_said_before_it_is_written(lm, capsys, tmp_path, monkeypatch):
    """compress keeps no statistics on disk unless cache=True; with it, their size is said before they are
    written, a calibration that would take the cache past its bound is one line and writes nothing, and
    acbench.statistics_cache lists and clears it."""
    root = tmp_path / "stats"
    monkeypatch.setenv("ACBENCH_STATS_CACHE", str(root))  # this test's own cache: it lists and clears it all
    small = {"calib_samples": 2, "calib_seq_len": 32, "pair_tokens": 32}
    with acbench.compress(lm, "pca", rank=0.5, **small):
        pass
    assert not list(root.rglob("*.safetensors")) and acbench.statistics_cache() == []
    with pytest.raises(acbench.UserError, match=r"past its bound of 1\.0 KB: clear it"):
        acbench.compress(lm, "pca", rank=0.5, cache=True, cache_limit="1KB", **small)
    assert not list(root.rglob("*.safetensors"))
    capsys.readouterr()
    with acbench.compress(lm, "pca", rank=0.5, cache=True, **small):
        pass
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("calibration statistics: about")]
    assert len(said) == 1 and "bound 20.0 GB" in said[0], said
    (entry,) = acbench.statistics_cache()
    assert entry["bytes"] > 0 and entry["stats"] == ["C"]
    with pytest.raises(acbench.UserError, match="cache_limit="):
        acbench.compress(lm, "pca", rank=0.5, cache=True, cache_limit="lots", **small)
    (gone,) = acbench.statistics_cache(clear=True)
    assert gone["removed"] and acbench.statistics_cache() == []


def test_messages_go_through_the_acbench_logger_which_silences_them(lm, capsys, tmp_path, monkeypatch):
    """Status lines are the `acbench` logger's INFO records: progress=False drops them for the call, a caller who
    sets the logger to WARNING drops them and the bars; warnings pass both ways. A caller's own handler receives
    them instead of stdout."""
    import logging

    monkeypatch.setenv("ACBENCH_STATS_CACHE", str(tmp_path / "stats"))  # cleared at the end: this test's own

    small = {"calib_samples": 2, "calib_seq_len": 32, "pair_tokens": 32}
    logger = logging.getLogger("acbench")
    seen = []
    handler = logging.Handler()
    handler.emit = seen.append
    logger.addHandler(handler)
    original = logger.level
    logger.setLevel(logging.INFO)  # the caller's choice: status lines too
    try:
        with acbench.compress(lm, "pca", rank=0.5, progress=False, **small):
            pass
        assert seen and all(r.levelno >= logging.WARNING for r in seen)  # the short calibration's warnings
        assert all(r.getMessage().startswith("warning: ") for r in seen)
        level, seen[:] = logger.level, []
        logger.setLevel(logging.WARNING)
        capsys.readouterr()
        try:
            with acbench.compress(lm, "pca", rank=0.5, **small):
                pass
        finally:
            logger.setLevel(level)
        out, err = capsys.readouterr()
        assert all(r.levelno >= logging.WARNING for r in seen) and "calibrate" not in err  # no bars
        assert [line for line in out.splitlines() if line and not line.startswith("warning: ")] == []
        seen[:] = []
        capsys.readouterr()
        with acbench.compress(lm, "pca", rank=0.5, cache=True, **small):
            pass
        assert any(r.levelno == logging.INFO and "calibration statistics" in r.getMessage() for r in seen)
        assert "calibration statistics" not in capsys.readouterr().out  # the caller's handler, not stdout
    finally:
        logger.removeHandler(handler)
        logger.setLevel(original)
        acbench.statistics_cache(clear=True)
    assert logger.level == original


def test_evaluate_until_decided_against_a_reference_it_scored(lm):
    """evaluate(until_decided=True) scores the reference on the whole budget in the comparison's order; what it
    returned makes another evaluate stop its comparison when decided, as bench run --until-decided does."""
    kw = {"tasks": ["ppl-token"], "ppl_windows": 120, "ppl_seq_len": 16, "progress": False}
    ref = acbench.evaluate(lm, until_decided=True, **kw)
    whole = ref["ppl-token"].details["until_decided"]
    assert whole["items"] == whole["budget"] == 120 and whole["stopped"].startswith("whole budget")
    with acbench.compress(lm, "pca", rank=0.25, calib_samples=2, calib_seq_len=32, progress=False) as c:
        got = acbench.evaluate(c, until_decided=ref, **kw)["ppl-token"].details["until_decided"]
    assert got["stopped"] == "decided" and got["decision"] and got["items"] < 120, got
    assert got["reference"] == "evaluate(until_decided=)"
    with pytest.raises(acbench.UserError, match="takes True .* not a str"):
        acbench.evaluate(lm, until_decided="yes", **kw)
    plain = acbench.evaluate(lm, **kw)
    with pytest.raises(acbench.UserError, match="no until-decided result of ppl-token"):
        acbench.evaluate(lm, until_decided=plain, **kw)
    with pytest.raises(acbench.UserError, match="none of ppl-word can stop early"):
        acbench.evaluate(lm, tasks=["ppl-word"], until_decided=True, progress=False)
