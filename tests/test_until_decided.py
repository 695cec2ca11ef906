"""bench run --until-decided end to end on the tiny model: the reference and dense on the whole budget, every other
variant stopped when its confidence sequence decided (its stored records give the same decision again), the cells
keyed apart from fixed-size ones, the leaderboard's CS columns; the tasks' item pools (stratified prefixes, the same
metrics as evaluate() on the same items); refusals in one line."""

import contextlib
import io
import json
from collections import Counter
from pathlib import Path

import pytest

from acbench.cli import main


def _run(argv) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue() + err.getvalue()


def _cells(root: Path) -> dict:
    out = {}
    for p in root.rglob("*.json"):
        if any(part.startswith(".") for part in p.relative_to(root).parts) or p.name.startswith("LEADERBOARD"):
            continue
        rec = json.loads(p.read_text())
        out[(rec["cell"]["method"], rec["cell"]["task"])] = rec
    return out


ARGS = ["--methods", "pca", "svd", "random", "--rank", "0.5", "--tasks", "lama", "ppl-token", "--calib-samples", "2",
        "--calib-seq-len", "32", "--no-latency", "--quiet", "--ppl-seq-len", "32", "--lama-limit", "12",
        "--ppl-windows", "200"]


@pytest.fixture(scope="module")
def decided(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("until") / "results"
    rc, text = _run(["run", "--model", str(tiny), *ARGS, "--until-decided", "--output", str(out)])
    assert rc == 0, text[-800:]
    return out, text


def test_the_reference_and_dense_take_the_budget_and_the_others_stop_when_decided(decided):
    from acbench.runner.until_decided import decide, scores_of

    out, text = decided
    cells = _cells(out)
    for task, budget in (("lama", 12 * 7), ("ppl-token", 200)):
        for whole in ("dense", "pca"):
            seq = cells[(whole, task)]["details"]["until_decided"]
            assert seq["items"] == seq["budget"] == budget and seq["stopped"].startswith("whole budget")
        ref = scores_of(cells[("pca", task)]["records"])
        for m in ("svd", "random"):
            rec = cells[(m, task)]
            seq = rec["details"]["until_decided"]
            assert seq["reference"] == "pca" and seq["block"] == -(-budget // 20) and len(rec["records"]) == seq["items"]
            mine = scores_of(rec["records"])
            assert mine[2] == ref[2][:len(mine[2])]  # a prefix of the reference's items, in the same order
            again = decide(ref[0], ref[1], mine[1], budget, seq["margin"], task == "lama")
            assert again[0] == seq["decision"] and list(again[1:]) == pytest.approx(seq["interval"])
            if seq["decision"]:
                assert seq["stopped"] == "decided" and seq["items"] <= budget
                # one block fewer would not have decided: it stopped at the first look that did
                if seq["items"] > seq["block"]:
                    before = decide(ref[0], ref[1], mine[1][:seq["items"] - seq["block"]], budget, seq["margin"],
                                    task == "lama")
                    assert before[0] is None
            else:
                assert seq["items"] == budget and seq["stopped"] == "budget"
            assert f"[{m} @ 0.5] {task} vs pca: " in text.replace("  ", "")
    board = (out / "LEADERBOARD.md").read_text()
    assert " CS n=" in board and "confidence sequence" in board


def test_the_cells_are_keyed_apart_from_fixed_size_ones(tiny, decided, tmp_path):
    out, _ = decided
    rc, text = _run(["run", "--model", str(tiny), *ARGS, "--output", str(out), "--no-report"])
    assert rc == 0 and "8 cell(s) to compute" in text  # the fixed-size cells are other cells
    rc, text = _run(["run", "--model", str(tiny), *ARGS, "--until-decided", "--output", str(out), "--no-report"])
    assert rc == 0 and "0 cell(s) to compute" in text  # and a rerun of the sequential one computes nothing


def test_a_run_without_its_reference_is_refused_in_one_line(tiny, tmp_path):
    rc, text = _run(["run", "--model", str(tiny), "--methods", "svd", "--rank", "0.5", "--until-decided",
                     "--output", str(tmp_path / "r")])
    assert rc == 2 and "--until-decided tests every method against --reference 'pca'" in text
    rc, text = _run(["run", "--model", str(tiny), "--methods", "svd", "--rank", "0.5", "--until-decided",
                     "--reference", "svd", "--output", str(tmp_path / "r"), "--tasks", "ppl-token", "--ppl-windows",
                     "3", "--ppl-seq-len", "16", "--no-latency", "--quiet", "--calib-samples", "1"])
    assert rc == 0, text[-500:]


def test_the_pools_are_stratified_and_score_as_evaluate_does(tiny):
    from acbench import tasks
    from acbench.model.sources import open_and_load_model

    lm = open_and_load_model(str(tiny), progress=False)
    lama = tasks.get_task("lama").from_options({"per_relation": 6})
    pool = lama.item_pool(lm.tokenizer)
    assert len(pool) == 42
    for k in (7, 14, 21):  # every prefix of k * 7 probes holds k of each relation
        assert set(Counter(p.relation for p in pool[:k]).values()) == {k // 7}
    fixed = lama.evaluate(lm.model, lm.tokenizer, progress=False)
    seq = lama.result_of(lama.score_items(lm.model, lm.tokenizer, pool, progress=False))
    assert seq.metrics == pytest.approx(fixed.metrics)
    for fmt in ("cloze", "letter"):  # one question per subject: 57, every prefix of k * 57 k per subject
        mmlu = tasks.get_task("mmlu").from_options({"limit": 2, "format": fmt})
        pool = mmlu.item_pool(lm.tokenizer)
        assert len(pool) == 114 and len({q.subject for q in pool[:57]}) == 57
        fixed = mmlu.evaluate(lm.model, lm.tokenizer, progress=False)
        seq = mmlu.result_of(mmlu.score_items(lm.model, lm.tokenizer, pool, progress=False))
        assert seq.metrics == pytest.approx(fixed.metrics)
    ppl = tasks.get_task("ppl-token").from_options({"max_windows": 6, "seq_len": 16, "bos": "none"})
    pool = ppl.item_pool(lm.tokenizer)
    assert sorted(i for i, _ in pool) == list(range(6)) and [i for i, _ in pool] != list(range(6))
    fixed = ppl.evaluate(lm.model, lm.tokenizer, progress=False)
    seq = ppl.result_of(ppl.score_items(lm.model, lm.tokenizer, pool, progress=False))
    assert seq.metrics == pytest.approx(fixed.metrics)


# ---------------------------------------------------------------- resuming an interrupted variant

class _Windows:
    """A task of 40 windows whose NLL is known without a model; it counts what it scores."""

    name, primary_metric, higher_is_better = "fake", "ppl", {"ppl": False}

    def __init__(self, shift=0.0):
        from acbench.tasks.base import UntilDecided

        self.until_decided = UntilDecided("pca", looks=4, margin=0.02)
        self.shift, self.scored = shift, []

    def item_pool(self, tokenizer):
        return [(i, None) for i in range(40)]

    def score_items(self, model, tokenizer, items, progress=True):
        self.scored += [i for i, _ in items]
        return [{"window": i, "nll": 3.0 + self.shift + 0.01 * (i % 7)} for i, _ in items]

    def item_identity(self, item):
        return {"window": item[0]}

    def result_of(self, records):
        from acbench.tasks.base import TaskResult

        return TaskResult(metrics={"ppl": len(records)}, stderr={}, details={}, records=records, config={})


def _partial(keep: Path, records, **fields) -> None:
    """A kept-blocks file as write_partial writes it, with `fields` replacing what it would say."""
    from acbench.core.record import records_digest

    body = {"cell": keep.name[:-len(".partial")], "task": "fake", "digest": records_digest(records),
            "records": records, **fields}
    keep.write_text(json.dumps(body))


def test_an_interrupted_variant_resumes_from_its_blocks(tmp_path):
    from acbench.runner.until_decided import evaluate_until_decided

    ref = _Windows().score_items(None, None, _Windows().item_pool(None))
    fresh = evaluate_until_decided(_Windows(0.5), None, None, ref, progress=False)
    assert fresh.details["until_decided"]["items"] == 40  # a constant difference has no spread: it runs its budget
    keep = tmp_path / "cell.json.partial"
    first = _Windows(0.5).score_items(None, None, [(i, None) for i in range(20)])
    _partial(keep, first)
    task = _Windows(0.5)
    again = evaluate_until_decided(task, None, None, ref, progress=False, keep=keep)
    assert task.scored == list(range(20, 40)) and again.records == fresh.records and not keep.exists()
    assert again.details["until_decided"] == fresh.details["until_decided"]


def _tampered(first: list, keep: Path) -> dict:
    """{what was done to the kept blocks: what the refusal must say}: each a file a run must not resume."""
    from acbench.core.record import records_digest

    halved = [dict(r) for r in first]
    halved[3]["nll"] /= 2
    negative = [dict(r) for r in first]
    negative[0]["nll"] = -1.0
    shifted = [dict(r, window=r["window"] + 1) for r in first]
    return {
        "one NLL halved, digest kept": ({"records": halved, "digest": records_digest(first)}, "digest"),
        "a negative NLL, digest redone": ({"records": negative, "digest": records_digest(negative)}, "nll -1.0"),
        "a NaN NLL, digest redone": ({"records": [dict(r, nll=float("nan")) for r in first]}, "nll"),
        "other windows, digest redone": ({"records": shifted, "digest": records_digest(shifted)}, "first items"),
        "not whole blocks": ({"records": first[:7], "digest": records_digest(first[:7])}, "whole blocks"),
        "no digest": ({"digest": None}, "digest"),
        "another cell's": ({"cell": "other.json"}, "other.json"),
        "records not a list": ({"records": "x"}, "no list of records"),
        "records not mappings": ({"records": [1, 2], "digest": records_digest([1, 2])}, "not a mapping"),
    }


def test_a_tampered_or_damaged_kept_file_is_refused_in_one_line_naming_it(tmp_path):
    from acbench.runner.until_decided import evaluate_until_decided
    from acbench.core.errors import UserError
    from acbench.core.record import records_digest

    ref = _Windows().score_items(None, None, _Windows().item_pool(None))
    keep = tmp_path / "cell.json.partial"
    first = _Windows(0.5).score_items(None, None, [(i, None) for i in range(20)])
    for what, (fields, said) in _tampered(first, keep).items():
        body = {"cell": keep.name[:-len(".partial")], "task": "fake", "digest": records_digest(first),
                "records": first, **fields}
        if "records" in fields and "digest" not in fields:
            body["digest"] = records_digest(body["records"]) if isinstance(body["records"], list) else None
        keep.write_text(json.dumps(body))
        task = _Windows(0.5)
        with pytest.raises(UserError) as e:
            evaluate_until_decided(task, None, None, ref, progress=False, keep=keep)
        assert str(keep) in str(e.value) and said in str(e.value) and "remove the file" in str(e.value), what
        assert task.scored == [] and keep.exists(), what  # nothing scored, the file left for the user to look at
    keep.write_text("{not json")
    with pytest.raises(UserError, match="does not read as JSON"):
        evaluate_until_decided(_Windows(0.5), None, None, ref, progress=False, keep=keep)
    keep.unlink()
    keep.mkdir()  # a folder where the file belongs
    with pytest.raises(UserError, match="not a file"):
        evaluate_until_decided(_Windows(0.5), None, None, ref, progress=False, keep=keep)


def test_the_stored_done_when_run_reads_as_decided_in_the_report(tmp_path, capsys):
    """studies/cells/until-decided holds the issue's run (SmolLM2, pca / fasc-kfac / whitened-svd at rank 0.75,
    LAMA and ppl-token until decided): the report built from those cells alone gives each comparison with pca its
    confidence sequence at the items both scored, its verdict and its detectable difference."""
    cells = Path(__file__).resolve().parents[1] / "studies" / "cells" / "until-decided"
    out = tmp_path / "LEADERBOARD.md"
    assert main(["report", "--results", str(cells), "--out", str(out), "--vs", "pca"]) == 0
    rows: dict[str, str] = {}
    for line in out.read_text().splitlines():  # the rank section's table, the first to name each row
        if line.startswith("| "):
            rows.setdefault(line.split("|")[1].strip(), line)
    for method in ("fasc-kfac", "whitened-svd"):
        assert "CS n=272 better (detectable" in rows[method] and "CS n=40 better (detectable" in rows[method]
    assert "CS n=1354 better" in rows["dense"] and "CS n=781 better" in rows["dense"]


def _ppl_cell(root: Path, method: str) -> Path:
    """The method's ppl-token cell evaluated until decided (the fixed-size one beside it is another cell)."""
    return next(p for p in root.rglob("ppl-token-*.json") if f"/{method}/" in str(p)
                and "until_decided" in json.loads(p.read_text()).get("details", {}))


def test_an_edited_reference_or_decision_never_moves_a_verdict(decided, tmp_path):
    """The reference's records edited consistently (metrics recomputed to match) no longer match the digest written
    with them: the cell is invalid, so the report leaves it out and a rerun computes it again. Re-sealed by a forger,
    it is still not the records the variant was decided against: the pair gives no verdict. A variant's own stored
    decision edited to 'better' fails its digest too."""
    import math
    import shutil

    from acbench.core.record import CellRecord, cell_problem, until_decided_digest
    from acbench.core.significance import compare

    out = tmp_path / "results"
    shutil.copytree(decided[0], out)
    ref_path, svd_path = _ppl_cell(out, "pca"), _ppl_cell(out, "svd")
    svd = json.loads(svd_path.read_text())
    pair = compare(CellRecord.from_json(json.loads(ref_path.read_text())), CellRecord.from_json(svd))
    assert pair is not None and pair["n"] == svd["details"]["until_decided"]["items"]
    ref = json.loads(ref_path.read_text())
    for r in ref["records"]:
        r["nll"] = r["nll"] + 0.5  # a reference made worse: every variant would read "better"
    mean = sum(r["nll"] for r in ref["records"]) / len(ref["records"])
    ref["metrics"].update(nll=mean, ppl=math.exp(mean))
    ref_path.write_text(json.dumps(ref))
    assert "do not match the digest" in cell_problem(ref)
    rc, text = _run(["report", "--results", str(out), "--out", str(tmp_path / "LB.md")])
    assert rc == 0 and f"{ref_path.name}: its records or its until-decided decision do not match the digest" in text
    ref["details"]["until_decided"]["digest"] = until_decided_digest(ref["records"], ref["details"]["until_decided"])
    assert cell_problem(ref) is None  # a forger's seal: the cell reads as valid ...
    assert compare(CellRecord.from_json(ref), CellRecord.from_json(svd)) is None  # ... and decides nothing
    svd["details"]["until_decided"]["decision"] = "better" if svd["details"]["until_decided"]["decision"] != \
        "better" else "worse"
    assert "do not match the digest" in cell_problem(svd)


def test_a_tampered_kept_file_is_refused_before_any_work(tiny, decided, tmp_path):
    """A .partial beside a missing cell is read by content when the run is planned: a halved NLL is refused in one
    line naming the file before any model is compressed or any cell written."""
    import shutil

    from acbench.core.record import records_digest

    out = tmp_path / "results"
    shutil.copytree(decided[0], out)
    svd_path = _ppl_cell(out, "svd")
    records = json.loads(svd_path.read_text())["records"]
    svd_path.unlink()
    keep = svd_path.with_name(svd_path.name + ".partial")
    kept = records[:json.loads((_ppl_cell(out, "pca")).read_text())["details"]["until_decided"]["block"]]
    digest = records_digest(kept)
    kept[0] = dict(kept[0], nll=kept[0]["nll"] / 2)
    keep.write_text(json.dumps({"cell": svd_path.name, "task": "ppl-token", "digest": digest, "records": kept}))
    rc, text = _run(["run", "--model", str(tiny), *ARGS, "--until-decided", "--output", str(out), "--no-report"])
    assert rc == 2 and f"{keep} (the blocks an interrupted until-decided run kept): " in text and "digest" in text
    assert "[svd" not in text and not svd_path.exists() and keep.exists()


# ---------------------------------------------------------------- a family's level: --until-decided-alpha

class _Noisy(_Windows):
    """40 windows whose NLL is lower than the reference's by 0.1 with spread: decided early at 0.05, later (or
    never) at a level a family's correction asks for."""

    def score_items(self, model, tokenizer, items, progress=True):
        self.scored += [i for i, _ in items]
        return [{"window": i, "nll": 3.0 - 0.1 + 0.1 * ((i * 7) % 5 - 2) + 0.01 * (i % 7)} for i, _ in items]


def test_a_level_set_for_a_family_is_used_recorded_and_sealed():
    from acbench.core.record import until_decided_digest
    from acbench.runner.until_decided import evaluate_until_decided
    from acbench.tasks.base import UntilDecided

    ref = _Windows().score_items(None, None, _Windows().item_pool(None))
    plain = _Noisy()
    strict = _Noisy()
    strict.until_decided = UntilDecided("pca", looks=4, margin=0.02, alpha=0.05 / 1000)
    a = evaluate_until_decided(plain, None, None, ref, progress=False).details["until_decided"]
    b = evaluate_until_decided(strict, None, None, ref, progress=False).details["until_decided"]
    assert "alpha" not in a and b["alpha"] == 0.05 / 1000  # the default level leaves the record as it was
    assert a["decision"] == "better" and b["items"] > a["items"]  # the stricter sequence needs more windows
    assert UntilDecided("pca").as_dict() == {"reference": "pca", "looks": 20, "margin": None}  # keys kept
    assert UntilDecided("pca", alpha=0.001).as_dict()["alpha"] == 0.001
    records = _Noisy().score_items(None, None, _Noisy().item_pool(None))[:b["items"]]
    assert b["digest"] == until_decided_digest(records, b)
    assert until_decided_digest(records, {**b, "alpha": 0.05}) != b["digest"]  # the level is sealed with the rest


def test_the_level_is_refused_in_one_line_where_it_cannot_apply(tiny, tmp_path):
    base = ["run", "--model", str(tiny), "--methods", "pca", "svd", "--rank", "0.5", "--tasks", "ppl-token",
            "--ppl-windows", "3", "--ppl-seq-len", "16", "--no-latency", "--quiet", "--calib-samples", "1",
            "--output", str(tmp_path / "r")]
    rc, text = _run([*base, "--until-decided-alpha", "0.01"])
    assert rc == 2 and "--until-decided-alpha 0.01 only sets the level of --until-decided's" in text
    for bad in ("0", "0.6", "nan", "inf"):
        rc, text = _run([*base, "--until-decided", f"--until-decided-alpha={bad}"])
        assert rc == 2 and "--until-decided-alpha must be a level in (0, 0.5]" in text, (bad, text)
    rc, text = _run([*base, "--until-decided", "--until-decided-alpha", "0.01"])
    assert rc == 0, text[-500:]
    cells = _cells(tmp_path / "r")
    assert cells[("svd", "ppl-token")]["details"]["until_decided"]["alpha"] == 0.01
