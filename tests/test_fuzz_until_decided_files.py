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
