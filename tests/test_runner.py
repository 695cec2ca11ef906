"""`bench run` as a user runs it: bad input, interrupted sweeps, determinism, and the smoke check."""

import re
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from acbench.core.record import SCHEMA_VERSION

from acbench.cli.smoke import tiny_checkpoint
from acbench.methods.base import Compressor

BENCH = [sys.executable, "-m", "acbench.cli"]


def tiny_args(out: Path) -> list[str]:
    return ["run", "--model", str(tiny_checkpoint()), "--methods", "pca", "fasc", "svd", "--rank", "0.5",
            "--tasks", "mmlu", "lama", "ppl-token", "--calib-samples", "4", "--calib-seq-len", "64",
            "--pair-tokens", "64", "--mmlu-limit", "1", "--lama-limit", "1", "--lama-candidates", "6",
            "--ppl-windows", "2", "--ppl-seq-len", "64", "--output", str(out), "--no-report", "--quiet",
            "--no-latency"]  # no test here reads a speed: the latency protocol has its own tests


def cells(out: Path) -> dict[str, dict]:
    return {str(p.relative_to(out)): json.loads(p.read_text()) for p in sorted(out.rglob("*.json"))
            if not p.name.startswith(".")}


def run_bench(args, **kw):
    return subprocess.run(BENCH + args, capture_output=True, text=True, timeout=600, **kw)


REFUSALS = [
    (["--methods", "fsac"], "unknown method 'fsac'. Did you mean 'fasc'?"),
    (["--rank", "0"], "rank ratio 0.0 is outside (0, 1]"),
    (["--rank", "1.5"], "rank ratio 1.5 is outside (0, 1]"),
    (["--rank", "nan"], "rank ratio nan is outside (0, 1]"),
    (["--model", "/no/such/model-dir"], "model path /no/such/model-dir does not exist"),
    (["--model", "/no/such/model.gguf"], "model file /no/such/model.gguf does not exist"),
    (["--tasks", "mmlu", "lamma"], "unknown task 'lamma'. Did you mean 'lama'?"),
    (["--output", "/proc/acbench-results"], "is not writable"),
    (["--rank", "abc"], "--rank: 'abc' is not a number"),
    (["--method-option", "fasc.bogus=1"], "method 'fasc' has no setting bogus"),
]


@pytest.mark.parametrize("args,needle", REFUSALS)
def test_bad_input_one_line_exit_2(args, needle, capsys):
    """In this process, through the CLI's own entry (the same main a `bench` process runs)."""
    from acbench.cli import main

    rc = main(["run"] + args)
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1, err
    assert needle in lines[0] and "Traceback" not in err


def test_a_bench_process_refuses_in_one_line_and_exit_2():
    """One real `bench` process: its exit status and stderr are what a shell sees (the refusals themselves are
    checked in this process above)."""
    args, needle = REFUSALS[0]
    r = run_bench(["run"] + args)
    assert r.returncode == 2, r.stderr
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, r.stderr
    assert needle in lines[0] and "Traceback" not in r.stderr


def test_malformed_config(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("methods: [pca\nrank: 0.5\n")
    r = run_bench(["run", "--config", str(bad)])
    assert r.returncode == 2 and "is not valid YAML" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    bad.write_text("methods: pca\nrnak: 0.5\n")
    r = run_bench(["run", "--config", str(bad)])
    assert r.returncode == 2 and "unknown key 'rnak' (did you mean 'ranks'?)" in r.stderr


def test_interrupted_sweep_resumes_and_matches_uninterrupted(tmp_path):
    args = tiny_args(tmp_path / "killed")
    out = tmp_path / "killed"
    snapshots = []
    for kill_after in (1, 5, 9):  # cells on disk when the process is killed: early, mid-sweep, late (of 12)
        proc = subprocess.Popen(BENCH + args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            if len(cells(out)) >= kill_after:
                break
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        done = cells(out)
        for rec in done.values():
            assert rec["schema_version"] == SCHEMA_VERSION and "metrics" in rec  # no partial or corrupt cell
        for earlier in snapshots:
            for name, rec in earlier.items():
                assert done[name] == rec  # finished cells are kept as they were
        snapshots.append(done)
    r = run_bench(args)
    assert r.returncode == 0, r.stderr
    final = cells(out)
    assert len(final) == 3 + 3 * 3  # dense + methods at one rank, three tasks each
    for name, rec in snapshots[-1].items():
        assert final[name] == rec
    # the same command with the same seed, uninterrupted and calibrating afresh (its own empty statistics
    # cache), gives identical metric values
    env = {**os.environ, "ACBENCH_CACHE": str(tmp_path / "fresh-cache"),
           "ACBENCH_STATS_CACHE": str(tmp_path / "fresh-cache" / "stats")}
    r = run_bench(tiny_args(tmp_path / "clean"), env=env)
    assert r.returncode == 0, r.stderr
    table = (r.stderr + r.stdout).split("where the time went:")[1]  # the run's stages, each with its share
    for stage in ("model load", "calibration", "compress pca", "evaluate ppl-token", "total"):
        assert f"| {stage}" in table, table
    logs = list((tmp_path / "clean" / ".runs").glob("*.stages"))  # the same table, stored
    assert len(logs) == 1
    log = json.loads(logs[0].read_text())
    stages = dict(log["stages"])
    assert log["cells_written"] == len(final) and {"model load", "calibration", "compress pca"} <= set(stages)
    names = [name for name, _ in log["stages"]]  # in the order they ran, as the printed table
    assert [n for n in names if f"| {n}" in table] == names and names.index("calibration") < names.index("compress pca")
    assert 0 < sum(stages.values()) <= log["seconds"]
    clean = cells(tmp_path / "clean")
    assert set(clean) == set(final)
    for name in final:
        assert clean[name]["metrics"] == final[name]["metrics"], name
    # a rerun computes nothing
    r = run_bench(tiny_args(tmp_path / "clean")[:-1])
    assert "0 cell(s) to compute" in r.stderr + r.stdout


@pytest.mark.slow  # trains the smoke model once per machine (cached), then about 90 s
def test_smoke_passes(tmp_path):
    # what a user's --output may already hold: a stray non-JSON .json file and another model's cells (the verdict
    # reads this smoke's own cells, by its plan, and counts nothing else)
    import shutil

    (tmp_path / "smoke").mkdir()
    (tmp_path / "smoke" / "notes.json").write_text("not json")
    shutil.copytree(Path(__file__).parent / "fixtures" / "results_families" / "model-c",
                    tmp_path / "smoke" / "model-c")
    r = run_bench(["smoke", "--no-latency", "--output", str(tmp_path / "smoke")])  # latency has its own tests
    assert r.returncode == 0, r.stdout + r.stderr
    assert "smoke OK" in r.stdout
    assert (tmp_path / "smoke" / "LEADERBOARD.md").exists()
    # every method's perplexity against the dense model's, the random subspace as the control it is
    assert re.search(r"control random @ rank 0.5: \d+ \(\d+\.\d\dx dense\)", r.stdout), r.stdout
    assert "BROKEN" not in r.stdout and "ok      teal @ unstructured 0.5" in r.stdout


class ZeroFactors(Compressor):
    """A broken method: every factor zero (the body's products vanish)."""

    name = "zero-factors"

    def solve(self, weights, stats, k):
        d = next(iter(weights.values())).shape[1]
        return {n: (W[:, :k] * 0, W.new_zeros(k, d)) for n, W in weights.items()}, False, [], {}


@pytest.mark.slow
def test_smoke_calls_a_method_that_destroys_the_model_broken(tmp_path, capsys):
    from acbench import methods
    from acbench.cli.smoke import smoke
    from acbench.results.smoke_verdict import broken_threshold

    assert broken_threshold(100.0, 10_000) == pytest.approx(1000.0)  # halfway in logs from 100 to 10,000
    methods.REGISTRY.register(ZeroFactors)
    try:
        rc = smoke(str(tmp_path / "smoke"), ["zero-factors", "svd"], latency=False)
    finally:
        methods.REGISTRY.unregister("zero-factors")
    out = capsys.readouterr().out
    assert rc == 1 and re.search(r"BROKEN  zero-factors @ rank 0.5: \d+", out) and "ok      svd @ rank 0.5" in out
    assert "perplexity of a broken model: ['zero-factors']" in out


@pytest.mark.parametrize("argv,needle", [
    (["smoke", "--methods", ""], "--methods is empty"),
    (["smoke", "--methods", "act-sparse:score=bogus"], "method 'act-sparse:score=bogus': act-sparse score 'bogus'"),
    (["smoke", "--methods", "pcaa"], "pca"),
    (["check-method", "act-sparse:score=bogus"], "method 'act-sparse:score=bogus': act-sparse score 'bogus'"),
])
def test_smoke_and_check_method_refuse_bad_names_in_one_line_before_any_work(monkeypatch, capsys, argv, needle):
    import acbench.cli.smoke as smoke_module
    from acbench.cli import main

    monkeypatch.setattr(smoke_module, "trained_tiny_checkpoint", lambda *a, **k: pytest.fail("trained first"))
    rc = main(argv)
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc == 2 and len(err) == 1 and needle in err[0] and "Traceback" not in err[0], err


def test_two_processes_building_the_smoke_model_at_once_both_get_it(tmp_path):
    """tiny_checkpoint() builds in a folder of its own and renames it into place: started together, both builders
    return the one saved model and leave no partial folder behind."""
    import subprocess
    import sys

    env = {**__import__("os").environ, "ACBENCH_CACHE": str(tmp_path)}
    code = "from acbench.cli.smoke import tiny_checkpoint; print(tiny_checkpoint())"
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-500:] for o in outs]
    assert {o[0].strip() for o in outs} == {str(tmp_path / "models" / "smoke-tiny-llama")}
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["smoke-tiny-llama"]
    assert (tmp_path / "models" / "smoke-tiny-llama" / "config.json").exists()
