"""A method author's plugin never takes acbench down: an installed distribution whose entry point does not import
leaves every other method and command usable (one warning line naming it and its distribution), a plugin that takes
a built-in's name is named and skipped, and a plugin that misbehaves inside `bench run` (a NaN, wrongly shaped or
non-orthonormal basis, None, bad score factors, a raise) ends the run in one line naming the method, where it comes
from and the group, never a traceback."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from acbench.cli import main

PLUGIN = '''
import torch
from acbench.methods.from_function import low_rank_method, sparsity_method


def d_in(weights):
    return next(iter(weights.values())).shape[1]


@low_rank_method("nm-nan-basis")
def nan_basis(weights, k):
    return torch.full((d_in(weights), k), float("nan"), dtype=torch.float64)


@low_rank_method("nm-wrong-shape")
def wrong_shape(weights, k):
    return torch.eye(d_in(weights), dtype=torch.float64)[:, : k + 1]


@low_rank_method("nm-skewed-basis")
def skewed(weights, k):
    return 2 * torch.eye(d_in(weights), dtype=torch.float64)[:, :k]


@low_rank_method("nm-none-basis")
def nothing(weights, k):
    return None


@low_rank_method("nm-raises")
def raises(weights, k):
    raise RuntimeError("the author's own bug")


@sparsity_method("nm-negative-scores")
def negative(weights):
    return -torch.ones(next(iter(weights.values())).shape[1])


@sparsity_method("nm-nan-scores")
def nan_scores(weights):
    return torch.full((next(iter(weights.values())).shape[1],), float("nan"))
'''

MISBEHAVING = {"nm-nan-basis": "NaN or inf", "nm-wrong-shape": "not (", "nm-skewed-basis": "not orthonormal",
               "nm-none-basis": "NoneType", "nm-raises": "RuntimeError: the author's own bug",
               "nm-negative-scores": "negative, NaN or inf", "nm-nan-scores": "negative, NaN or inf"}


def _install(site: Path, dist: str, entries: dict[str, str]) -> None:
    """What `pip install` of a plugin distribution leaves: a dist-info whose entry points name the classes."""
    info = site / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    lines = "".join(f"{name} = {target}\n" for name, target in entries.items())
    (info / "entry_points.txt").write_text(f"[acbench.methods]\n{lines}")


def _run(argv) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue() + err.getvalue()


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    """A site folder on the path holding a broken distribution, one that takes pca's name and one of misbehaving
    methods; the registry looks again, and forgets them afterwards."""
    from acbench import methods

    site = tmp_path / "site"
    (site / "nm_misbehaving").mkdir(parents=True)
    (site / "nm_misbehaving" / "__init__.py").write_text("")
    (site / "nm_misbehaving" / "method.py").write_text(PLUGIN)
    (site / "nm_shadow.py").write_text("from acbench.methods.pca import PCA\n\n\nclass Shadow(PCA):\n    pass\n")
    _install(site, "nm-broken", {"nm-broken": "nm_missing_module.method:Nope"})
    _install(site, "nm-shadow", {"pca-again": "nm_shadow:Shadow"})
    _install(site, "nm-misbehaving", {n: f"nm_misbehaving.method:{c}" for n, c in (
        ("nm-nan-basis", "nan_basis"), ("nm-wrong-shape", "wrong_shape"), ("nm-skewed-basis", "skewed"),
        ("nm-none-basis", "nothing"), ("nm-raises", "raises"), ("nm-negative-scores", "negative"),
        ("nm-nan-scores", "nan_scores"))})
    monkeypatch.syspath_prepend(str(site))
    methods.REGISTRY.reload()
    yield methods.REGISTRY
    for name in MISBEHAVING:
        methods.REGISTRY.unregister(name)
    methods.REGISTRY.reload()


def test_a_broken_distribution_is_one_line_and_every_other_method_stays_usable(plugins, tiny, tmp_path):
    rc, text = _run(["ls", "methods"])
    assert rc == 0 and "pca" in text and "nm-raises" in text and "Traceback" not in text
    broken = [line for line in text.splitlines() if "nm-broken" in line]
    assert len(broken) == 1 and "nm_missing_module.method:Nope" in broken[0]
    assert "distribution nm-broken" in broken[0] and "ModuleNotFoundError" in broken[0] and "uninstall" in broken[0]
    # a built-in's name taken by a plugin: named, the built-in kept
    assert plugins.get("pca").__module__ == "acbench.methods.pca"
    shadow = [line for line in text.splitlines() if "nm-shadow" in line]
    assert len(shadow) == 1 and "'pca'" in shadow[0] and "rename" in shadow[0]
    rc, text = _run(["run", "--model", str(tiny), "--methods", "pca", "--rank", "0.5", "--tasks", "ppl-token",
                     "--ppl-windows", "1", "--ppl-seq-len", "16", "--calib-samples", "1", "--calib-seq-len", "16",
                     "--no-latency", "--no-report", "--quiet", "--output", str(tmp_path / "r")])
    assert rc == 0, text[-600:]
    rc, text = _run(["run", "--model", str(tiny), "--methods", "nm-broken", "--rank", "0.5",
                     "--output", str(tmp_path / "r")])
    assert rc == 2 and "Traceback" not in text
    assert "'nm-broken' is installed but not usable" in text and "distribution nm-broken" in text


@pytest.mark.parametrize("name", sorted(MISBEHAVING))
def test_a_misbehaving_plugin_ends_the_run_in_one_line_naming_it_and_the_group(plugins, tiny, tmp_path, name):
    budget = ["--sparsity", "0.5"] if "scores" in name else ["--rank", "0.5"]
    rc, text = _run(["run", "--model", str(tiny), "--methods", name, *budget, "--tasks", "ppl-token",
                     "--ppl-windows", "1", "--ppl-seq-len", "16", "--calib-samples", "1", "--calib-seq-len", "16",
                     "--no-latency", "--no-report", "--quiet", "--output", str(tmp_path / "r")])
    errors = [line for line in text.splitlines() if "error:" in line]
    assert rc == 2 and "Traceback" not in text and len(errors) == 1, text[-1500:]
    line = errors[0]
    assert f"method {name} (plugin of distribution nm-misbehaving) failed on group " in line
    assert MISBEHAVING[name] in line and f"bench check-method {name}" in line
    assert not list((tmp_path / "r").rglob(f"*/{name}/**/*.json"))  # no cell of the failed method


def test_a_broken_command_plugin_leaves_every_command_usable(tmp_path, monkeypatch):
    from acbench.results import plugged

    site = tmp_path / "site"
    info = site / "nm_cmd-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: nm-cmd\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[acbench.commands]\nnm-cmd = nm_missing_cmd:COMMAND\n")
    monkeypatch.syspath_prepend(str(site))
    plugged.plugged_commands.cache_clear()
    try:
        rc, text = _run(["ls", "tasks"])
        assert rc == 0 and "ppl-token" in text and "Traceback" not in text
        assert "nm_missing_cmd:COMMAND of distribution nm-cmd does not import" in text
        assert "emerge" in plugged.plugged_commands()  # the project's own command is still there
    finally:
        plugged.plugged_commands.cache_clear()
