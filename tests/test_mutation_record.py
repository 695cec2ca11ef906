"""tests/mutation_score.py keeps mutmut's verdicts across runs: a fixture tree of mutmut's records (no mutmut run)
shows a verdict recorded, reused where mutmut has none, dropped when its function changes, and the score counting
equivalents apart."""

import json

import mutation_score as ms


def _meta(root, module, codes, hashes):
    path = root / (module + ".meta")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"exit_code_by_key": codes, "hash_by_function_name": hashes}))


def test_function_of_names_the_mutated_function():
    assert ms.function_of("methods/pca.py", "methods.pca.xǁPCAǁsolve__mutmut_12") == ("xǁPCAǁsolve", 12)
    assert ms.function_of("methods/__init__.py", "methods.x_parse_variant__mutmut_3") == ("x_parse_variant", 3)


def test_a_recorded_verdict_counts_while_its_function_is_unchanged(tmp_path):
    runs_dir = tmp_path / "mutants"
    f, g = "core.m.x_f__mutmut_", "core.m.x_g__mutmut_"
    _meta(runs_dir, "core/m.py", {f + "1": 1, f + "2": 0, f + "3": 33, g + "1": 1, g + "2": None},
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
    _meta(runs_dir, "core/m.py", {f + "1": None, f + "2": 1, f + "3": None, g + "1": None, g + "2": None},
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
