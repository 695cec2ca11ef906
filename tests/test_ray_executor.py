"""`bench run --executor ray` on a local Ray instance started here (2 CPUs): same cells as the local executor, and a
worker that dies mid-sweep is retried with nothing lost or corrupt."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from acbench.cli import main
from acbench.cli.smoke import tiny_checkpoint
from acbench.results.store import cell_status

CRASH_ONCE = '''
import os

from acbench.methods.pca import PCA


class CrashOnce(PCA):
    """Test only: pca, whose first attempt kills its own worker process in the middle of the variant."""

    name = "crash-once"
    description = "test only: pca; the first attempt exits the process"

    def solve(self, weights, stats, k):
        marker = os.environ["ACBENCH_TEST_CRASH_MARKER"]
        if not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(17)
        return super().solve(weights, stats, k)
'''


def sweep_args(out: Path, methods: list[str], *extra: str) -> list[str]:
    return ["run", "--model", str(tiny_checkpoint()), "--methods", *methods, "--rank", "0.5", "0.25",
            "--tasks", "lama", "ppl-token", "--calib-samples", "4", "--calib-seq-len", "64", "--pair-tokens", "64",
            "--lama-limit", "1", "--lama-candidates", "6", "--ppl-windows", "2", "--ppl-seq-len", "64",
            "--output", str(out), "--no-report", "--quiet", "--no-latency", "--threads", "1", *extra]


def cells(out: Path) -> dict[str, dict]:
    return {str(p.relative_to(out)): json.loads(p.read_text()) for p in sorted(out.rglob("*.json"))
            if not p.name.startswith(".")}


def test_missing_ray_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    rc = main(sweep_args(tmp_path / "out", ["pca"], "--executor", "ray"))
    err = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
    assert rc == 2 and len(err) == 1 and "pip install -e '.[ray]'" in err[0]
    assert not (tmp_path / "out").exists()


def test_ray_address_without_ray_executor_is_refused(tmp_path, capsys):
    assert main(sweep_args(tmp_path / "out", ["pca"], "--ray-address", "auto")) == 2
    assert "--ray-address is for --executor ray" in capsys.readouterr().err


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    ray = pytest.importorskip("ray", reason="Ray is not installed (the ray extra: pip install -e '.[ray]'; "
                                             ".ci/run installs it)")
    import os

    plugin = tmp_path_factory.mktemp("plugin")
    (plugin / "crash_once_method.py").write_text(CRASH_ONCE)
    dist = plugin / "crash_once-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: crash-once\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[acbench.methods]\ncrash-once = crash_once_method:CrashOnce\n")
    marker = plugin / "crashed"
    # The workers Ray starts inherit this environment: they find the plugin and the marker as the driver does.
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "ACBENCH_TEST_CRASH_MARKER")}
    os.environ["PYTHONPATH"] = os.pathsep.join([str(plugin)] + ([saved["PYTHONPATH"]] if saved["PYTHONPATH"] else []))
    os.environ["ACBENCH_TEST_CRASH_MARKER"] = str(marker)
    sys.path.insert(0, str(plugin))
    from acbench import methods

    methods.REGISTRY.reload()
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=128 * 2**20, log_to_driver=False)
    try:
        yield marker
    finally:
        ray.shutdown()
        sys.path.remove(str(plugin))
        methods.REGISTRY.unregister("crash-once")
        methods.REGISTRY.reload()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.mark.slow
def test_ray_sweep_equals_local_executor(tmp_path, local_ray):
    local, on_ray = tmp_path / "local", tmp_path / "ray"
    # both families: a sparsity variant is a Ray task per pattern, as a low-rank one is per rank
    methods = ["pca", "fasc-kfac", "svd", "act-sparse:score=fisher", "--sparsity", "2:4"]
    assert main(sweep_args(local, methods)) == 0
    assert main(sweep_args(on_ray, methods, "--executor", "ray")) == 0
    a, b = cells(local), cells(on_ray)
    # dense + 3 methods x 2 ranks + 1 sparsity variant x 1 pattern, 2 tasks each
    assert len(a) == 2 * (1 + 3 * 2 + 1) and a.keys() == b.keys()
    for path in a:
        assert a[path]["metrics"] == b[path]["metrics"], path
        assert a[path]["records"] == b[path]["records"], path
    # a rerun on Ray computes nothing and rewrites nothing
    dates = {p: c["env"]["date"] for p, c in b.items()}
    assert main(sweep_args(on_ray, methods, "--executor", "ray")) == 0
    assert {p: c["env"]["date"] for p, c in cells(on_ray).items()} == dates


@pytest.mark.slow
def test_dead_worker_is_retried_and_nothing_is_lost(tmp_path, local_ray):
    out = tmp_path / "out"
    assert main(sweep_args(out, ["pca", "crash-once"], "--executor", "ray", "--retries", "2")) == 0
    assert local_ray.exists()  # the first attempt did die
    got = cells(out)
    assert len(got) == 2 * (1 + 2 * 2)
    for path in got:
        assert cell_status(out / path) is None, path  # every file is a complete, valid cell
    assert not list(out.rglob("*.lock"))  # no claim is left behind
    for rank in ("rank-0.5", "rank-0.25"):
        for task in ("lama", "ppl-token"):
            pca = next(c for p, c in got.items() if p.startswith(f"smoke-tiny-llama/pca/{rank}/{task}-"))
            crash = next(c for p, c in got.items() if p.startswith(f"smoke-tiny-llama/crash-once/{rank}/{task}-"))
            assert crash["metrics"] == pca["metrics"]  # the retried variant computed what pca computes
