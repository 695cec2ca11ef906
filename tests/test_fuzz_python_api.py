"""Fuzz target of the Python calls' keywords (bench.compress, bench.evaluate, bench.sweep): any keyword with any
value ends in a result or in one UserError line, never in another exception, as the CLI's flags do."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bench
from core.errors import UserError
from fuzz_common import json_leaf

SWEEP_KEYS = ["rank", "ranks", "methods", "method", "sparsity", "budget", "rank_align", "allocate", "groups", "blocks",
              "tasks", "calib_source", "calib_samples", "calib_seq_len", "pair_tokens", "seed", "bos", "dtype",
              "batch_size", "stats_memory", "solve_dtype", "solve_device", "lama_limit", "ppl_windows", "limit",
              "task_options", "method_options", "analysis_options", "threads", "overwrite", "executor", "bogus"]
COMPRESS_KEYS = ["samples", "seq_len", "pair_tokens", "seed", "bos", "budget", "rank_align", "allocate", "groups",
                 "blocks", "solve_dtype", "solve_device", "batch_size", "stats_memory", "text_column", "max_swaps",
                 "score", "mitigation", "bogus"]
value = st.one_of(json_leaf, st.lists(json_leaf, max_size=3), st.dictionaries(st.text(max_size=5), json_leaf,
                                                                               max_size=2))
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
    import bench.runner.execute

    ran = []
    monkeypatch.setattr(bench.runner.execute, "sweep_runs", lambda runs: ran.extend(runs) or [])
    out = tmp_path_factory.mktemp("fuzz-sweep")
    one_line_or_result(lambda: bench.sweep("smollm2-135m", **{"output": str(out), "report": False, **keywords}))


@pytest.fixture(scope="module")
def lm(tiny):
    return bench.load_model(str(tiny), progress=False)


@SLOW
@given(method=st.sampled_from(["pca", "fasc", "act-sparse", "wanda", "svd", "nope", "", "all"]),
       budget=st.sampled_from([{"rank": 0.5}, {"sparsity": "2:4"}, {"rank": 0.0}, {"sparsity": 0.5}, {},
                               {"rank": "x"}, {"rank": 0.5, "sparsity": "2:4"}, {"sparsity": [1]}]),
       keywords=st.dictionaries(st.sampled_from(COMPRESS_KEYS), value, max_size=3),
       calibration=st.one_of(st.sampled_from(["wiki", "nowhere", "file:", "file:/nonexistent"]),
                             st.lists(st.text(max_size=40), max_size=3), st.integers(), st.none()))
def test_compress_keywords_end_in_one_line_or_a_restorable_model(lm, method, budget, keywords, calibration):
    ids = torch.arange(3, 19).unsqueeze(0)
    with torch.no_grad():
        dense = lm.model(input_ids=ids).logits
    done = one_line_or_result(lambda: bench.compress(lm, None, method, calibration=calibration, progress=False,
                                                     **{"samples": 2, "seq_len": 32, "pair_tokens": 32, **budget,
                                                        **keywords}))
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
    import tasks as task_registry

    calls = []
    for name in ("lama", "ppl-token", "mmlu"):  # the checks run; the scoring is stubbed (the property is the checks')
        monkeypatch.setattr(task_registry.get_task(name), "evaluate", lambda self, *a, **k: calls.append(1) or {})
    one_line_or_result(lambda: bench.evaluate(lm, None, tasks, progress=False, **keywords))
