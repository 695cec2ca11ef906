"""tests/mutation_score.py keeps mutmut's verdicts across runs: a fixture tree of mutmut's records (no mutmut run)
shows a verdict recorded, reused where mutmut has none, dropped when its function changes, and the score counting
equivalents apart."""

import json
from pathlib import Path

import pytest

import mutation_score as ms


def _meta(root, module, codes, hashes):
    path = root / (module + ".meta")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"exit_code_by_key": codes, "hash_by_function_name": hashes}))


def test_function_of_names_the_mutated_function():
    assert ms.function_of("methods/pca.py", "acbench.methods.pca.xǁPCAǁsolve__mutmut_12") == ("xǁPCAǁsolve", 12)
    assert ms.function_of("methods/__init__.py", "acbench.methods.x_parse_variant__mutmut_3") == ("x_parse_variant", 3)


def test_a_recorded_verdict_counts_while_its_function_is_unchanged(tmp_path):
    runs_dir = tmp_path / "mutants"
    f, g = "acbench.core.m.x_f__mutmut_", "acbench.core.m.x_g__mutmut_"
    _meta(runs_dir, "acbench/core/m.py", {f + "1": 1, f + "2": 0, f + "3": 33, g + "1": 1, g + "2": None},
          {"x_f": "aaa", "x_g": "bbb"})
    runs, hashes = ms.collect_runs(runs_dir)
    assert runs == {"core/m.py": {f + "1": ms.KILLED, f + "2": ms.SURVIVED, f + "3": ms.UNTESTED,
                                  g + "1": ms.KILLED, g + "2": ms.OTHER}}
    record = ms.update_record(runs, hashes, {}, "2026-12-01")
    assert record == {"core/m.py": {"x_f": {"hash": "aaa", "date": "2026-12-01", ms.KILLED: [1], ms.SURVIVED: [2],
                                            ms.UNTESTED: [3]},
                                    "x_g": {"hash": "bbb", "date": "2026-12-01", ms.KILLED: [1]}}}
    path = tmp_path / "record.json"
    ms.write_record(record, path)
    assert ms.load_record(path) == record and not path.with_suffix(".tmp").exists()

    # mutmut forgot everything (a new test list); g changed since, f did not
    _meta(runs_dir, "acbench/core/m.py", {f + "1": None, f + "2": 1, f + "3": None, g + "1": None, g + "2": None},
          {"x_f": "aaa", "x_g": "ccc"})
    runs, hashes = ms.collect_runs(runs_dir)
    by_module, dates = ms.merged(runs, hashes, record)
    assert by_module["core/m.py"] == {f + "1": ms.KILLED, f + "2": ms.KILLED, f + "3": ms.UNTESTED,
                                      g + "1": ms.OTHER, g + "2": ms.OTHER}
    assert dates["core/m.py"] == {"2026-12-01", "today"}
    before = json.dumps(record, sort_keys=True)
    again = ms.update_record(runs, hashes, record, "2026-12-03")
    assert json.dumps(record, sort_keys=True) == before  # the record given is not changed in place
    assert again["core/m.py"]["x_f"] == {"hash": "aaa", "date": "2026-12-03", ms.KILLED: [1, 2], ms.UNTESTED: [3]}
    assert again["core/m.py"]["x_g"]["hash"] == "bbb"  # nothing of g's new version ran: its old entry stays, unused
    assert ms.recorded(again, "core/m.py", g + "1", "ccc") is None
    assert ms.recorded(again, "core/m.py", g + "1", "bbb") == (ms.KILLED, "2026-12-01")


def test_the_tests_started_first_exist_and_are_slow():
    """tests/conftest.py starts the slow run's longest tests first by name: a renamed test would silently fall back
    to collection order."""
    import importlib

    from tests.conftest import LONGEST_FIRST

    def marks(obj) -> set[str]:  # pytestmark is one mark or a list of them
        found = getattr(obj, "pytestmark", [])
        return {m.name for m in (found if isinstance(found, list) else [found])}

    for node in LONGEST_FIRST:
        path, name = node.split("::")
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        assert "slow" in marks(getattr(module, name)) | marks(module), node


def test_the_staged_package_maps_each_folder_where_it_imports(tmp_path):
    """mutmut names a mutant by its file's path and compares that with `__module__`: the staged copy puts each file
    where the package imports it, and the score maps each back to the repository's file."""
    import tomllib

    from mutation_stage import import_name, repo_path, stage, stage_config, staged_path

    assert staged_path("bench/runner/cells.py") == "acbench/runner/cells.py"
    assert staged_path("core/linalg.py") == "acbench/core/linalg.py" and staged_path("methods/*") == "acbench/methods/*"
    assert repo_path("acbench/core/linalg.py") == "core/linalg.py"
    assert repo_path("acbench/runner/cells.py") == "bench/runner/cells.py"
    assert import_name("bench/__init__.py") == "acbench" and import_name("tasks/lama.py") == "acbench.tasks.lama"
    import acbench.tasks.lama
    assert import_name("tasks/lama.py") == acbench.tasks.lama.__name__
    with pytest.raises(ValueError, match="not in a folder"):
        staged_path("tests/x.py")
    root = Path(__file__).resolve().parent.parent
    config = tomllib.loads(stage_config(tomllib.loads((root / "pyproject.toml").read_text())))
    assert config["tool"]["mutmut"]["source_paths"] == ["acbench/"]
    assert all(p.startswith("acbench/") for p in config["tool"]["mutmut"]["only_mutate"])
    assert "tests/test_layers.py" not in config["tool"]["mutmut"]["pytest_add_cli_args_test_selection"]
    fake = tmp_path / "repo"
    for folder in ("bench/runner", "core", "methods", "tasks", "analyses", "leaderboard", "studies", "tests"):
        (fake / folder).mkdir(parents=True)
        (fake / folder / "m.py").write_text("x = 1\n")
    (fake / "pyproject.toml").write_text((root / "pyproject.toml").read_text().replace(
        'also_copy = ["studies/", "README.md", "docs/"]', "also_copy = []"))
    stage(fake, tmp_path / "stage")
    files = sorted(p.relative_to(tmp_path / "stage").as_posix() for p in (tmp_path / "stage").rglob("m.py"))
    assert files == ["acbench/analyses/m.py", "acbench/core/m.py", "acbench/leaderboard/m.py", "acbench/methods/m.py",
                     "acbench/runner/m.py", "acbench/studies/m.py", "acbench/tasks/m.py", "tests/m.py"]
