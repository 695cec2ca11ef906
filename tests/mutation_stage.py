"""The package laid out as it imports, for mutmut: `make mutate` runs mutmut inside .mutation/.

mutmut names a mutant by its file's path (core/linalg.py -> core.linalg.x_damp__mutmut_1) and its trampolines
compare that name with the mutated function's `__module__` at run time, which is acbench.core.linalg: the
repository's folders are mapped into the one package by setuptools' package_dir, so mutmut must mutate a copy laid
out as the package (bench/ as acbench/, core/ as acbench/core/, ...). This writes that copy, the tests and docs
beside it, and mutmut's configuration (pyproject's [tool.mutmut], its paths moved) into .mutation/; mutmut's own
state (.mutation/mutants/) stays between runs.
Usage: python tests/mutation_stage.py
"""

from __future__ import annotations

import json
import shutil
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAGE = ROOT / ".mutation"
PACKAGE = "acbench"
FOLDERS = ("core", "methods", "tasks", "analyses", "leaderboard", "studies")  # beneath acbench; bench/ is acbench
# the tests that read the repository's folder layout (the import-direction checks) cannot run in the staged copy;
# they test no function mutmut mutates
LAYOUT_TESTS = ("tests/test_layers.py",)


def staged_path(repo_path: str) -> str:
    """bench/x.py -> acbench/x.py, core/x.py -> acbench/core/x.py (a glob pattern passes through)."""
    top, _, rest = repo_path.partition("/")
    if top == "bench":
        return f"{PACKAGE}/{rest}"
    if top in FOLDERS:
        return f"{PACKAGE}/{repo_path}"
    raise ValueError(f"{repo_path}: not in a folder of the package")


def repo_path(staged: str) -> str:
    """The inverse of staged_path: acbench/core/x.py -> core/x.py, acbench/x.py -> bench/x.py."""
    head, _, rest = staged.partition("/")
    if head != PACKAGE:
        raise ValueError(f"{staged}: not under {PACKAGE}/")
    return rest if rest.partition("/")[0] in FOLDERS else f"bench/{rest}"


def import_name(repo_file: str) -> str:
    """methods/pca.py -> acbench.methods.pca; bench/runner/cells.py -> acbench.runner.cells."""
    return staged_path(repo_file)[: -len(".py")].replace("/", ".").removesuffix(".__init__")


def _toml(value) -> str:
    return json.dumps(value, ensure_ascii=False)  # strings, numbers and lists of them read the same in TOML


def stage_config(pyproject: dict) -> str:
    mm = dict(pyproject["tool"]["mutmut"])
    mm["source_paths"] = [f"{PACKAGE}/"]
    mm["only_mutate"] = [staged_path(p) for p in mm["only_mutate"]]
    mm["pytest_add_cli_args_test_selection"] = [t for t in mm["pytest_add_cli_args_test_selection"]
                                                if t not in LAYOUT_TESTS]
    lines = ["# written by tests/mutation_stage.py from pyproject.toml: edit that one", "[tool.mutmut]"]
    lines += [f"{k} = {_toml(v)}" for k, v in mm.items()]
    lines += ["", "[tool.pytest.ini_options]"]
    lines += [f"{k} = {_toml(v)}" for k, v in pyproject["tool"]["pytest"]["ini_options"].items()]
    return "\n".join(lines) + "\n"


def _copy(src: Path, dst: Path) -> None:
    if dst.exists():
        shutil.rmtree(dst) if dst.is_dir() else dst.unlink()
    if src.is_dir():  # copy2 keeps the times: mutmut regenerates only the mutants of files that changed
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"), copy_function=shutil.copy2)
    else:
        shutil.copy2(src, dst)


def stage(root: Path = ROOT, out: Path = STAGE) -> None:
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    out.mkdir(exist_ok=True)
    package = out / PACKAGE
    if package.exists():
        shutil.rmtree(package)
    _copy(root / "bench", package)
    for folder in FOLDERS:
        _copy(root / folder, package / folder)
    for extra in ["tests", *pyproject["tool"]["mutmut"].get("also_copy", [])]:
        _copy(root / extra.rstrip("/"), out / extra.rstrip("/"))
    (out / "pyproject.toml").write_text(stage_config(pyproject))


if __name__ == "__main__":
    stage()
    print(f"staged {PACKAGE}/ for mutmut in {STAGE.relative_to(ROOT)}/", file=sys.stderr)
