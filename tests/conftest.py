import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, settings

# Without CUDA, the decode path's Triton kernel is tested in triton's interpreter, which must be on before triton is
# first imported (its language functions are built for one mode at import).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig
from acbench.core.stats import ACTIVATION_STATS, GRADIENT_STATS

# A parallel worker (pytest-xdist) runs on one CPU of its own with one thread: two workers each running torch on
# both cores slow each other's linear algebra tenfold. The affinity is what the harness reads as the CPUs it may use
# (acbench.results.store.available_cpus), and the processes a test starts inherit it.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if _WORKER and hasattr(os, "sched_setaffinity"):
    _cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {_cpus[int(_WORKER.removeprefix("gw")) % len(_cpus)]})
    torch.set_num_threads(1)

# Hypothesis profiles: `fast` (default, bounded examples); `ci` (HYPOTHESIS_PROFILE=ci, which .ci/run sets for `make
# test`, so the fuzz targets run once there, at 150 examples each). Both are derandomized, so that a red run names a
# case that fails again on a rerun; `explore` draws new cases every run, to go looking for crashes by hand.
settings.register_profile("fast", max_examples=25, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
settings.register_profile("ci", max_examples=150, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
settings.register_profile("explore", max_examples=1000, deadline=None,
                          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fast"))


# The statistics cache is the suite's own, never the user's: one folder per test process, shared by the tests that
# do not test the cache itself (a CLI test reads the calibration another test of the same model and sizes stored,
# as a user's second run does), and a private one for the tests that do (`private_stats_cache`). Made and removed
# per pytest session, not per import: mutmut runs a session per mutant in a forked child that never reaches atexit.
_SESSION_STATS = ""


def pytest_configure(config):
    global _SESSION_STATS
    _SESSION_STATS = tempfile.mkdtemp(prefix="acbench-test-stats-")
    os.environ["ACBENCH_STATS_CACHE"] = _SESSION_STATS


def pytest_unconfigure(config):
    if _SESSION_STATS:
        shutil.rmtree(_SESSION_STATS, ignore_errors=True)


# The latency protocol's memory-bandwidth probe on 16 MB arrays, not 256: the tests check its fields, not the machine
os.environ.setdefault("ACBENCH_BANDWIDTH_MB", "16")


@pytest.fixture(autouse=True)
def shared_stats_cache(monkeypatch):
    monkeypatch.setenv("ACBENCH_STATS_CACHE", _SESSION_STATS)  # whatever an earlier test left in the environment
    return Path(_SESSION_STATS)


@pytest.fixture
def private_stats_cache(tmp_path_factory, monkeypatch):
    """An empty statistics cache of this test's own: for tests of the cache (what it stores, reuses, rejects)."""
    folder = tmp_path_factory.mktemp("stats-cache")
    monkeypatch.setenv("ACBENCH_STATS_CACHE", str(folder))
    return folder


def tiny_config(arch: str = "llama", hidden: int = 32, inter: int = 48, layers: int = 2, vocab: int = 101):
    if arch == "llama":
        return LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                           tie_word_embeddings=False)
    if arch == "gemma3":
        return Gemma3TextConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                                num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                max_position_embeddings=256, sliding_window=16,
                                layer_types=["sliding_attention", "full_attention"][:layers] * (layers // 2 or 1))
    raise ValueError(arch)


def tiny_model(arch: str = "llama", seed: int = 0, **kw):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, **kw), dtype=torch.float32)
    return model.eval()


EVERY_STAT = ACTIVATION_STATS | GRADIENT_STATS  # every statistic a method can ask for


def calibrated_tiny(windows: int, seq_len: int, pair_tokens: int, hidden: int = 48, inter: int = 64):
    """A tiny random Llama and every statistic of every group, from `windows` random token windows (seed 0)."""
    from acbench.calibration.engine import CalibSpec, calibrate
    from acbench.model.groups import find_input_groups

    model = tiny_model("llama", hidden=hidden, inter=inter)
    ids = torch.randint(0, 101, (windows, seq_len), generator=torch.Generator().manual_seed(0))
    stats = calibrate(model, find_input_groups(model), ids, EVERY_STAT, CalibSpec(pair_tokens=pair_tokens),
                      progress=False)
    return model, stats


def one_block_with_c():
    """(model, groups, stats): a one-block tiny Llama (hidden 32, MLP 48) and its groups' C from 4 random windows of
    16 tokens (seed 1), for the sparsity methods' deployed-form tests."""
    from acbench.calibration.engine import CalibSpec, calibrate
    from acbench.model.groups import find_input_groups

    model = tiny_model("llama", hidden=32, inter=48, layers=1)
    windows = torch.randint(0, 101, (4, 16), generator=torch.Generator().manual_seed(1))
    groups = find_input_groups(model)
    return model, groups, calibrate(model, groups, windows, frozenset({"C"}), CalibSpec(), progress=False)


def hand_cell(model, method, task, rank, values, budget="rank", compute=0.5, calibration=None, timings=None,
              task_config=None, allocation="uniform", fingerprint=None, compression=None):
    """A cell made by hand: per-window NLLs (ppl-token) or per-item 0/1 answers (any other task), stored as a run
    stores them, for the tests of what is built from cells (studies' tables and verdicts)."""
    import math

    from acbench.core.record import CellRecord

    if task == "ppl-token":
        records = [{"window": i, "nll": float(v)} for i, v in enumerate(values)]
        metrics, key = {"ppl": math.exp(sum(values) / len(values))}, "ppl"
    else:
        records = [{"id": i, "correct": bool(v), "chance": 0.25} for i, v in enumerate(values)]
        metrics, key = {"p@1": sum(values) / len(values)}, "p@1"
    dense = method == "dense"
    if task_config is None:  # the run's default protocol
        task_config = {"seq_len": 256, "max_windows": 16, "bos": "none"} if task == "ppl-token" else {}
    return CellRecord.from_json({
        "schema_version": 4, "cell": {"model": model, "method": method, "rank": None if dense else rank,
                                      "budget": "rank" if dense else budget, "task": task, "key": "k",
                                      "allocation": allocation},
        "task_config": task_config,
        "higher_is_better": {key: task != "ppl-token"}, "metrics": metrics, "primary_metric": key,
        "versions": {"task": 1, "method": None if dense else 1}, "records": records,
        "model_fingerprint": fingerprint or {"source": "gguf", "sha256": "x", "dtype": "float32"}, "seed": 0,
        "stderr": {},
        "env": {"date": "2026-12-05T00:00:00Z"}, "details": {}, "calibration": calibration, "timings": timings or {},
        "compression": None if dense else {"param_ratio": 1.0, "compute_ratio": compute, **(compression or {})}})


@pytest.fixture(params=["llama", "gemma3"])
def arch(request):
    return request.param


@pytest.fixture
def windows():
    gen = torch.Generator().manual_seed(1)
    return torch.randint(0, 101, (8, 24), generator=gen)


ROOT = Path(__file__).resolve().parent.parent


def doc_pages() -> dict[str, str]:
    """{path: text} of the documentation a user reads: README.md and every page of docs/."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return {str(f.relative_to(ROOT)): f.read_text(encoding="utf-8") for f in files}


def docs_text() -> str:
    """README.md and docs/ as one text, for the checks that a flag, a block or an example is documented somewhere."""
    return "\n".join(doc_pages().values())


def readme_example(first_line: str) -> dict:
    """Run the documentation's python block that starts with `first_line`; its namespace (the code shown is real)."""
    import re

    code = re.search(r"```python\n(" + re.escape(first_line) + r".*?)```", docs_text(), re.S).group(1)
    ns: dict = {}
    exec(compile(code, "README example", "exec"), ns)
    return ns


@pytest.fixture(scope="module")
def tiny():
    """The smoke check's tiny random Llama with SmolLM2's tokenizer, saved once in the cache."""
    from acbench.cli.smoke import tiny_checkpoint

    return tiny_checkpoint()


@pytest.fixture
def checked_only(monkeypatch):
    """bench run / compress stop once everything is validated and planned (no weights, no cells): the fuzz targets
    explore the checks, not the compute."""
    import acbench.runner.execute
    import acbench.runner.one_variant
    import acbench.runner.prepare
    from acbench.runner import ray_executor

    monkeypatch.setattr(acbench.runner.execute, "sweep_runs", lambda runs: acbench.runner.execute.prepare_models(runs)
                        if len(runs) > 1 else [acbench.runner.execute.prepare(runs[0])])
    monkeypatch.setattr(ray_executor, "run_on_ray", lambda run: (acbench.runner.execute.prepare(run), {"failed": []})[1])

    def checked_save(run, out, merge=False, overwrite=False):
        acbench.runner.prepare.open_checked(run)
        return {"weight_bytes": 1, "dense_bytes": 1, "seconds": 0.0, "custom_code": False,
                "provenance": {"budget": "-", "compression": {"groups_factorised": 0, "groups": [], "param_ratio": 1}}}

    monkeypatch.setattr(acbench.runner.one_variant, "save_compressed", checked_save)


# measured with --durations on a 2-core machine (2026-12-04): the slow tests over 40 s
# the docs page on SmolLM2 (399 s of a 621 s slow run on 2 cores, 2026-12-07), then the golden values (157 s)
LONGEST_FIRST = ("tests/test_python_api_docs.py::test_the_page_runs_as_written_on_smollm2",
                 "tests/test_real_models.py::test_golden_values_smollm2",
                 "tests/test_method_authors.py::test_a_generated_method_installs_lists_passes_its_checks_and_"
                 "recomputes_after_an_edit", "tests/test_real_models.py::test_mmlu_native_equals_lm_eval_on_smollm2",
                 "tests/test_real_models.py::test_converted_default_model_matches_gguf_and_is_cached")


def pytest_collection_modifyitems(config, items):
    """A normal run starts LONGEST_FIRST's tests first and keeps the files' order for the rest: in collection order
    SmolLM2's golden values (about 190 s of a 360 s warm-cache slow run) started last, on a worker that had run its
    module's others.

    Under a mutation run, the tests a mutant is tried against run fastest first: mutmut hands them over in no
    particular order and stops at the first failure (-x), so a mutant a 0.01 s reference test kills could wait
    behind an 8 s end-to-end test; the durations mutmut recorded when it mapped the tests put the cheap ones first.
    """
    mutant = os.environ.get("MUTANT_UNDER_TEST", "")
    if not mutant or mutant in ("stats", "list_all_tests", "mutant_generation"):
        first = {name: i for i, name in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda item: first.get(item.nodeid.split("[")[0], len(first)))
        return
    stats = Path("mutmut-stats.json")
    if not stats.exists():
        return
    import json

    durations = json.loads(stats.read_text()).get("duration_by_test", {})
    items.sort(key=lambda item: durations.get(item.nodeid, float("inf")))
