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

from acbench.core.errors import UserError
from fuzz_common import json_value

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


class _Windows:
    """40 windows of known NLL, 4 looks of 10; counts what it scores."""

    name, primary_metric, higher_is_better = "fake", "ppl", {"ppl": False}

    def __init__(self):
        from acbench.tasks.base import UntilDecided

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
        from acbench.tasks.base import TaskResult

        return TaskResult(metrics={"ppl": len(records)}, stderr={}, details={}, records=records, config={})


REFERENCE = [{"window": i, "nll": 3.0 + 0.01 * (i % 5)} for i in range(40)]
VALID = _Windows().score_items(None, None, [(i, None) for i in range(20)])


def _valid_body(records=VALID) -> dict:
    from acbench.core.record import records_digest

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
    from acbench.runner.until_decided import evaluate_until_decided

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
    from acbench.core.record import until_decided_digest

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
    from acbench.runner.until_decided import reference_records

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
    from acbench.runner.until_decided import reference_records
    from acbench.core.record import until_decided_digest

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
        assert str(e) == f"{path}: the reference's cell does not read (JSONDecodeError): remove it to compute it again"
    edited = json.loads(json.dumps(cell))
    edited["records"][3]["nll"] = 2.0
    mean = sum(r["nll"] for r in edited["records"]) / 40
    edited["metrics"] = {"nll": mean, "ppl": math.exp(mean)}  # consistent with its records, not with its digest
    path.write_text(json.dumps(edited))
    try:
        reference_records(path)
        raise AssertionError("an edited reference was taken")
    except UserError as e:
        assert str(e) == (f"{path}: the reference's cell is not valid (its records or its until-decided decision do "
                          "not match the digest written with them (edited since the run): rerun it): remove it to "
                          "compute it again")
    edited["details"]["until_decided"]["digest"] = until_decided_digest(edited["records"],
                                                                        edited["details"]["until_decided"])
    path.write_text(json.dumps(edited))
    assert reference_records(path) == edited["records"]  # re-sealed: read, and the leaderboard checks the pair


def test_decide_scores_and_paths_by_hand():
    import numpy as np

    from acbench.runner.until_decided import block_size, decide, partial_path, scores_of
    from acbench.core.confidence_sequences import accuracy_cs

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
    from acbench.runner.until_decided import check_partials, partial_problem, write_partial
    from acbench.core.record import records_digest

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
        assert str(e) == (f"{keep} (the blocks an interrupted until-decided run kept): does not read as JSON "
                          "(JSONDecodeError); remove the file to evaluate this cell from its first block")
    write_partial(keep, task, VALID[:10])
    assert partial_problem(keep, task, pool, 10) is None  # one whole block
    assert "not whole blocks" in partial_problem(keep, task, pool, 20)
    write_partial(keep, task, VALID + VALID + VALID)
    assert "not whole blocks" in partial_problem(keep, task, pool, 10)  # 60 records of a 40-item pool


class _Scripted:
    """A task whose items, scores and kind are given; it checks it is called with the run's model, tokenizer and
    progress, and can stop (as Ctrl-C would) before a given call."""

    name, primary_metric = "fake", "ppl"

    def __init__(self, scores, kind="nll", margin=0.02, looks=4, stop_at=None):
        from acbench.tasks.base import UntilDecided

        self.until_decided = UntilDecided("pca", looks=looks, margin=margin)
        self.scores, self.kind, self.stop_at, self.calls = scores, kind, stop_at, 0
        self.higher_is_better = {"ppl": False} if kind == "nll" else {"ppl": True}

    def item_pool(self, tokenizer):
        assert tokenizer is TOKENIZER
        return [(i, None) for i in range(len(self.scores))]

    def score_items(self, model, tokenizer, items, progress=True):
        assert model is MODEL and tokenizer is TOKENIZER and progress is PROGRESS
        self.calls += 1
        if self.stop_at == self.calls:
            raise KeyboardInterrupt
        if self.kind == "none":
            return [{"window": i} for i, _ in items]
        key = "nll" if self.kind == "nll" else "correct"
        return [{"window": i, key: self.scores[i]} for i, _ in items]

    def item_identity(self, item):
        return {"window": item[0]}

    def result_of(self, records):
        from acbench.tasks.base import TaskResult

        return TaskResult(metrics={"ppl": len(records)}, stderr={}, details={}, records=records, config={})


MODEL, TOKENIZER, PROGRESS = object(), object(), "shown"


def _evaluate(task, reference, keep=None):
    from acbench.runner.until_decided import evaluate_until_decided

    return evaluate_until_decided(task, MODEL, TOKENIZER, reference, progress=PROGRESS, keep=keep)


def test_the_run_stops_where_its_sequence_decides_and_keeps_its_blocks(tmp_path):
    from acbench.core.record import records_digest

    wave = [0.005 * math.sin(i) for i in range(400)]  # within 0.02 nats of the reference: equivalent
    ref = [{"window": i, "nll": 3.0} for i in range(400)]
    result = _evaluate(_Scripted([3.0 + w for w in wave], looks=4), ref)
    ud = result.details["until_decided"]
    assert ud["decision"] == "equivalent" and ud["items"] == 100 and ud["stopped"] == "decided"
    assert _evaluate(_Scripted([3.0 + w for w in wave], margin=None, looks=4), ref).details["until_decided"][
        "decision"] is None  # without a margin nothing is equivalent
    # accuracy: a variant right where the reference was wrong on every item decides 'better' on the bounded sequence
    acc_ref = [{"window": i, "correct": 0} for i in range(200)]
    acc = _evaluate(_Scripted([1] * 200, kind="accuracy", looks=4), acc_ref).details["until_decided"]
    assert acc["decision"] == "better" and acc["items"] == 50
    # a reference of another kind, or a variant whose records hold no score, cannot stop early
    for task, reference in ((_Scripted([3.0] * 40), acc_ref[:40]), (_Scripted([3.0] * 40, kind="none"), ref[:40])):
        ud = _evaluate(task, reference).details["until_decided"]
        assert (ud["decision"], ud["items"], ud["stopped"]) == (None, 40, "budget (no stored reference on the same "
                                                                          "items)")
    # interrupted before its third block: the two blocks scored are kept as written, with their digest
    keep = tmp_path / "cell.json.partial"
    scores = [3.0 + 0.01 * (i % 7) for i in range(40)]
    try:
        _evaluate(_Scripted(scores, stop_at=3), False, keep)
        raise AssertionError("the interruption was not raised")
    except KeyboardInterrupt:
        pass
    first = [{"window": i, "nll": scores[i]} for i in range(20)]
    assert json.loads(keep.read_text()) == {"cell": "cell.json", "task": "fake", "digest": records_digest(first),
                                            "records": first}
    again = _Scripted(scores)
    whole = _evaluate(again, False, keep)
    assert again.calls == 2 and not keep.exists() and len(whole.records) == 40
    # an empty pool: nothing scored, nothing kept, nothing to remove
    assert _evaluate(_Scripted([]), False, keep).details["until_decided"]["items"] == 0


def test_every_refusal_of_a_kept_file_by_its_words(tmp_path):
    """partial_problem's lines, each exactly, and resumed's refusal of a file whose records are not this pool's first
    items (checked at resume even when no planning check ran)."""
    from acbench.runner.until_decided import partial_problem, resumed

    keep = tmp_path / "cell.json.partial"
    task = _Windows()
    pool = task.item_pool(None)

    def problem(body):
        keep.write_text(json.dumps(body))
        return partial_problem(keep, task, pool, 10)

    keep.mkdir()
    assert partial_problem(keep, task, pool, 10) == "not a file"
    keep.rmdir()
    assert problem([1]) == "holds no list of records"
    assert problem({**_valid_body(), "cell": "x.json"}) == "was written for cell 'x.json', not cell.json"
    assert problem({**_valid_body(), "digest": "0"}) == ("its records do not match the digest written with them "
                                                          "(edited or damaged since)")
    assert problem(_valid_body([1, 2])) == "records[0] is not a mapping"
    assert problem(_valid_body([{"window": 0, "nll": -1.0}])) == "records[0] nll -1.0 is not a finite number >= 0"
    chance = [{"id": 0, "correct": 1, "chance": 0.5}]  # MMLU's records guess among 4 unless they say otherwise
    assert problem({**_valid_body(chance), "task": "mmlu"}) == ("records[0] chance 0.5 is not 1 / the 4 candidates "
                                                                 "it was guessed among")
    assert problem(_valid_body([{"window": 0}])) == "its records hold no score (correct or nll) in every record"
    shifted = [dict(r, window=r["window"] + 1) for r in VALID]
    assert problem(_valid_body(shifted)) == ("its records are not this evaluation's first items (another task "
                                             "setting or item order)")
    keep.write_text(json.dumps(_valid_body(shifted)))
    try:
        resumed(keep, task, pool, 10)
        raise AssertionError("records of other windows were resumed")
    except UserError as e:
        assert str(e) == (f"{keep} (the blocks an interrupted until-decided run kept): its records are not this "
                          "evaluation's first items (another task setting or item order); remove the file to "
                          "evaluate this cell from its first block")
    keep.write_text(json.dumps(_valid_body()))
    assert resumed(keep, task, pool, 10) == VALID and resumed(None, task, pool, 10) == []
    assert resumed(tmp_path / "absent.partial", task, pool, 10) == []


def test_decide_on_real_valued_differences_reads_the_last_bounds():
    """At the first count where the sequence decides, the look before it did not: the decision and the bounds are
    the last item's (a decision read one item late, or bounds one item old, differ there)."""
    import numpy as np

    from acbench.runner.until_decided import decide
    from acbench.core.confidence_sequences import mean_cs

    ref = [3.0] * 100
    for shift, word in ((0.2, "worse"), (-0.2, "better")):
        mine = [3.0 + shift + 0.05 * math.sin(i) for i in range(100)]
        n = next(k for k in range(2, 101) if decide("nll", ref, mine[:k], 100, 0.02, False)[0])
        decision, lo, hi = decide("nll", ref, mine[:n], 100, 0.02, False)
        want_lo, want_hi = mean_cs(np.asarray(mine[:n]) - 3.0, 100)
        assert decision == word and (lo, hi) == (float(want_lo[-1]), float(want_hi[-1]))
        assert (want_lo[-2] <= 0 < want_lo[-1]) if word == "worse" else (want_hi[-2] >= 0 > want_hi[-1])
        assert lo != want_lo[-2] or hi != want_hi[-2]


def test_the_planning_check_reads_every_cells_file_with_the_pools_identities(tmp_path):
    """check_partials goes on past a cell it skips, asks the task's pool with the run's tokenizer, and checks the
    records against that pool; evaluate_until_decided checks them again at resume."""
    from acbench.runner.until_decided import check_partials, write_partial

    task = _Scripted([3.0 + 0.01 * (i % 7) for i in range(40)])
    shifted = [{"window": i + 1, "nll": 3.0} for i in range(10)]
    bad = tmp_path / "bad.json"
    write_partial(bad.with_name("bad.json.partial"), task, shifted)  # sealed as written, of other windows
    skipped = tmp_path / "skipped.json"
    try:
        check_partials([_Cell(skipped), _Cell(bad)], {"fake": task}, TOKENIZER)
        raise AssertionError("a kept file of other windows passed the planning check")
    except UserError as e:
        assert str(e).startswith(f"{bad}.partial (the blocks an interrupted until-decided run kept): its records "
                                 "are not this evaluation's first items")
    try:
        _evaluate(task, False, bad.with_name("bad.json.partial"))
        raise AssertionError("a kept file of other windows was resumed")
    except UserError as e:
        assert "not this evaluation's first items" in str(e) and task.calls == 0


def test_the_digests_are_of_the_canonical_text_written_here():
    """records_digest: sha256 of the records (and what they decided) as compact JSON with sorted keys, NaN as null and
    tuples as lists, its first 16 hex digits; until_decided_digest seals exactly SEALED_UNTIL_DECIDED's fields."""
    import hashlib

    from acbench.core.record import SEALED_UNTIL_DECIDED, records_digest, until_decided_digest, until_decided_problem

    def sha(text: str) -> str:
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    records = [{"window": 1, "nll": 2.5}, {"window": 2, "nll": float("nan")}]
    assert records_digest(records) == sha('{"records":[{"nll":2.5,"window":1},{"nll":null,"window":2}]}') == \
        "948877fc01cb4d4e"
    assert records_digest([{"id": 3, "correct": True}], {"b": (1, 2), "a": None}) == \
        sha('{"a":null,"b":[1,2],"records":[{"correct":true,"id":3}]}')
    assert records_digest([{"file": Path("a/b")}]) == sha('{"records":[{"file":"a/b"}]}')  # a value JSON lacks: text
    spec = {"reference": "pca", "looks": 20, "margin": 0.02, "budget": 40, "block": 2, "items": 1,
            "decision": "worse", "stopped": "decided", "reference_digest": "ab", "interval": [0.1, 0.2]}
    one = [{"window": 1, "nll": 2.5}]
    assert until_decided_digest(one, spec) == records_digest(one, {k: spec[k] for k in SEALED_UNTIL_DECIDED})
    assert until_decided_digest(one, spec) == until_decided_digest(one, {**spec, "interval": None})  # not sealed
    assert until_decided_digest(one, spec) != until_decided_digest(one, {**spec, "decision": "better"})
    assert until_decided_problem({"details": "x"}) is None and until_decided_problem({}) is None
    assert until_decided_problem({"details": {"until_decided": 3}}) == "details.until_decided is not a mapping"
    assert until_decided_problem({"details": {"until_decided": {}}, "records": []}) == (
        "details.until_decided has no digest of its records (written before digests, or edited): rerun it")


# ---------------------------------------------------------------- the level a family's run records

@SETTINGS
@given(alpha=st.one_of(json_value, st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(
    [0.05, 0.002, 0.5, 0.5000001, 0, -0.01, 1, True, "0.01", None])), sealed=st.booleans())
def test_a_stored_level_is_read_only_as_a_level_the_run_wrote(tmp_path_factory, alpha, sealed):
    """details.until_decided.alpha set to anything, sealed into the digest or not: the reference is read (and a
    comparison made at that level) only for a level in (0, 0.5] sealed with its records; else one line naming the
    file, and no comparison is read from the cell."""
    from acbench.core.record import CellRecord, until_decided_digest
    from acbench.core.significance import sequential_compare
    from acbench.runner.until_decided import reference_records

    path, cell = _reference_cell(tmp_path_factory.mktemp("level"))
    spec = cell["details"]["until_decided"]
    spec["alpha"] = alpha
    if sealed:
        spec["digest"] = until_decided_digest(cell["records"], spec)
    path.write_text(json.dumps(cell))
    valid = sealed and isinstance(alpha, (int, float)) and not isinstance(alpha, bool) and 0 < alpha <= 0.5
    try:
        got = reference_records(path)
    except UserError as e:
        assert not valid and str(path) in str(e) and "\n" not in str(e)
        try:
            CellRecord.from_json(cell)
            raise AssertionError("a cell refused as a reference was read as a cell")
        except ValueError:
            return
    assert valid and got == REFERENCE
    other = json.loads(json.dumps(cell))
    other["cell"]["method"] = "svd"
    shown = sequential_compare(CellRecord.from_json(cell), CellRecord.from_json(other))
    assert shown["alpha"] == alpha and shown["diff"] == 0
