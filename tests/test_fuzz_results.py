"""Fuzz: generated result cells (never crash the report, never taken as done when edited into another meaning)
and data source rows with fields of every JSON type (load as text or one line)."""

import contextlib
import copy
import io
import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzz_common import _paths, FIXTURES, json_value


# ---------------------------------------------------------------- result cells

@pytest.fixture(scope="module")
def valid_cell():
    return json.loads((FIXTURES / "results" / VALID_PLACE).read_text())


VALID_PLACE = "model-b/fasc/rank-0.5/lama-k1.json"


@given(data=st.data())
def test_generated_cells_never_crash_the_report(tmp_path, valid_cell, data):
    from leaderboard.report import write_report

    paths = [p for p in _paths(valid_cell) if p]
    cell = copy.deepcopy(valid_cell)
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(paths))
        parent = cell
        try:
            for step in path[:-1]:
                parent = parent[step]
            parent[path[-1]] = data.draw(json_value)
        except (KeyError, IndexError, TypeError):
            continue  # the path went away with an earlier change
    root = tmp_path / "results"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(FIXTURES / "results" / "model-b" / "dense", root / "model-b" / "dense")
    # at the place its (changed) identity names, so that the report reads it; where the identity names no place,
    # at the original one (the reader skips it, saying why)
    from core.record import cell_relpath

    try:
        c = cell["cell"]
        place = cell_relpath(c["model"], c["method"], c.get("rank"), c["budget"], c["task"], c["key"],
                             c.get("allocation", "uniform"), c.get("scope", "all"))
        assert ".." not in place.parts and not place.is_absolute()
    except Exception:
        place = Path(VALID_PLACE)
    target = root / place
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(cell))
    except (OSError, ValueError):  # a generated name the file system refuses
        (root / VALID_PLACE).parent.mkdir(parents=True, exist_ok=True)
        (root / VALID_PLACE).write_text(json.dumps(cell))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        md = write_report(str(root))
    assert md.exists()


# another value of each identity field that a valid cell could carry (the hard case: the cell stays well-formed)
PLAUSIBLE = {"model": st.sampled_from(["model-a", "model-b/x", "gemma-3-270m"]),
             "method": st.sampled_from(["pca", "fasc-kfac", "svd", "dense", "act-sparse", "wanda"]),
             "rank": st.floats(0.01, 1.0), "budget": st.sampled_from(["rank", "params", "sparsity"]),
             "task": st.sampled_from(["ppl-token", "mmlu", "rho", "lama"]),
             "key": st.text("0123456789abcdef", min_size=1, max_size=12),
             "allocation": st.sampled_from(["uniform", "fisher", "greedy"]),
             "scope": st.sampled_from(["all", "groups=mlp_in", "blocks=0-1"])}
IDENTITY = tuple(PLAUSIBLE)
PROVENANCE = ("env", "model_fingerprint", "compression")


@given(data=st.data(), field=st.sampled_from(IDENTITY), metric_value=st.floats(allow_nan=False),
       drop=st.sampled_from(PROVENANCE), which=st.sampled_from(["identity", "metric", "provenance"]))
def test_a_cell_that_is_not_what_its_place_says_is_never_taken_as_done(tmp_path, valid_cell, data, field,
                                                                       metric_value, drop, which):
    """Edited in its place, a cell is done only if it still means what its place says: an identity field changed
    (a pca cell relabelled fasc), a metric outside its domain (a ppl of -1), a provenance field dropped: each is
    a reason to recompute it (bench run) and to name it (bench report)."""
    from bench.store import cell_status
    from core.record import metric_domain

    cell = copy.deepcopy(valid_cell)
    target = tmp_path / VALID_PLACE
    target.parent.mkdir(parents=True, exist_ok=True)  # tmp_path is shared by the examples: each rewrites the cell
    target.write_text(json.dumps(cell))
    assert cell_status(target) is None  # the fixture is a done cell at its own place
    if which == "identity":
        value = data.draw(PLAUSIBLE[field] | json_value)
        if cell["cell"].get(field) == value or (field == "allocation" and value == "uniform" and field not in
                                                cell["cell"]) or (field == "scope" and value == "all"):
            return  # the same identity
        cell["cell"][field] = value
    elif which == "metric":
        name = next(iter(cell["metrics"]))
        lo, hi = metric_domain(name)
        if lo <= metric_value <= hi:
            return  # inside the domain: a possible result, which no check can refuse
        cell["metrics"][name] = metric_value
    else:
        del cell[drop]
    target.write_text(json.dumps(cell))
    assert cell_status(target) is not None, (which, field, value, metric_value, drop)


# ---------------------------------------------------------------- data sources: fields of every JSON type

json_any = st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False)
                        | st.text(max_size=6) | st.sampled_from(["Paris", "[X] was born in [Y] .", "P19", ""]),
                        lambda kids: st.lists(kids, max_size=2) | st.dictionaries(st.text(max_size=4), kids,
                                                                                  max_size=2), max_leaves=4)


def _refused_in_one_line_or_loaded(source: str) -> None:
    from core.errors import UserError
    from tasks.data.lama_data import load_lama

    try:
        ls = load_lama(source)
    except UserError as e:
        assert "\n" not in str(e).strip() and ("row" in str(e) or "does not exist" in str(e)), str(e)
        return
    for p in ls.probes:  # what loads is what a probe needs: text to prompt with and text to score
        assert isinstance(p.prompt, str) and all(isinstance(o, str) and o for o in p.objects), p


@given(sub=json_any, obj=json_any, relation=json_any, template=json_any,
       drop=st.sampled_from([None, "sub_label", "obj_label"]))
def test_lama_rows_with_fields_of_every_json_type(tmp_path, sub, obj, relation, template, drop):
    """A LAMA folder whose rows hold any JSON value in any field loads as text or is refused naming the file and
    the row (a number or list where a label belongs once ended in a TypeError)."""
    folder = tmp_path / "lama"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    row = {"sub_label": sub, "obj_label": obj}
    if drop:
        del row[drop]
    (folder / "P19.jsonl").write_text(json.dumps({"sub_label": "Ada", "obj_label": "London"}) + "\n"
                                      + json.dumps(row) + "\n")
    (tmp_path / "relations.jsonl").write_text(json.dumps({"relation": "P19", "template": "[X] was born in [Y] ."})
                                              + "\n" + json.dumps({"relation": relation, "template": template}) + "\n")
    _refused_in_one_line_or_loaded(f"lama:{folder}:{tmp_path / 'relations.jsonl'}")


@given(question=json_any, target=json_any)
def test_qa_wikidata_examples_with_fields_of_every_json_type(tmp_path, question, target):
    task = tmp_path / "task.json"
    task.write_text(json.dumps({"examples": [{"input": "The capital of France is", "target": "Paris"},
                                             {"input": question, "target": target}]}))
    _refused_in_one_line_or_loaded(f"qa_wikidata:{task}")
