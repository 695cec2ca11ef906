"""Fuzz: generated result cells (never crash the report, never taken as done when edited into another meaning)
and data source rows with fields of every JSON type (load as text or one line)."""

import contextlib
import copy
import io
import json
import math
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzz_common import _paths, FIXTURES, json_value


# ---------------------------------------------------------------- result cells

@pytest.fixture(scope="module")
def valid_cell():
    return json.loads((FIXTURES / "results" / VALID_PLACE).read_text())


VALID_PLACE = "model-b/fasc/rank-0.5/lama-k1.json"


def edit_fields(data, cell: dict, paths: list, values) -> None:
    """One to three of `paths` into `cell` set to drawn `values`, in place."""
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(paths))
        parent = cell
        try:
            for step in path[:-1]:
                parent = parent[step]
            parent[path[-1]] = data.draw(values)
        except (KeyError, IndexError, TypeError):
            continue  # the path went away with an earlier change


@given(data=st.data())
def test_generated_cells_never_crash_the_report(tmp_path, valid_cell, data):
    from acbench.leaderboard.report import write_report

    cell = copy.deepcopy(valid_cell)
    edit_fields(data, cell, [p for p in _paths(valid_cell) if p], json_value)
    root = tmp_path / "results"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(FIXTURES / "results" / "model-b" / "dense", root / "model-b" / "dense")
    # at the place its (changed) identity names, so that the report reads it; where the identity names no place,
    # at the original one (the reader skips it, saying why)
    from acbench.core.record import cell_relpath

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
    from acbench.results.store import cell_status
    from acbench.core.record import metric_domain

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
    from acbench.core.errors import UserError
    from acbench.tasks.data.lama_data import load_lama

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


# ---------------------------------------------------------------- a timed cell's every field, of every type

TIMED_PLACE = "model-c/pca/rank-0.5/ppl-token-c1.json"
FAMILIES = FIXTURES / "results_families"
# the blocks the report reads numbers from, beyond the identity and metrics
READ_BLOCKS = ("records", "latency", "compression", "calibration", "memory", "stderr")
HOSTILE = st.one_of(json_value, st.sampled_from([float("nan"), float("inf"), -1.0, -3.0, 1e308, True, "false",
                                                 "12", [], {}, 0, 2.5]))


def _leaves(obj, prefix=()):
    for path in _paths(obj, prefix):
        if path:
            yield path


@settings(max_examples=30)  # a whole report, plots included, per example: 0.5 s each on 2 cores
@given(data=st.data())
def test_a_timed_cell_with_any_field_of_any_type_is_shown_valid_or_named(tmp_path_factory, data):
    """records, latency (body_overhead, conditions, speedup), compression, calibration: one to three fields of a
    timed ppl-token cell replaced by any value. The report never dies, and the cell is either valid by every check
    (and then shown) or skipped with one line naming its file: never a NaN verdict, a negative bandwidth, a text
    overhead or a perplexity its records contradict in the leaderboard."""
    from acbench.core.record import cell_problem
    from acbench.leaderboard.load import read_result_set
    from acbench.leaderboard.report import write_report

    root = tmp_path_factory.mktemp("timed") / "results"
    shutil.copytree(FAMILIES / "model-c" / "dense", root / "model-c" / "dense")
    cell = json.loads((FAMILIES / TIMED_PLACE).read_text())
    block = data.draw(st.sampled_from(READ_BLOCKS))
    paths = list(_leaves(cell[block], (block,))) if isinstance(cell.get(block), (dict, list)) else [(block,)]
    edit_fields(data, cell, paths, HOSTILE)
    (root / TIMED_PLACE).parent.mkdir(parents=True, exist_ok=True)
    (root / TIMED_PLACE).write_text(json.dumps(cell, allow_nan=True))
    with contextlib.redirect_stdout(io.StringIO()):
        md = write_report(str(root))
    text = md.read_text()
    rs = read_result_set(root)
    shown = any(c.cell.method == "pca" for c in rs.cells)
    assert shown == (cell_problem(json.loads(json.dumps(cell, allow_nan=True))) is None)
    if not shown:
        assert any(TIMED_PLACE in p for p in rs.problems), rs.problems
    rows = "\n".join(line for line in text.splitlines() if line.startswith(("|", "- what bounds")))
    assert "nan" not in rows.lower() and not re.search(r"-[0-9.]+ GB/s", rows) and "inf" not in rows.lower()


CALIBRATION_FIELDS = st.fixed_dictionaries({}, optional={
    "spec": st.fixed_dictionaries({"samples": st.just(12), "seq_len": st.just(256)}, optional={
        "mode": st.sampled_from(["one-pass", "sequential", "Sequential", "", None, 3, ["sequential"]])}),
    "authors": st.none() | HOSTILE | st.fixed_dictionaries({}, optional={
        "samples": HOSTILE | st.just(128), "seq_len": HOSTILE | st.just(2048),
        "mode": st.sampled_from(["one-pass", "sequential", "paper", None, 1])}),
    "short": HOSTILE | st.fixed_dictionaries({}, optional={
        "groups": HOSTILE | st.just(3), "of": st.just(7), "tokens": HOSTILE, "tokens_needed": HOSTILE | st.just(1536)}),
    "blocks": HOSTILE | st.just(30), "held_bytes": HOSTILE | st.just(1024), "seconds": HOSTILE | st.just(2.5),
    "peak": HOSTILE | st.fixed_dictionaries({}, optional={
        "kind": st.sampled_from(["rss_high_water", "cuda_max_allocated", None, 4]),
        "bytes": HOSTILE | st.just(3 << 30), "working_bytes": HOSTILE | st.just(1 << 30)})})


@settings(max_examples=30)  # a whole report per example
@given(calibration=CALIBRATION_FIELDS)
def test_a_cell_with_any_calibration_mode_authors_or_shortfall_is_shown_valid_or_named(tmp_path_factory,
                                                                                     calibration):
    """The calibration block's mode (spec and authors'), its authors' sizes and its shortfall record, of any type:
    the cell is shown (under its mode's row name, with its calibration column) exactly when every value is valid,
    else skipped in one line naming it."""
    from acbench.core.record import cell_problem
    from acbench.leaderboard.load import read_result_set
    from acbench.leaderboard.report import write_report

    root = tmp_path_factory.mktemp("calibrated") / "results"
    shutil.copytree(FAMILIES / "model-c" / "dense", root / "model-c" / "dense")
    cell = json.loads((FAMILIES / TIMED_PLACE).read_text())
    cell["calibration"] = {**cell["calibration"], **calibration,
                           "spec": {**cell["calibration"]["spec"], **calibration.get("spec", {})}}
    (root / TIMED_PLACE).parent.mkdir(parents=True, exist_ok=True)
    (root / TIMED_PLACE).write_text(json.dumps(cell, allow_nan=True))
    with contextlib.redirect_stdout(io.StringIO()):
        md = write_report(str(root))
    rs = read_result_set(root)
    shown = [c for c in rs.cells if c.cell.method == "pca"]
    valid = cell_problem(json.loads(json.dumps(cell, allow_nan=True))) is None
    assert bool(shown) == valid, (calibration, rs.problems)
    if not valid:
        assert any(TIMED_PLACE in p for p in rs.problems), rs.problems
        return
    text = md.read_text()
    sequential = cell["calibration"]["spec"].get("mode") == "sequential"
    assert ("| pca (sequential)" in text) == sequential
    assert "nan" not in "\n".join(line for line in text.splitlines() if line.startswith("|")).lower()


HAND_EDITS = [  # (a path into the timed cell, a value): each what the issue found believed
    (("records", 0, "nll"), float("nan")), (("records", 0, "nll"), float("inf")), (("records", 0, "nll"), True),
    (("records", 0, "nll"), -0.5), (("records", 0, "nll"), 9.0), (("metrics", "ppl"), 19.5),
    (("latency", "body_overhead"), "fast"), (("latency", "body_overhead"), [1, 2]),
    (("latency", "body_overhead", "floor_ms"), -3.0), (("latency", "conditions"), "quiet"),
    (("latency", "conditions", "memory_bandwidth", "copy_gb_s"), -3.0),
    (("latency", "speedup", "decode_body", "ratio"), -1.08), (("latency", "speedup", "decode_body", "ci95"), "wide"),
]


@pytest.mark.parametrize("path,value", HAND_EDITS, ids=[f"{'.'.join(map(str, p))}={v!r}" for p, v in HAND_EDITS])
def test_each_hand_edit_the_probe_found_skips_the_cell_with_one_line(tmp_path, path, value):
    from acbench.leaderboard.load import read_result_set
    from acbench.leaderboard.report import write_report

    root = tmp_path / "results"
    shutil.copytree(FAMILIES / "model-c" / "dense", root / "model-c" / "dense")
    cell = json.loads((FAMILIES / TIMED_PLACE).read_text())
    parent = cell
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = value
    (root / TIMED_PLACE).parent.mkdir(parents=True, exist_ok=True)
    (root / TIMED_PLACE).write_text(json.dumps(cell, allow_nan=True))
    rs = read_result_set(root)
    assert not any(c.cell.method == "pca" for c in rs.cells)
    assert [p for p in rs.problems if TIMED_PLACE in p], rs.problems
    with contextlib.redirect_stdout(io.StringIO()):
        assert write_report(str(root)).exists()


def _accuracy_cell(edit):
    cell = json.loads((FAMILIES / "model-c" / "pca" / "rank-0.5" / "lama-c1.json").read_text())
    edit(cell)
    return cell


@pytest.mark.parametrize("name,edit", [
    ("correct as text", lambda c: c["records"][0].update(correct="false")),
    ("correct 2", lambda c: c["records"][0].update(correct=2)),
    ("chance not 1/candidates", lambda c: c["records"][0].update(n_candidates=10, chance=0.9)),
    ("MMLU chance not 1/4", lambda c: (c["cell"].update(task="mmlu"), c["records"][0].update(chance=0.5))),
    ("chance 0", lambda c: c["records"][0].update(chance=0)),
    ("rank disagrees", lambda c: c["records"][0].update(rank=3, correct=1)),
    ("micro accuracy not the records'", lambda c: c["metrics"].update({"p@1_micro": 0.999})),
])
def test_accuracy_records_of_the_wrong_type_or_meaning_are_refused(name, edit):
    from acbench.core.record import cell_problem

    cell = json.loads((FAMILIES / "model-c" / "pca" / "rank-0.5" / "lama-c1.json").read_text())
    assert cell_problem(cell) is None
    assert cell_problem(_accuracy_cell(edit)) is not None, name


def test_a_cell_whose_model_is_not_the_one_its_fingerprint_names_is_refused():
    from acbench.core.record import cell_problem

    cell = json.loads((FAMILIES / TIMED_PLACE).read_text())
    cell["model_fingerprint"] = {**cell["model_fingerprint"], "alias": "smollm2-135m"}
    cell["cell"]["model"] = "smollm2-135m"
    assert cell_problem(cell) is None
    cell["cell"]["model"] = "smollm2-135m-0123abcd"  # a second folder of the same name: allowed
    assert cell_problem(cell) is None
    cell["cell"]["model"] = "gemma-3-270m"
    assert "not the model its fingerprint names" in cell_problem(cell)


# ---------------------------------------------------------------- the record and latency checks, word for word

RECORD_CASES = [  # (task, record, the problem or None)
    ("lama", {"correct": "x"}, "correct 'x' is not 0 or 1"), ("lama", {"correct": 2}, "correct 2 is not 0 or 1"),
    ("lama", {"correct": True}, None), ("lama", {"correct": 1.0}, None), ("lama", {"correct": 0}, None),
    ("ppl-token", {"nll": -0.5}, "nll -0.5 is not a finite number >= 0"), ("ppl-token", {"nll": 0}, None),
    ("ppl-token", {"nll": True}, "nll True is not a finite number >= 0"),
    ("ppl-token", {"nll": float("inf")}, "nll inf is not a finite number >= 0"),
    ("lama", {"rank": -1}, "rank -1 is not a count"), ("lama", {"rank": True}, "rank True is not a count"),
    ("lama", {"rank": 1.0}, "rank 1.0 is not a count"), ("lama", {"rank": 0}, None), ("lama", {"rank": None}, None),
    ("lama", {"rank": 0, "correct": 0}, "correct 0 disagrees with rank 0"),
    ("lama", {"rank": None, "correct": 1}, "correct 1 disagrees with rank None"),
    ("lama", {"rank": None, "correct": 0}, None), ("lama", {"rank": 3, "correct": 0}, None),
    ("lama", {"chance": 0}, "chance 0 is not a probability"), ("lama", {"chance": 1}, None),
    ("lama", {"chance": 1.5}, "chance 1.5 is not a probability"), ("lama", {"chance": True}, "chance True is not a "
                                                                                            "probability"),
    ("lama", {"chance": 0.1, "n_candidates": 10}, None),
    ("lama", {"chance": 0.2, "n_candidates": 10}, "chance 0.2 is not 1 / the 10 candidates it was guessed among"),
    ("lama", {"chance": 1.0, "n_candidates": 0}, "chance 1.0 is not 1 / the 0 candidates it was guessed among"),
    ("lama", {"chance": 1.0, "n_candidates": True}, "chance 1.0 is not 1 / the True candidates it was guessed among"),
    ("lama", {"chance": 1.0, "n_candidates": 1}, None),
    ("mmlu", {"chance": 0.25}, None), ("mmlu", {"chance": 0.3}, "chance 0.3 is not 1 / the 4 candidates it was "
                                                                "guessed among"),
    ("lama", {"chance": 0.3}, None),
    # MMLU's cloze form keeps both accuracies per item, and each choice's log-likelihood
    ("mmlu", {"correct_acc": 1, "correct_acc_norm": 0}, None), ("mmlu", {"correct_acc": 2}, "correct_acc 2 is not 0 or 1"),
    ("mmlu", {"correct_acc_norm": "1"}, "correct_acc_norm '1' is not 0 or 1"),
    ("mmlu", {"loglikelihoods": [-1.5, -2.0, 0.0, -9.0]}, None),
    ("mmlu", {"loglikelihoods": [-1.5, 0.5]}, "loglikelihoods [-1.5, 0.5] is not a list of finite numbers <= 0"),
    ("mmlu", {"loglikelihoods": []}, "loglikelihoods [] is not a list of finite numbers <= 0"),
    ("mmlu", {"loglikelihoods": "-1"}, "loglikelihoods '-1' is not a list of finite numbers <= 0"),
    ("mmlu", {"loglikelihoods": [float("nan")]}, "loglikelihoods [nan] is not a list of finite numbers <= 0"),
]


@pytest.mark.parametrize("task,record,problem", RECORD_CASES)
def test_each_record_field_is_checked_by_type_range_and_meaning(task, record, problem):
    from acbench.core.record import _record_problem, records_problem

    assert _record_problem(record, task) == problem
    rec = {"cell": {"task": task}, "metrics": {}, "records": [{}, record]}
    assert records_problem(rec) == (None if problem is None else f"records[1]: {problem}")


def test_the_metrics_agree_with_their_records_to_a_billionth():
    import math

    from acbench.core.record import records_problem

    def cell(nlls, **metrics):
        return {"cell": {"task": "ppl-token"}, "metrics": metrics, "records": [{"nll": v} for v in nlls]}

    mean = (1.0 + 2.0) / 2
    assert records_problem(cell([1.0, 2.0], nll=mean, ppl=math.exp(mean))) is None
    assert records_problem(cell([1.0, 2.0], nll=mean * (1 + 1e-12), ppl=math.exp(mean) * (1 - 1e-12))) is None
    assert records_problem(cell([1.0, 2.0], nll=1.6)) == "metric nll 1.6 is not the mean of its records' nll (1.5)"
    assert records_problem(cell([1.0, 2.0], ppl=4.0)) == \
        f"metric ppl 4.0 is not exp of its records' mean nll ({math.exp(1.5)!r})"
    assert records_problem(cell([700.0, 700.0], ppl=5.0)) is None  # an overflowing perplexity is not compared
    assert records_problem(cell([699.0, 699.0], ppl=5.0)).startswith("metric ppl 5.0 is not exp")
    partial = {"cell": {"task": "ppl-token"}, "metrics": {"nll": 9.0}, "records": [{"nll": 1.0}, {"window": 1}]}
    assert records_problem(partial) is None  # records without an nll each: nothing to compare

    def acc(correct, **metrics):
        return {"cell": {"task": "mmlu"}, "metrics": metrics, "records": [{"correct": c} for c in correct]}

    assert records_problem(acc([1, 0, 0, 1], acc=0.5, acc_macro=0.9)) is None  # the macro mean is per subject
    assert records_problem(acc([1, 0, 0, 0], acc=0.5)) == \
        "metric acc 0.5 is not the share of its records that are correct (0.25)"
    assert records_problem(acc([1, 0], **{"p@1_micro": 1.0})) == \
        "metric p@1_micro 1.0 is not the share of its records that are correct (0.5)"
    assert records_problem({"cell": {"task": "lama"}, "metrics": {"acc": 0.9},
                            "records": [{"correct": 1}, {"rank": 1}]}) is None


LATENCY_CASES = [
    ({"body_overhead": "x"}, "latency.body_overhead is not a mapping"),
    ({"conditions": [1]}, "latency.conditions is not a mapping"), ({"speedup": 5}, "latency.speedup is not a mapping"),
    ({"body_overhead": None, "conditions": None, "speedup": None}, None),
    ({"body_overhead": {"floor_ms": -1}}, "latency.body_overhead.floor_ms -1 is not a number >= 0"),
    ({"body_overhead": {"dense_body_ms": "9"}}, "latency.body_overhead.dense_body_ms '9' is not a number >= 0"),
    ({"body_overhead": {"floor_ms": 0, "linear_share": None, "rounds": 3, "note": -1}}, None),
    ({"speedup": {"decode": "x"}}, "latency.speedup.decode is not a mapping"),
    ({"speedup": {"decode": {"ratio": 0}}}, "latency.speedup.decode.ratio 0 is not a number > 0"),
    ({"speedup": {"decode": {"ratio": None, "ci95": None}}}, None),
    ({"speedup": {"decode": {"ratio": 1.1, "ci95": [1.0, 1.2]}}}, None),
    ({"speedup": {"decode": {"ratio": 1.1, "ci95": [0, 1.2]}}},
     "latency.speedup.decode.ci95 [0, 1.2] is not an interval of two numbers > 0"),
    ({"speedup": {"decode": {"ratio": 1.1, "ci95": [1.2]}}},
     "latency.speedup.decode.ci95 [1.2] is not an interval of two numbers > 0"),
    ({"speedup": {"decode": {"ratio": 1.1, "ci95": "wide"}}},
     "latency.speedup.decode.ci95 'wide' is not an interval of two numbers > 0"),
    ({"conditions": {"memory_bandwidth": "x"}}, "latency.conditions.memory_bandwidth is not a mapping"),
    ({"conditions": {"memory_bandwidth": {"copy_gb_s": 0}}},
     "latency.conditions.memory_bandwidth.copy_gb_s 0 is not a number > 0"),
    ({"conditions": {"memory_bandwidth": {"triad_gb_s": -2.0}}},
     "latency.conditions.memory_bandwidth.triad_gb_s -2.0 is not a number > 0"),
    ({"conditions": {"dense_product": {"gb_s": -1}}}, "latency.conditions.dense_product.gb_s -1 is not a number > 0"),
    ({"conditions": {"dense_product": None, "memory_bandwidth": {"copy_gb_s": None, "array_mb": -1}}}, None),
    ({"conditions": {"memory_bandwidth": {"copy_gb_s": 0.5}, "dense_product": {"gb_s": 0.5}}}, None),  # slow, valid
    ({"body_overhead": {"linear_share": -0.1}}, "latency.body_overhead.linear_share -0.1 is not a number >= 0"),
    ({"body_overhead": {"rounds": -1}}, "latency.body_overhead.rounds -1 is not a number >= 0"),
]


def test_close_is_a_billionth_of_the_larger_magnitude_or_of_one():
    from acbench.core.record import _close

    assert _close(0.0, 1e-9) and not _close(0.0, 1.5e-9)  # near 0: a billionth of one, the edge included
    assert _close(0.0, 5e-10)
    assert _close(1e9, 1e9 - 1) and _close(1e9 - 1, 1e9)  # a billionth of the larger, whichever side it is on
    assert _close(1e6, 1e6 * (1 + 1e-12)) and not _close(1e6, 1e6 * (1 + 1e-8))


@pytest.mark.parametrize("latency,problem", LATENCY_CASES)
def test_each_latency_field_is_checked_by_type_and_sign(latency, problem):
    from acbench.core.record import latency_problem

    assert latency_problem(latency) == problem


def test_the_fingerprints_name_is_the_cells_model_or_its_second_folder():
    from acbench.core.record import cell_problem

    cell = json.loads((FAMILIES / TIMED_PLACE).read_text())
    for fp, model, ok in [({"alias": "m"}, "m", True), ({"alias": "m"}, "m-0123abcd", True),
                          ({"alias": "m"}, "m-0123abc", False), ({"alias": "m"}, "m-0123abcde", False),
                          ({"alias": "m"}, "x-0123abcd", False), ({"source": "hub", "id": "o/m"}, "o/m", True),
                          ({"source": "hub", "id": "o/m"}, "o/x", False), ({"source": "local", "id": "o/m"}, "z", True)]:
        c = {**cell, "model_fingerprint": {**cell["model_fingerprint"], **fp}, "cell": {**cell["cell"], "model": model}}
        got = cell_problem(c)
        assert (got is None) == ok, (fp, model, got)
        if not ok:
            named = fp.get("alias") or fp.get("id")
            assert got == f"cell.model {model!r} is not the model its fingerprint names ({named!r})"


def test_an_older_cells_records_are_checked_as_the_leaderboard_reads_them():
    """A schema-2 LAMA cell stored ranks, not "correct": its records are upgraded before they are checked, so a
    micro P@1 its ranks contradict is refused, and one they agree with is not."""
    from acbench.core.record import cell_problem

    cell = json.loads((FAMILIES / "model-c" / "pca" / "rank-0.5" / "lama-c1.json").read_text())
    cell = {**cell, "schema_version": 2, "cell": {k: v for k, v in cell["cell"].items() if k != "kind"},
            "records": [{"relation": "r", "rank": 0, "n_candidates": 4}, {"relation": "r", "rank": 3,
                                                                           "n_candidates": 4}]}
    cell["metrics"] = {"p@1": 0.5, "p@1_micro": 0.5}
    assert cell_problem(cell) is None
    cell["metrics"] = {"p@1": 0.5, "p@1_micro": 1.0}
    assert cell_problem(cell) == "metric p@1_micro 1.0 is not the share of its records that are correct (0.5)"


ANY_VALUE = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=True, allow_infinity=True),
                      st.text(max_size=3), st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=4),
                      st.dictionaries(st.text(max_size=2), st.integers(), max_size=2))


@settings(max_examples=200)
@given(field=st.sampled_from(["correct", "correct_acc", "correct_acc_norm", "loglikelihoods"]), value=ANY_VALUE,
       primary=st.sampled_from(["acc", "acc_norm", "acc_macro", 3, None]))
def test_a_cloze_mmlu_record_with_any_value_is_valid_or_named(field, value, primary):
    """A cloze MMLU cell (both accuracies per item, the shown one as "correct") with one field of one record replaced
    by any value: valid exactly when every value is of its kind, "correct" is the shown accuracy's, and each
    accuracy is the share of its own field; otherwise one line naming the problem."""
    from acbench.core.record import records_problem

    shown = {"acc": "correct_acc", "acc_norm": "correct_acc_norm"}.get(primary, "correct_acc_norm")
    recs = [{"subject": "s", "gold": "A", "pred": "A", "correct_acc": 0, "correct_acc_norm": 1,
             "loglikelihoods": [-1.0, -2.0, -3.0, -4.0], "chance": 0.25},
            {"subject": "s", "gold": "B", "pred": "A", "correct_acc": 1, "correct_acc_norm": 0,
             "loglikelihoods": [-1.0, -0.5, -3.0, -4.0], "chance": 0.25}]
    for r in recs:
        r["correct"] = r[shown]
    cell = {"cell": {"task": "mmlu"}, "metrics": {"acc_norm": 0.5, "acc": 0.5, "acc_macro": 0.5},
            "primary_metric": primary, "records": recs}
    assert (records_problem(cell) is None) == (primary in ("acc", "acc_norm"))
    recs[0][field] = value
    problem = records_problem(cell)
    assert problem is None or (isinstance(problem, str) and "\n" not in problem)

    def one_or_zero(v):
        return isinstance(v, (bool, int, float)) and not isinstance(v, str) and v in (0, 1)

    lls = recs[0]["loglikelihoods"]
    ok = (primary in ("acc", "acc_norm")
          and isinstance(lls, list) and bool(lls) and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                          and -math.inf < v <= 0 for v in lls)
          and all(one_or_zero(r[k]) for r in recs for k in ("correct", "correct_acc", "correct_acc_norm"))
          and all(float(r["correct"]) == float(r[shown]) for r in recs)
          and all(sum(float(r[k]) for r in recs) / 2 == 0.5 for k in ("correct_acc", "correct_acc_norm")))
    assert (problem is None) == ok, problem


def test_cloze_records_name_their_accuracies_and_the_field_each_is_checked_against():
    """MMLU's cloze form keeps one correctness per accuracy: a primary metric that is neither is named with the two
    it could be, and an accuracy that disagrees with its own field names that field."""
    from acbench.core.record import records_problem

    recs = [{"correct_acc": 1, "correct_acc_norm": 0, "correct": 1}, {"correct_acc": 0, "correct_acc_norm": 0,
                                                                      "correct": 0}]
    cell = {"cell": {"task": "mmlu"}, "metrics": {"acc": 0.5, "acc_norm": 0.0}, "records": recs,
            "primary_metric": "p@1"}
    assert records_problem(cell) == "primary metric 'p@1' is not one of the accuracies its records keep (acc, acc_norm)"
    cell["primary_metric"] = "acc"
    assert records_problem(cell) is None
    cell["metrics"]["acc_norm"] = 0.5
    assert records_problem(cell) == \
        "metric acc_norm 0.5 is not the share of its records whose correct_acc_norm is 1 (0.0)"


# ---------------------------------------------------------------- numeric fields by range

def _set_path(cell: dict, path: tuple, value) -> None:
    """Set the field at `path` ("*" = the first entry, made if missing) to value, building the way there."""
    parent = cell
    for step, nxt in zip(path[:-1], path[1:]):
        if step == "*":
            step = 0 if isinstance(parent, list) else "decode"
        if isinstance(parent, list):
            if not parent:
                parent.append({} if nxt != "*" else [])
            parent = parent[step]
            continue
        if not isinstance(parent.get(step), (dict, list)):
            parent[step] = [] if nxt == "*" and step == "groups" else {}
        parent = parent[step]
    last = path[-1]
    if last == "*":
        last = next(iter(parent), "decode") if isinstance(parent, dict) else 0
    if isinstance(parent, list):
        parent[:1] = [value]
    else:
        parent[last] = value


# a value outside each range kind (a shape that is a number, a flag that is text, a count that is a fraction)
OUT_OF_RANGE = {"nonneg": [-5.0], "positive": [0, -1.0], "ratio": [0.0, -0.25, 5.0], "fraction": [0.0, 1.5],
                "share": [-0.1, 1.2], "count": [-1, 2.5], "size": [0, 1.5], "shape": [160, [], [0, 3]],
                "flag": ["yes", 1]}


def _range_cases():
    from acbench.core.record import FIELD_RANGES

    return [(path, kind, v) for path, kind in FIELD_RANGES for v in OUT_OF_RANGE[kind]]


@pytest.mark.parametrize("path,kind,value", _range_cases(),
                         ids=[f"{'.'.join(p)}={v!r}" for p, _, v in _range_cases()])
def test_every_numeric_field_read_outside_its_range_skips_the_cell_naming_it(path, kind, value):
    """Each field of FIELD_RANGES, set outside its range in a valid timed cell (a negative stderr printed as
    "+- -5.00", a negative ratio printed in bold as the best, 0 ms printed as a measured time, a number where a
    shape belongs): the cell is invalid, and the problem names the field."""
    from acbench.core.record import cell_problem

    cell = json.loads((FAMILIES / TIMED_PLACE).read_text())
    assert cell_problem(cell) is None
    _set_path(cell, path, value)
    problem = cell_problem(cell)
    assert problem is not None and path[0] in problem, (path, value, problem)


@settings(max_examples=150)
@given(data=st.data())
def test_a_numeric_field_with_any_number_is_valid_exactly_when_in_its_range(data):
    """Any number (or null) at any field of FIELD_RANGES: the cell is refused exactly when the value is outside the
    field's range, so a measurement is never refused and an edit never shown."""
    from acbench.core.record import FIELD_RANGES, RANGE_KINDS, cell_problem

    path, kind = data.draw(st.sampled_from(FIELD_RANGES))
    value = data.draw(st.one_of(st.none(), st.integers(-3, 10**9), st.floats(-1e6, 1e6), st.booleans(),
                                st.lists(st.integers(-2, 4096), max_size=3)))
    cell = json.loads((FAMILIES / TIMED_PLACE).read_text())
    _set_path(cell, path, value)
    ok = value is None or RANGE_KINDS[kind][1](value)
    assert (cell_problem(cell) is None) == ok, (path, value, cell_problem(cell))


def test_the_probes_four_range_edits_are_skipped_and_never_printed(tmp_path):
    """The cases found: stderr.ppl -5 ("49119.54 +- -5.00"), param_ratio -0.5 (bold as the best), dense_body_ms 0
    (a measured time), dense_product.shape 160 (a figure dropped in silence): each cell is named in the report's
    skipped files and none of its values is printed."""
    from acbench.core.log import console_lines
    from acbench.leaderboard.report import write_report

    for path, value in ((("stderr", "ppl"), -5.0), (("compression", "param_ratio"), -0.5),
                        (("latency", "body_overhead", "dense_body_ms"), 0),
                        (("latency", "conditions", "dense_product", "shape"), 160)):
        root = tmp_path / "-".join(path) / "results"
        shutil.copytree(FAMILIES / "model-c" / "dense", root / "model-c" / "dense")
        cell = json.loads((FAMILIES / TIMED_PLACE).read_text())
        _set_path(cell, path, value)
        (root / TIMED_PLACE).parent.mkdir(parents=True, exist_ok=True)
        (root / TIMED_PLACE).write_text(json.dumps(cell))
        with contextlib.redirect_stdout(io.StringIO()) as said, console_lines():  # as the CLI says them
            md = write_report(str(root))
        text = md.read_text()
        assert f"skipped: results/{TIMED_PLACE}: {'.'.join(path)} {value!r}" in said.getvalue(), said.getvalue()
        assert "+- -5" not in text and "-0.500" not in text and "0.00 ms/token" not in text
