"""What a method author relies on: a plugin's code keyed into its cells (an edit without a version bump recomputes)
with its distribution recorded; the method contract (acbench.testing), passed by every built-in method and failed,
check by check, by methods broken on purpose; and `bench new-method`'s package, installed and run as generated."""

from __future__ import annotations

import importlib
import sys

from acbench import methods
from acbench.core.registry import code_provenance
from acbench.methods.base import Compressor


def _package(root, name: str, helper: str) -> None:
    pkg = root / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .method import Mine\n")
    (pkg / "method.py").write_text(
        "from acbench.methods.base import Compressor\nfrom .helpers import SCALE\n\n\nclass Mine(Compressor):\n"
        "    name = 'mine'\n")
    (pkg / "helpers.py").write_text(helper)


def _load(root, name: str):
    for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[mod]
    importlib.invalidate_caches()
    return importlib.import_module(name).Mine


def test_a_plugin_package_is_keyed_by_all_its_files_and_names_its_distribution(tmp_path, monkeypatch):
    _package(tmp_path, "my_plugin_pkg", "SCALE = 1\n")
    dist = tmp_path / "my_plugin_pkg-0.3.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-plugin-pkg\nVersion: 0.3\n")
    (dist / "top_level.txt").write_text("my_plugin_pkg\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    first = code_provenance(_load(tmp_path, "my_plugin_pkg"))
    assert first["module"] == "my_plugin_pkg.method" and first["files"] == 3
    assert (first["distribution"], first["distribution_version"]) == ("my-plugin-pkg", "0.3")
    # an edit to a helper the method imports, with no version bump, changes the digest
    (tmp_path / "my_plugin_pkg" / "helpers.py").write_text("SCALE = 2\n")
    second = code_provenance(_load(tmp_path, "my_plugin_pkg"))
    assert second["code_digest"] != first["code_digest"] and len(second["code_digest"]) == 16
    assert {k: v for k, v in second.items() if k != "code_digest"} == \
        {k: v for k, v in first.items() if k != "code_digest"}


def test_a_built_in_method_is_keyed_by_its_own_module_file():
    import hashlib
    from pathlib import Path

    from acbench import methods

    cls = methods.get_method("pca")
    got = code_provenance(cls)
    path = Path(methods.__file__).parent / "pca.py"
    want = hashlib.sha256(b"pca.py\0" + path.read_bytes() + b"\0").hexdigest()[:16]
    assert got == {"module": "acbench.methods.pca", "files": 1, "code_digest": want, "distribution": None,
                   "distribution_version": None}


def test_a_plugins_method_key_holds_its_code_digest_and_a_built_ins_does_not(tmp_path, monkeypatch):
    from acbench.runner.config import RunConfig
    from acbench.runner.resolve import resolve_run

    _package(tmp_path, "my_keyed_pkg", "SCALE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mine = _load(tmp_path, "my_keyed_pkg")
    mine.needs = frozenset()
    mine.solve = lambda self, weights, stats, k: None
    methods.REGISTRY.register(mine)
    try:
        run = resolve_run(RunConfig(methods=["pca", "mine"], ranks=[0.5], tasks=["ppl-token"], output=str(tmp_path)))
        assert run.method_key("mine")["code"] == code_provenance(mine)["code_digest"]
        assert "code" not in run.method_key("pca")  # built-ins: keyed by version, pinned by test_cells
    finally:
        methods.REGISTRY.unregister("mine")


# ---------------------------------------------------------------- the contract, on every built-in and on broken ones

import pytest  # noqa: E402
import torch  # noqa: E402

from acbench.testing import FakeGroup, assert_method_contract, check_method, random_stats, random_weights  # noqa: E402
from acbench.core.stats import RankSpec  # noqa: E402
from acbench.methods.base import SparseActivation, SparsityMethod  # noqa: E402


@pytest.mark.parametrize("name", methods.known_methods())
def test_every_built_in_method_meets_the_contract(name):
    assert_method_contract(name)


class Registered:
    """Register a test method class for the block (the registry the CLI and the contract read)."""

    def __init__(self, cls):
        self.cls = cls

    def __enter__(self):
        methods.REGISTRY.register(self.cls)
        return self.cls.name

    def __exit__(self, *exc):
        methods.REGISTRY.unregister(self.cls.name)


class ForgetsTheDevice(Compressor):
    name = "forgets-the-device"
    needs = frozenset({"C"})

    def solve(self, weights, stats, k):
        from acbench.methods.base import projection_factors

        from acbench.core.linalg import check_finite

        check_finite("forgets-the-device", C=stats.C)
        E = torch.eye(stats.C.shape[0], dtype=stats.C.dtype)[:, :k]  # no device=: made on the default device
        return projection_factors(weights, E, E.T), True, [], {}


class SolvesThroughNaN(Compressor):
    name = "solves-through-nan"
    needs = frozenset({"C"})

    def solve(self, weights, stats, k):
        from acbench.methods.base import projection_factors

        U = torch.linalg.eigh(torch.nan_to_num(stats.C))[1][:, -k:]  # a NaN replaced in silence
        return projection_factors(weights, U, U.T), True, [], {}


class ThresholdAndShift(SparsityMethod):
    name = "threshold-and-shift"

    def solve(self, weights, stats, pattern):
        d = next(iter(weights.values())).shape[1]
        return SparseActivation(pattern=pattern, threshold=0.1, mitigation="shift", mu=torch.zeros(d))


def _failed(name, reference=None) -> dict:
    return {c.name: c.detail for c in check_method(name, reference) if c.passed is False}


def test_a_method_that_forgets_the_device_fails_that_check_alone():
    with Registered(ForgetsTheDevice) as name:
        failed = _failed(name)
    assert list(failed) == ["tensors made on the inputs' device"]
    assert failed["tensors made on the inputs' device"].endswith("pass device= (and dtype=) from the solve's inputs "
                                                                 "to every tensor it creates")


def test_a_method_that_solves_through_a_nan_fails_the_refusal_check():
    with Registered(SolvesThroughNaN) as name:
        failed = _failed(name)
    assert list(failed) == ["non-finite statistics refused"]
    assert "NaN in C gave a finite result instead of a refusal: call acbench.core.linalg.check_finite" in \
        failed["non-finite statistics refused"]


def test_a_result_no_layer_can_deploy_fails_every_check_that_compresses():
    with Registered(ThresholdAndShift) as name:
        failed = _failed(name)
    assert {"patterns", "deployed form = its product", "checkpoint reloads with equal logits"} <= set(failed)
    assert "a threshold together with mitigation 'shift'" in failed["patterns"]


def test_the_authors_reference_is_checked_both_ways():
    def svd_reference(weights, stats, k):
        out = {}
        for n, W in weights.items():
            U, s, Vh = torch.linalg.svd(W, full_matrices=False)
            out[n] = (U[:, :k[n]] * s[:k[n]]) @ Vh[:k[n]]
        return out

    assert _failed("svd", svd_reference) == {}
    wrong = _failed("svd", lambda w, st, k: {n: W * 0.9 for n, W in svd_reference(w, st, k).items()})
    assert list(wrong) == ["equals the author's reference"]
    # a sparsity reference: x as kept
    from acbench.core.sparsity import topk_mask

    def by_magnitude(x, weights, stats, pattern):
        return x * topk_mask(x.abs(), *pattern.topk_args(x.shape[-1]))

    assert _failed("act-sparse:score=abs", by_magnitude) == {}
    assert list(_failed("act-sparse:score=abs", lambda x, w, st, p: x)) == ["equals the author's reference"]


def test_the_fixtures_hold_every_statistic_a_method_may_read():
    st = random_stats(16, sites={"s0": 7})
    for name in ("C", "F", "abs_mean", "mean", "abs_hist", "xs", "gs"):
        assert torch.isfinite(getattr(st, name)).all(), name
    assert st.C.shape == st.F.shape == (16, 16) and st.xs.shape == st.gs.shape == (400, 16)
    assert st.xs.dtype == torch.float32 and st.C.dtype == torch.float64
    assert float(st.abs_hist.sum()) == pytest.approx(1.0) and st.row_fisher["s0"].shape == (7,)
    group = FakeGroup(random_weights((7, 5), 16))
    assert (group.d_in, group.d_outs, group.site_names) == (16, (7, 5), ("s0", "s1"))
    res = methods.build("pca").compress(group, st, RankSpec(0.5))
    assert res.k == 8


# ---------------------------------------------------------------- bench new-method, as an author uses it

def test_new_method_refuses_bad_names_and_existing_folders(tmp_path, capsys):
    from acbench.cli import main

    for name, why in [("My_SVD", "must be lowercase words joined by '-'"), ("pca", "is registered already"),
                      ("class", "makes the Python keyword 'class'")]:
        assert main(["new-method", name, "--family", "low-rank", "--output", str(tmp_path)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and why in err[0], err
    assert main(["new-method", "my-svd", "--family", "low-rank", "--output", str(tmp_path)]) == 0
    assert main(["new-method", "my-svd", "--family", "sparsity", "--output", str(tmp_path)]) == 2
    assert "exists: remove it or pass --output elsewhere" in capsys.readouterr().err


@pytest.mark.parametrize("name,why", [
    ("torch", "the installed distribution 'torch'"), ("numpy", "the installed distribution 'numpy'"),
    ("acbench", "is reserved by acbench"), ("tests", "acbench's own package 'tests'"),
    ("benchmarks", "acbench's own package 'benchmarks'"), ("dense", "is reserved by acbench"),
    ("all", "is reserved by acbench"), ("rho-analysis", "is reserved by acbench"),
    ("json", "the importable module 'json'"), ("a" + "-b" * 40, "characters long: keep it to 64"),
])
def test_new_method_refuses_names_that_would_break_the_environment(tmp_path, capsys, name, why):
    from acbench.cli import main

    assert main(["new-method", name, "--family", "low-rank", "--output", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and why in err[0], err
    assert not list(tmp_path.iterdir())  # nothing written


def test_new_method_refuses_an_output_it_cannot_write_in_one_line(tmp_path, capsys):
    import os

    from acbench.cli import main

    (tmp_path / "afile").write_text("x")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    cases = [(tmp_path / "afile", "is a file"), (tmp_path / "afile" / "sub", "cannot be made")]
    if os.geteuid() != 0:  # root writes anywhere: the permission case is a user's
        cases.append((locked, "not writable"))
    try:
        for out, why in cases:
            assert main(["new-method", "my-svd", "--family", "low-rank", "--output", str(out)]) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and why in err[0], err
    finally:
        locked.chmod(0o700)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "locked"]


@pytest.mark.parametrize("form", ["function", "class"])
@pytest.mark.parametrize("family", ["low-rank", "sparsity"])
def test_each_generated_template_meets_the_contract_and_its_own_reference(tmp_path, monkeypatch, family, form):
    """The generated package's method (one decorated function by default, or a class), imported from the folder
    as written, passes the contract with the reference its generated test holds; and that reference is not
    vacuous: it fails a different method."""
    from acbench.cli.author import new_method

    name = f"gen-{family}-{form}"
    module = name.replace("-", "_")
    folder = new_method(name, family, tmp_path, form)
    decorated = "@low_rank_method" if family == "low-rank" else "@sparsity_method"
    assert (decorated in (folder / module / "method.py").read_text()) == (form == "function")
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.syspath_prepend(str(folder / "tests"))
    cls = importlib.import_module(f"{module}.method").__dict__["".join(p.capitalize() for p in name.split("-"))]
    generated_test = importlib.import_module(f"test_{module}")
    with Registered(cls):
        assert _failed(name, generated_test.reference) == {}
        generated_test.__dict__[f"test_{module}_meets_the_method_contract"]()
    other = "svd" if family == "low-rank" else "act-sparse"
    assert list(_failed(other, generated_test.reference)) == ["equals the author's reference"]


@pytest.mark.slow
@pytest.mark.parametrize("family", ["low-rank"])
def test_a_generated_method_installs_lists_passes_its_checks_and_recomputes_after_an_edit(tmp_path, family):
    """`bench new-method` as a new author runs it: installed by pip (no index), listed, its contract and its own
    tests passing, `bench smoke --methods` passing, and an edit to its code without a version bump recomputing
    its cells on the next `bench run`."""
    import json
    import os
    import subprocess

    from acbench.cli.smoke import tiny_checkpoint

    def bench(*args):
        done = subprocess.run([sys.executable, "-c", "import sys; from acbench.cli import main; sys.exit(main())",
                               *args], capture_output=True, text=True, env=env, cwd=tmp_path)
        assert done.returncode == 0, (args, done.stdout[-1500:], done.stderr[-1500:])
        return done.stdout

    name = f"my-{family}"
    module = name.replace("-", "_")
    site = tmp_path / "site"
    env = {**os.environ, "PYTHONPATH": str(site)}
    bench("new-method", name, "--family", family)
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                          "--target", str(site), str(tmp_path / name)], capture_output=True, text=True)
    assert pip.returncode == 0, pip.stderr[-2000:]
    assert name in bench("ls", "methods")
    assert "meets the method contract" in bench("check-method", name)
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / name)],
                           capture_output=True, text=True, env=env, cwd=tmp_path / name)
    assert tests.returncode == 0 and "1 passed" in tests.stdout, tests.stdout[-2000:]
    assert "smoke OK" in bench("smoke", "--methods", name, "--no-latency", "--output", str(tmp_path / "smoke"))
    budget = ["--rank", "0.5"] if family == "low-rank" else ["--sparsity", "0.5"]
    run = ["run", "--model", str(tiny_checkpoint()), "--methods", name, *budget, "--tasks", "ppl-token",
           "--ppl-windows", "1", "--ppl-seq-len", "32", "--calib-samples", "2", "--calib-seq-len", "32",
           "--no-latency", "--no-report", "--quiet", "--output", str(tmp_path / "results")]
    bench(*run)
    cells = lambda: sorted(p for p in (tmp_path / "results").rglob("ppl-token-*.json") if name in str(p))
    first = cells()
    assert len(first) == 1
    code = json.loads(first[0].read_text())["compression"]["method_code"]
    assert code["distribution"] == name and code["distribution_version"] == "0.1.0" and code["files"] == 2
    bench(*run)
    assert cells() == first  # unchanged code: the cell is reused
    method = site / module / "method.py"
    method.write_text(method.read_text().replace("power: float = 1.0", "power: float = 0.5"))  # no version bump
    bench(*run)
    assert len(cells()) == 2  # a new key: the edited method's cell is computed, the old one left as it was
