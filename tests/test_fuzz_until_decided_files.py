"""Fuzz targets of until-decided's own files, read like every other file: a `.partial` (the blocks an interrupted
variant left) and a stored reference cell, each as arbitrary JSON or as a valid file with one field edited. The
property: the run resumes or reads only what is exactly what it wrote (a valid digest over records that check);
anything else is one UserError line naming the file, before any item is scored, and never a number taken in."""

from __future__ import annotations

import json
import math
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.errors import UserError
from fuzz_common import json_value

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


class _Windows:
    """40 windows of known NLL, 4 looks of 10; counts what it scores."""

    name, primary_metric, higher_is_better = "fake", "ppl", {"ppl": False}

    def __init__(self):
        from tasks.base import UntilDecided

        self.until_decided = UntilDecided("pca", looks=4, margin=0.02)
        self.scored = []

    def item_pool(self, tokenizer):
        return [(i, None) for i in range(40)]

    def score_items(self, model, tokenizer, items, progress=True):
        self.scored += [i for i, _ in items]
        return [{"window": i, "nll": 3.5 + 0.01 * (i % 7)} for i, _ in items]

    def item_identity(self, item):
        return {"window": item[0]}

    def result_of(self, records):
        from tasks.base import TaskResult

        return TaskResult(metrics={"ppl": len(records)}, stderr={}, details={}, records=records, config={})


REFERENCE = [{"window": i, "nll": 3.0 + 0.01 * (i % 5)} for i in range(40)]
VALID = _Windows().score_items(None, None, [(i, None) for i in range(20)])


def _valid_body(records=VALID) -> dict:
    from core.record import records_digest

    return {"cell": "cell.json", "task": "fake", "digest": records_digest(records), "records": records}


edits = st.one_of(
    st.tuples(st.sampled_from(["cell", "task", "digest", "records"]), json_value),
    st.tuples(st.just("record"), st.tuples(st.integers(0, 19), st.sampled_from(["nll", "window", "extra"]),
                                           json_value)))


def _edited(edit) -> dict:
    body = json.loads(json.dumps(_valid_body()))
    field, value = edit
    if field == "record":
        i, key, v = value
        body["records"][i][key] = v
    else:
        body[field] = value
    return body


@SETTINGS
@given(content=st.one_of(json_value.map(lambda v: json.dumps(v)), edits.map(lambda e: json.dumps(_edited(e))),
                         st.text(max_size=30)))
def test_a_kept_file_resumes_only_as_written(tmp_path_factory, content):
    from bench.runner.until_decided import evaluate_until_decided

    keep = tmp_path_factory.mktemp("keep") / "cell.json.partial"
    keep.write_text(content)
    task = _Windows()
    try:
        result = evaluate_until_decided(task, None, None, REFERENCE, progress=False, keep=keep)
    except UserError as e:
        assert str(keep) in str(e) and "\n" not in str(e) and task.scored == [] and keep.exists()
        return
    # resumed: the file was exactly a valid prefix of whole blocks, and every record is what scoring gives
    fresh = evaluate_until_decided(_Windows(), None, None, REFERENCE, progress=False)
    assert result.records == fresh.records and result.details == fresh.details
    kept = json.loads(content)
    assert kept["records"] == fresh.records[:len(kept["records"])] and task.scored == \
        list(range(len(kept["records"]), len(fresh.records)))


def _reference_cell(tmp: Path) -> tuple[Path, dict]:
    from core.record import until_decided_digest

    spec = {"reference": "pca", "looks": 4, "margin": 0.02, "budget": 40, "block": 10, "items": 40,
            "decision": None, "interval": None, "stopped": "whole budget (dense or the reference)"}
    records = [dict(r) for r in REFERENCE]  # the test edits its own copy
    spec["digest"] = until_decided_digest(records, spec)
    mean = sum(r["nll"] for r in REFERENCE) / len(REFERENCE)
    cell = {"schema_version": 4, "cell": {"model": "m", "method": "pca", "rank": 0.5, "budget": "rank",
                                          "task": "ppl-token", "key": "k"},
            "metrics": {"nll": mean, "ppl": math.exp(mean)}, "stderr": {}, "primary_metric": "ppl",
            "higher_is_better": {"ppl": False}, "records": records, "env": {"python": "3"},
            "model_fingerprint": {"id": "m"}, "compression": {"param_ratio": 0.5},
            "details": {"until_decided": spec}}
    path = tmp / "pca" / "ppl-token-k.json"
    path.parent.mkdir(parents=True)
    return path, cell


cell_edits = st.one_of(
    st.tuples(st.sampled_from(["metrics", "records", "details", "cell"]), json_value),
    st.tuples(st.just("nll"), st.tuples(st.integers(0, 39), st.floats(allow_nan=True, allow_infinity=True))),
    st.tuples(st.just("decision"), st.sampled_from(["better", "worse", "equivalent", None, 3])))


@SETTINGS
@given(edit=st.one_of(st.none(), cell_edits), whole=st.one_of(st.none(), json_value))
def test_a_reference_cell_is_read_only_as_written(tmp_path_factory, edit, whole):
    """A stored reference edited in any field (an NLL changed, its decision, its records replaced), or replaced by
    any JSON: its records are read only when the file is as the run wrote it; else one line naming it, or None
    where it is not an until-decided cell (then nothing stops early against it)."""
    from bench.runner.until_decided import reference_records

    path, cell = _reference_cell(tmp_path_factory.mktemp("ref"))
    if whole is not None:
        cell = whole
    elif edit is not None:
        field, value = edit
        if field == "nll":
            i, v = value
            cell["records"][i] = dict(cell["records"][i], nll=v)
        elif field == "decision":
            cell["details"]["until_decided"]["decision"] = value
        else:
            cell[field] = value
    path.write_text(json.dumps(cell))
    try:
        got = reference_records(path)
    except UserError as e:
        assert str(path) in str(e) and "\n" not in str(e)
        return
    assert got is None or got == REFERENCE  # only the records the run wrote are ever used


# ---------------------------------------------------------------- the same files, by hand

def test_the_reference_is_read_as_written_or_refused(tmp_path):
    from bench.runner.until_decided import reference_records
    from core.record import until_decided_digest

    path, cell = _reference_cell(tmp_path)
    assert reference_records(path.with_name("absent.json")) is None
    path.write_text(json.dumps(cell))
    assert reference_records(path) == REFERENCE
    for details in ({}, {"until_decided": "x"}, "text", None):  # not evaluated until decided: nothing stops on it
        path.write_text(json.dumps({**cell, "details": details}))
        assert reference_records(path) is None
    path.write_text("{broken")
    try:
        reference_records(path)
        raise AssertionError("a file that does not read was taken")
    except UserError as e:
        assert str(e).startswith(f"{path}: the reference's cell does not read (JSONDecodeError): remove it")
    edited = json.loads(json.dumps(cell))
    edited["records"][3]["nll"] = 2.0
    mean = sum(r["nll"] for r in edited["records"]) / 40
    edited["metrics"] = {"nll": mean, "ppl": math.exp(mean)}  # consistent with its records, not with its digest
    path.write_text(json.dumps(edited))
    try:
        reference_records(path)
        raise AssertionError("an edited reference was taken")
    except UserError as e:
        assert str(e).startswith(f"{path}: the reference's cell is not valid (its records or its until-decided "
                                 "decision do not match the digest")
    edited["details"]["until_decided"]["digest"] = until_decided_digest(edited["records"],
                                                                        edited["details"]["until_decided"])
    path.write_text(json.dumps(edited))
    assert reference_records(path) == edited["records"]  # re-sealed: read, and the leaderboard checks the pair


def test_decide_scores_and_paths_by_hand():
    import numpy as np

    from bench.runner.until_decided import block_size, decide, partial_path, scores_of
    from core.confidence_sequences import accuracy_cs

    assert scores_of([{"id": 1, "correct": True}, {"id": 2, "correct": 0}]) == ("accuracy", [1.0, 0.0],
                                                                                [("1",), ("2",)])
    assert scores_of([{"window": 4, "nll": 2.5}]) == ("nll", [2.5], [("4",)])
    assert scores_of([{"x": 1}]) is None and scores_of([]) is None
    # the variant wrong on 30 items the reference got right: d = mine - ref = -1 each, on the variant's items only
    ref, mine = [1.0] * 50, [0.0] * 30
    decision, lo, hi = decide("accuracy", ref, mine, 50, 0.02, True)
    want_lo, want_hi = accuracy_cs(-np.ones(30))
    assert decision == "worse" and (lo, hi) == (float(want_lo[-1]), float(want_hi[-1])) and hi < 0
    assert decide("accuracy", [0.0] * 50, [1.0] * 30, 50, 0.02, True)[0] == "better"
    assert decide("accuracy", ref, mine, 50, 0.02, False)[0] == "better"  # the metric's direction says which
    assert partial_path(Path("r/m/ppl-token-1.json")) == Path("r/m/ppl-token-1.json.partial")
    task = _Windows()
    assert block_size(task, list(range(40))) == 10 and block_size(task, list(range(41))) == 11
    assert block_size(task, [1]) == 1 and block_size(task, []) == 1


class _Cell:
    def __init__(self, path: Path, task: str = "fake", analysis: bool = False):
        from types import SimpleNamespace

        self.path, self.id = path, SimpleNamespace(task=task, is_analysis=analysis)


def test_a_kept_file_as_written_passes_the_planning_check_and_an_edit_does_not(tmp_path):
    from bench.runner.until_decided import check_partials, partial_problem, write_partial
    from core.record import records_digest

    cell = tmp_path / "cell.json"
    keep = cell.with_name("cell.json.partial")
    task = _Windows()
    write_partial(keep, task, VALID)
    assert json.loads(keep.read_text()) == {"cell": "cell.json", "task": "fake", "digest": records_digest(VALID),
                                            "records": VALID}
    pool = task.item_pool(None)
    assert partial_problem(keep, task, pool, 10) is None
    check_partials([_Cell(cell)], {"fake": task}, None)  # as written: nothing said
    other = tmp_path / "other.json"
    check_partials([_Cell(other)], {"fake": task}, None)  # no file beside that cell: nothing to check
    plain = _Windows()
    plain.until_decided = None
    keep.write_text("{broken")
    check_partials([_Cell(cell)], {"fake": plain}, None)  # a task evaluated whole keeps no blocks: not read
    check_partials([_Cell(cell, task="rho")], {"fake": task}, None)  # a task the run does not have: not read
    try:
        check_partials([_Cell(cell)], {"fake": task}, None)
        raise AssertionError("a broken kept file passed the planning check")
    except UserError as e:
        assert str(e) == (f"{keep}: the blocks an interrupted until-decided run left does not read as JSON "
                          "(JSONDecodeError): remove the file to evaluate this cell from its first block")
    write_partial(keep, task, VALID[:10])
    assert partial_problem(keep, task, pool, 10) is None  # one whole block
    assert "not whole blocks" in partial_problem(keep, task, pool, 20)
    write_partial(keep, task, VALID + VALID + VALID)
    assert "not whole blocks" in partial_problem(keep, task, pool, 10)  # 60 records of a 40-item pool
