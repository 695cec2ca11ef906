"""acbench is one import package: a user's own `tasks.py`, `core.py`, `methods/` and `bench.py` beside a script shadow
none of it, and the wheel installs `acbench` and nothing else at the top level."""

import json
import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# a research folder's own modules, first on the path of a script run from it (as a notebook's folder is)
USER_FILES = {"tasks.py": "OWNER = 'user tasks'\n", "core.py": "OWNER = 'user core'\n",
              "bench.py": "OWNER = 'user bench'\n", "methods/__init__.py": "OWNER = 'user methods'\n",
              "leaderboard.py": "OWNER = 'user leaderboard'\n"}

SCRIPT = r'''
import json, sys
import acbench
lm = acbench.load_model(sys.argv[1], progress=False)
with acbench.compress(lm, "pca", rank=0.5, calib_source="wiki", calib_samples=2, calib_seq_len=32,
                      progress=False) as c:
    scores = acbench.evaluate(c, tasks=["ppl-token"], ppl_windows=1, ppl_seq_len=16, progress=False)
import bench, core, methods, tasks, leaderboard
print(json.dumps({"ppl": scores["ppl-token"].metrics["ppl"], "owners": [m.OWNER for m in (bench, core, methods, tasks,
                  leaderboard)], "acbench": acbench.__file__, "names": sorted(acbench.__all__)}))
'''


def test_a_folder_with_its_own_tasks_core_methods_and_bench_shadows_nothing(tiny, tmp_path):
    folder = tmp_path / "research"
    for name, text in USER_FILES.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    env = {**os.environ, "ACBENCH_CACHE": str(tmp_path / "cache"), "ACBENCH_STATS_CACHE": str(tmp_path / "stats")}
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(tiny)], capture_output=True, text=True, cwd=folder,
                       env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["ppl"] > 1 and got["owners"] == ["user bench", "user core", "user methods", "user tasks",
                                                  "user leaderboard"]
    assert Path(got["acbench"]).parent == ROOT / "bench"
    assert {"compress", "evaluate", "list_methods", "list_tasks"} <= set(got["names"])


def test_the_wheel_installs_one_top_level_package(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path)], check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("acbench-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"acbench", wheel.name.split("-py")[0] + ".dist-info"}
    top_level = next(n for n in names if n.endswith("top_level.txt"))
    assert zipfile.ZipFile(wheel).read(top_level).decode().split() == ["acbench"]
    # every module of every mapped folder is in it, where the package imports it
    for folder, under in (("bench", "acbench"), ("core", "acbench/core"), ("methods", "acbench/methods"),
                          ("tasks", "acbench/tasks"), ("leaderboard", "acbench/leaderboard"),
                          ("analyses", "acbench/analyses"), ("studies", "acbench/studies")):
        for f in (ROOT / folder).rglob("*.py"):
            rel = f.relative_to(ROOT / folder).as_posix()
            if (f.parent / "__init__.py").exists():
                assert f"{under}/{rel}" in names, f"{folder}/{rel} missing from the wheel"


def test_pyproject_lists_every_package_folder():
    """setuptools installs the packages pyproject names: a new subfolder left out of the list would be missing from
    an install (and present in the repository, where the tests run)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = config["package-dir"]
    want = set()
    for name, folder in folders.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            want.add(".".join([name, *rel]))
    assert set(config["packages"]) == want, sorted(set(config["packages"]) ^ want)
