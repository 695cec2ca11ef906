"""Fuzz target of the Python calls' keywords (acbench.compress, acbench.evaluate, acbench.sweep): any keyword with any
value ends in a result or in one UserError line, never in another exception, as the CLI's flags do."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import acbench
from acbench.core.errors import UserError
from fuzz_common import json_leaf, json_value

SWEEP_KEYS = ["rank", "ranks", "methods", "method", "sparsity", "budget", "rank_align", "allocate", "groups", "blocks",
              "tasks", "calib_source", "calib_samples", "calib_seq_len", "pair_tokens", "seed", "bos", "dtype",
              "batch_size", "stats_memory", "solve_dtype", "solve_device", "lama_limit", "ppl_windows", "limit",
              "task_options", "method_options", "analysis_options", "threads", "overwrite", "executor", "bogus",
              "calibration_mode", "calibration", "cache", "cache_limit"]
COMPRESS_KEYS = ["samples", "seq_len", "calib_seq_len", "pair_tokens", "seed", "bos", "budget", "rank_align", "allocate", "groups",
                 "blocks", "solve_dtype", "solve_device", "batch_size", "stats_memory", "text_column", "max_swaps",
                 "score", "mitigation", "bogus", "calibration_mode", "method_options", "calib_samples", "merged",
                 "cache", "cache_limit", "calibration", "merge"]
value = st.one_of(json_leaf, st.lists(json_leaf, max_size=3), st.dictionaries(st.text(max_size=5), json_leaf,
                                                                               max_size=2),
                  st.sampled_from(["sequential", "one-pass", "authors", "as-given", "1KB", "50GB", "-3GB"]))
SLOW = settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def one_line_or_result(call):
    try:
        return call()
    except UserError as e:
        assert str(e) and "\n" not in str(e), repr(e)
        return None


@SLOW
@given(keywords=st.dictionaries(st.sampled_from(SWEEP_KEYS), value, max_size=4))
def test_sweep_keywords_end_in_one_line_or_a_checked_sweep(keywords, tmp_path_factory, monkeypatch):
    import acbench.runner.execute

    ran = []
    monkeypatch.setattr(acbench.runner.execute, "sweep_runs", lambda runs: ran.extend(runs) or [])
    out = tmp_path_factory.mktemp("fuzz-sweep")
    one_line_or_result(lambda: acbench.sweep("smollm2-135m", **{"output": str(out), "report": False, **keywords}))


@pytest.fixture(scope="module")
def lm(tiny):
    return acbench.load_model(str(tiny), progress=False)


@SLOW
@given(method=st.sampled_from(["pca", "fasc", "act-sparse", "wanda", "svd", "nope", "", "all"]),
       budget=st.sampled_from([{"rank": 0.5}, {"sparsity": "2:4"}, {"rank": 0.0}, {"sparsity": 0.5}, {},
                               {"rank": "x"}, {"rank": 0.5, "sparsity": "2:4"}, {"sparsity": [1]}]),
       keywords=st.dictionaries(st.sampled_from(COMPRESS_KEYS), value, max_size=3),
       calib_source=st.one_of(st.sampled_from(["wiki", "nowhere", "file:", "file:/nonexistent"]),
                              st.lists(st.text(max_size=40), max_size=3), st.integers(), st.none()))
def test_compress_keywords_end_in_one_line_or_a_restorable_model(lm, method, budget, keywords, calib_source):
    ids = torch.arange(3, 19).unsqueeze(0)
    with torch.no_grad():
        dense = lm.model(input_ids=ids).logits
    done = one_line_or_result(lambda: acbench.compress(lm, None, method, calib_source=calib_source, progress=False,
                                                     **{"calib_samples": 2, "calib_seq_len": 32, "pair_tokens": 32,
                                                        **budget, **keywords}))
    if done is not None:
        done.restore()
    with torch.no_grad():
        assert torch.equal(lm.model(input_ids=ids).logits, dense)  # whatever happened, the model is dense again


@SLOW
@given(tasks=st.lists(st.sampled_from(["lama", "ppl-token", "mmlu", "rho", "nope", ""]), max_size=2),
       keywords=st.dictionaries(st.sampled_from(["lama_limit", "ppl_windows", "ppl_seq_len", "mmlu_shots", "limit",
                                                 "task_options", "bos", "seed", "batch_size", "bogus"]), value,
                                max_size=3))
def test_evaluate_keywords_end_in_one_line_or_scores(lm, tasks, keywords, monkeypatch):
    from acbench import tasks as task_registry

    calls = []
    for name in ("lama", "ppl-token", "mmlu"):  # the checks run; the scoring is stubbed (the property is the checks')
        monkeypatch.setattr(task_registry.get_task(name), "evaluate", lambda self, *a, **k: calls.append(1) or {})
    got = one_line_or_result(lambda: acbench.evaluate(lm, None, tasks, progress=False, **keywords))
    if not tasks:
        assert got is None  # no task is refused, as the CLI refuses an empty --tasks, never an empty result


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(model=st.one_of(st.sampled_from(["TINY", "", " ", "no/such/folder", "TINY/config.json"]), st.integers(),
                       st.none(), st.lists(st.just("TINY"), max_size=2), st.floats()),
       dtype=st.sampled_from(["float32", "bfloat16", "int8", 32, None]),
       device=st.sampled_from(["cpu", "cuda", "cuda:1", "mps", "tpu", 0, None]),
       device_map=st.sampled_from([None, "auto", "balanced", 1]), progress=st.sampled_from([False, True, "no", 0]))
def test_load_model_arguments_end_in_one_line_or_a_model(tiny, model, dtype, device, device_map, progress):
    """acbench.load_model with any argument of any type (the probe's load_model(5) and device="cuda" on a CPU-only
    torch were 28- and 33-line tracebacks): a loaded model, or one UserError line."""
    if isinstance(model, str):
        model = model.replace("TINY", str(tiny))
    elif isinstance(model, list):
        model = [str(tiny) for _ in model]
    got = one_line_or_result(lambda: acbench.load_model(model, dtype=dtype, device=device, device_map=device_map,
                                                      progress=progress))
    if device in ("cuda", "cuda:1", "mps") and not torch.cuda.is_available():
        assert got is None or device_map == "auto"


@SLOW
@given(ids=st.lists(st.lists(st.integers(-3, 49152 + 3), min_size=2, max_size=6), min_size=1, max_size=2))
def test_calibration_token_ids_outside_the_vocabulary_are_one_line(lm, ids):
    """Token windows with any ids: compressed, or (an id below 0 or past the embedding's rows) one line naming the
    range; the probe's 66-line IndexError from inside the embedding never reaches the user."""
    width = min(map(len, ids))
    windows = torch.tensor([row[:width] for row in ids])
    vocab = lm.model.get_input_embeddings().num_embeddings
    try:
        done = acbench.compress(lm, None, "pca", rank=0.5, calib_source=windows, progress=False, cache=False)
        done.restore()
        assert int(windows.min()) >= 0 and int(windows.max()) < vocab
    except UserError as e:
        assert "outside the model's vocabulary" in str(e) and "\n" not in str(e)
        assert int(windows.min()) < 0 or int(windows.max()) >= vocab


@settings(max_examples=20, deadline=None)
@given(folders=st.lists(st.sampled_from(["results", "missing", "a-file", "results/LEADERBOARD.md"]), max_size=2))
def test_load_results_folders_end_in_one_line_or_a_frame(tmp_path_factory, folders):
    """load_results with no folder, a missing one or a file (named as a file, never as missing): one line; with
    result folders, a frame."""
    import shutil

    from fuzz_common import FIXTURES

    tmp = tmp_path_factory.mktemp("load-results")
    shutil.copytree(FIXTURES / "results", tmp / "results")
    (tmp / "a-file").write_text("x")
    (tmp / "results" / "LEADERBOARD.md").write_text("# acbench leaderboard\n")
    try:
        frame = acbench.load_results(*[tmp / f for f in folders])
        assert folders and all(f == "results" for f in folders) and len(frame)
    except UserError as e:
        bad = next(f for f in folders if f != "results") if folders else None
        assert ("names no folder" in str(e)) if bad is None else (str(tmp / bad) in str(e))
        if bad in ("a-file", "results/LEADERBOARD.md"):
            assert "is a file, not a folder" in str(e)


def _result(records):
    from acbench.tasks.base import TaskResult

    return TaskResult(metrics={"x": 0.0}, records=records)


RECORDS = st.one_of(
    st.lists(st.fixed_dictionaries({"id": st.integers(0, 5), "correct": st.sampled_from([0, 1, True, 2, "x"])}),
             max_size=6),
    st.lists(st.fixed_dictionaries({"window": st.integers(0, 5), "nll": st.floats(allow_nan=True)}), max_size=6),
    st.lists(json_value, max_size=3))


@settings(max_examples=60, deadline=None)
@given(a=RECORDS, b=RECORDS, task=st.sampled_from([None, "lama", "ppl-token", "nope"]),
       margin=st.one_of(st.none(), st.floats(allow_nan=True)), wrap=st.sampled_from(["result", "dict", "other"]))
def test_compare_of_any_results_ends_in_one_line_or_a_comparison(a, b, task, margin, wrap):
    """acbench.compare of results holding any records (mismatched, empty, of other kinds), any task and margin: one
    UserError line or a comparison with its verdict."""
    ra, rb = _result(a), _result(b)
    if wrap == "dict":
        ra, rb = {"lama": ra}, {"lama": rb}
    elif wrap == "other":
        ra = a
    out = one_line_or_result(lambda: acbench.compare(ra, rb, task=task, margin=margin))
    if out is not None:
        assert out["verdict"] in ("better", "worse", "equivalent", "undecided", "higher", "lower")
        nan = any(isinstance(r, dict) and isinstance(r.get("nll"), float) and r["nll"] != r["nll"] for r in a + b)
        assert not nan  # a NaN score is refused, never given a verdict


@settings(max_examples=60, deadline=None)
@given(results=st.one_of(json_value, st.lists(json_value, max_size=3),
                         st.dictionaries(st.sampled_from(["lama", "ppl-token", "nope"]), st.just(_result([])),
                                         max_size=2)))
def test_to_frame_of_anything_ends_in_one_line_or_a_frame(results):
    frame = one_line_or_result(lambda: acbench.to_frame(results))
    if frame is not None:
        assert "metric" in frame.columns


@settings(max_examples=80, deadline=None)
@given(margin=st.one_of(json_value, st.floats(allow_nan=True, allow_infinity=True), st.integers(-3, 10)),
       task=st.sampled_from([None, "lama", "ppl-token"]))
def test_compare_takes_only_a_margin_in_zero_one(margin, task):
    """A margin outside (0, 1] (5 would call any two models equivalent), NaN, a string or a bool is one line naming
    margin=; a margin in it is the verdict's."""
    recs = [{"window": i, "nll": 3.0 + 0.01 * i} for i in range(8)]
    other = [{"window": i, "nll": 3.0 + 0.011 * i} for i in range(8)]
    ok = isinstance(margin, (int, float)) and not isinstance(margin, bool) and 0 < margin <= 1
    try:
        out = acbench.compare(_result(recs), _result(other), task=task, margin=margin)
    except UserError as e:
        assert margin is not None and not ok and "margin=" in str(e) and "(0, 1]" in str(e) and "\n" not in str(e)
        return
    assert margin is None or ok
    assert margin is None or out["margin"] == margin


@settings(max_examples=60, deadline=None)
@given(model=st.one_of(st.none(), json_value), method=st.one_of(st.none(), json_value))
def test_to_frame_takes_names_as_strings(model, method):
    """evaluate's results with a model or method that is not a name (5, ['x'], '') are one line, never written into
    the frame; names are written as given."""
    results = {"lama": _result([{"id": 0, "correct": 1}])}
    named = all(v is None or (isinstance(v, str) and v.strip()) for v in (model, method))
    try:
        frame = acbench.to_frame(results, model=model, method=method)
    except UserError as e:
        assert not named and "to_frame:" in str(e) and "\n" not in str(e)
        return
    assert named and list(frame["model"]) == [model] and list(frame["method"]) == [method]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(clear=st.one_of(json_value, st.sampled_from(["no", "False", "", 0, 1, 0.0, [], [False]])))
def test_the_statistics_cache_is_cleared_only_on_true(clear, tmp_path_factory, monkeypatch):
    """Nothing the user owns is removed on a value that is not True: 'no', 1, a list are one line, the cache kept."""
    root = tmp_path_factory.mktemp("stats")
    (root / "a-calibration").mkdir()
    (root / "a-calibration" / "C.safetensors").write_bytes(b"x" * 10)
    monkeypatch.setenv("ACBENCH_STATS_CACHE", str(root))
    try:
        listed = acbench.statistics_cache(clear=clear)
    except UserError as e:
        assert not isinstance(clear, bool) and "clear=" in str(e) and "\n" not in str(e)
        assert (root / "a-calibration" / "C.safetensors").exists()
        return
    assert isinstance(clear, bool)
    assert (root / "a-calibration").exists() != clear and listed[0]["key"] == "a-calibration"
