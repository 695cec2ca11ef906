"""Task metrics on hand-built cases whose answers are worked out here, with fractions: LAMA's macro and micro
P@1, P@10 and MRR and their standard errors (from stored ranks), MMLU's micro and macro accuracy and their
standard errors (from letter scores the test sets)."""

import math
from fractions import Fraction as Fr
from types import SimpleNamespace

import pytest
import torch

import acbench.tasks.mmlu as mmlu
from acbench.tasks.data.mmlu_data import MMLUQuestion
from acbench.tasks.lama import LAMA


def _se(values):
    """Sample standard deviation over sqrt(n), exactly."""
    n = len(values)
    m = Fr(sum(values), n)
    var = sum((Fr(v) - m) ** 2 for v in values) / (n - 1)
    return math.sqrt(var / n)


def test_lama_metrics_from_ranks():
    ranks = {"r0": [0, 2, None], "r1": [0, 0, 12, 5]}  # None: the gold object was not among the candidates
    records = [{"relation": rel, "subject": f"{rel}-{i}", "rank": r, "n_candidates": 20}
               for rel, rs in ranks.items() for i, r in enumerate(rs)]
    ls = SimpleNamespace(relation_source={}, source="lama:fixture")
    res = LAMA._aggregate(records, [], ls, SimpleNamespace())
    m, se = res.metrics, res.stderr
    # P@1 per relation 1/3 and 2/4; macro is their mean, micro 3 of 7
    assert m["p@1"] == pytest.approx(float((Fr(1, 3) + Fr(1, 2)) / 2))
    assert m["p@1_micro"] == pytest.approx(3 / 7)
    assert m["p@10"] == pytest.approx(5 / 7)  # ranks 0, 2, 0, 0, 5 are within the top 10; 12 and None are not
    assert m["mrr"] == pytest.approx(float((1 + Fr(1, 3) + 0 + 1 + 1 + Fr(1, 13) + Fr(1, 6)) / 7))
    assert se["p@1_micro"] == pytest.approx(_se([1, 0, 0, 1, 1, 0, 0]))
    assert se["p@10"] == pytest.approx(_se([1, 1, 0, 1, 1, 0, 1]))
    # the macro mean's standard error: the relations' standard errors in quadrature, over the number of relations
    assert se["p@1"] == pytest.approx(math.sqrt(_se([1, 0, 0]) ** 2 + _se([1, 1, 0, 0]) ** 2) / 2)
    assert res.details["p@1_per_relation"] == pytest.approx({"r0": 1 / 3, "r1": 0.5})


def test_lama_macro_stderr_is_unknown_with_one_probe_per_relation():
    records = [{"relation": f"r{i}", "subject": "s", "rank": r, "n_candidates": 20} for i, r in enumerate([0, 3])]
    res = LAMA._aggregate(records, [], SimpleNamespace(relation_source={}, source="lama:fixture"), SimpleNamespace())
    assert res.metrics["p@1"] == 0.5 and res.stderr["p@1"] is None
    assert res.stderr["p@1_micro"] == pytest.approx(_se([1, 0]))


def test_mmlu_micro_and_macro_accuracy(monkeypatch):
    # 3 questions in one subject (2 right), 1 in another (wrong): micro 2/4, macro (2/3 + 0) / 2
    qs = [MMLUQuestion("algebra", f"q{i}", ("a", "b", "c", "d"), ans) for i, ans in enumerate([0, 1, 2])] + \
         [MMLUQuestion("virology", "q3", ("a", "b", "c", "d"), 3)]
    preds = [0, 1, 0, 2]
    monkeypatch.setattr(mmlu, "load_mmlu", lambda source: (qs, {}))
    monkeypatch.setattr(mmlu, "select_questions", lambda test, limit, seed: test)
    monkeypatch.setattr(mmlu, "score_prompts", lambda model, tok, prompts, bs, progress=True:
                        torch.nn.functional.one_hot(torch.tensor(preds), 4).float())
    res = mmlu.MMLU.from_options({}).evaluate(None, None, progress=False)
    assert res.metrics["acc"] == pytest.approx(0.5)
    assert res.metrics["acc_macro"] == pytest.approx(float((Fr(2, 3) + 0) / 2))
    assert res.stderr["acc"] == pytest.approx(_se([1, 1, 0, 0]))
    # a one-question subject adds no variance term
    assert res.stderr["acc_macro"] == pytest.approx(_se([1, 1, 0]) / 2)
    assert [r["correct"] for r in res.records] == [1, 1, 0, 0] and [r["pred"] for r in res.records] == list("ABAC")


def test_mmlu_records_details_and_shots(monkeypatch):
    """What a cell stores per question and per subject; the dev exemplars a prompt gets are its own subject's;
    a two-question subject adds its variance to the macro standard error."""
    qs = [MMLUQuestion("algebra", f"q{i}", ("a", "b", "c", "d"), ans) for i, ans in enumerate([0, 1])] + \
         [MMLUQuestion("virology", "q2", ("a", "b", "c", "d"), 3)]
    dev = {"algebra": [MMLUQuestion("algebra", f"dev{i}", ("w", "x", "y", "z"), 1) for i in range(5)],
           "virology": [MMLUQuestion("virology", "devv", ("w", "x", "y", "z"), 2)]}
    preds, seen = [0, 0, 3], {}
    monkeypatch.setattr(mmlu, "load_mmlu", lambda source: (qs, dev))
    monkeypatch.setattr(mmlu, "select_questions", lambda test, limit, seed: test)

    def score(model, tok, prompts, bs, progress=True):
        seen["prompts"] = prompts
        return torch.nn.functional.one_hot(torch.tensor(preds), 4).float()

    monkeypatch.setattr(mmlu, "score_prompts", score)
    res = mmlu.MMLU.from_options({"shots": 5}).evaluate(None, None, progress=False)
    assert res.records == [
        {"subject": "algebra", "pred": "A", "gold": "A", "correct": 1, "chance": 0.25},
        {"subject": "algebra", "pred": "A", "gold": "B", "correct": 0, "chance": 0.25},
        {"subject": "virology", "pred": "D", "gold": "D", "correct": 1, "chance": 0.25}]
    assert res.details["acc_per_subject"] == {"algebra": 0.5, "virology": 1.0}
    assert res.details["n_per_subject"] == {"algebra": 2, "virology": 1}
    assert res.details["shots_used"] == {"virology": 1}  # only where fewer than the asked 5 exist
    assert all("dev0" in p for p in seen["prompts"][:2]) and "devv" in seen["prompts"][2]
    assert not any("devv" in p for p in seen["prompts"][:2])
    assert res.stderr["acc_macro"] == pytest.approx(_se([1, 0]) / 2)


def test_mmlu_question_selection_is_stratified_seeded_and_keeps_order_when_all_are_taken():
    qs = [MMLUQuestion(s, f"{s}{i}", ("a", "b", "c", "d"), 0) for s in ("b-subj", "a-subj") for i in range(4)]
    by = lambda out, s: [q.question for q in out if q.subject == s]
    for limit in (None, 0, 4, 9):  # no limit, "0 = all", exactly all, more than all: every question, in order
        out = mmlu.select_questions(qs, limit, seed=3)
        assert by(out, "a-subj") == ["a-subj0", "a-subj1", "a-subj2", "a-subj3"] and len(out) == 8
        assert out[0].subject == "a-subj"  # subjects in sorted order
    two = mmlu.select_questions(qs, 2, seed=3)
    assert len(by(two, "a-subj")) == 2 == len(by(two, "b-subj"))
    assert two == mmlu.select_questions(qs, 2, seed=3) and set(map(id, two)) <= set(map(id, qs))


class _Tok:
    """A tokenizer whose encode honours add_special_tokens (a BOS id in front), as Gemma's does."""

    def __init__(self, split=""):
        self.split = split

    def encode(self, text, add_special_tokens=True):
        ids = [2] if add_special_tokens else []
        letter = text.strip()
        return ids + ([10, 11] if letter == self.split else [100 + ord(letter)])


def test_mmlu_letter_ids_never_include_special_tokens_and_a_split_letter_is_named():
    from acbench.core.errors import UserError

    assert mmlu.letter_token_ids(_Tok()) == [100 + ord(c) for c in "ABCD"]
    with pytest.raises(UserError, match="splits ' C' into 2 tokens: MMLU letter scoring needs one"):
        mmlu.letter_token_ids(_Tok(split="C"))


def test_mmlu_settings_spell_all_one_way_and_refuse_a_batch_below_one():
    assert mmlu.MMLU.from_options({"limit": 0}).settings.limit is None
    assert mmlu.MMLU.from_options({"limit": 3}).settings.limit == 3
    assert mmlu.MMLUSettings(batch_size=1).minimums() == {"batch_size": (1, 1)}
    with pytest.raises(ValueError, match="batch_size"):
        mmlu.MMLU.from_options({"batch_size": 0})


def test_lama_metrics_at_their_boundaries_with_sources():
    """Ranks on the cut-offs (1 is not a hit at 1, 10 is not within the top 10, 9 is), a relation with one probe
    (no variance of its own: left out of the macro standard error), P@1 per source (the mean over a source's
    relations; a relation without a source of its own takes the set's kind) and the details each cell stores."""
    ranks = {"r0": [0, 1, None], "r1": [0, 1, 10, 10, 10], "r2": [9]}
    n_cands = {"r0": [20, 25, 20], "r1": [20] * 5, "r2": [20]}
    records = [{"relation": rel, "subject": f"{rel}-{i}", "rank": r, "n_candidates": n_cands[rel][i]}
               for rel, rs in ranks.items() for i, r in enumerate(rs)]
    ls = SimpleNamespace(relation_source={"r0": "T-REx", "r1": "T-REx"}, source="lama:fixture")
    missing = [{"subject": "x", "relation": "r0", "objects": ("y",)}]
    res = LAMA._aggregate(records, missing, ls, SimpleNamespace())
    m, se, d = res.metrics, res.stderr, res.details
    assert m["p@1"] == pytest.approx(float((Fr(1, 3) + Fr(1, 5) + 0) / 3))
    assert m["p@1_micro"] == pytest.approx(2 / 9)
    assert m["p@10"] == pytest.approx(5 / 9)
    rr = [1, Fr(1, 2), 0, 1, Fr(1, 2), Fr(1, 11), Fr(1, 11), Fr(1, 11), Fr(1, 10)]
    assert m["mrr"] == pytest.approx(float(sum(rr) / 9))
    assert se["mrr"] == pytest.approx(_se(rr))
    assert se["p@1"] == pytest.approx(math.sqrt(_se([1, 0, 0]) ** 2 + _se([1, 0, 0, 0, 0]) ** 2) / 3)
    assert d["p@1_per_source"] == pytest.approx({"T-REx": float((Fr(1, 3) + Fr(1, 5)) / 2), "lama": 0.0})
    assert d["n_per_relation"] == {"r0": 3, "r1": 5, "r2": 1}
    assert d["n_candidates"] == {"r0": 25, "r1": 20, "r2": 20}
    assert d["missing_gold"] == missing and d["source"] == "lama:fixture"


def test_lama_macro_mean_of_one_relation():
    """One relation of two probes: the macro P@1 is its P@1 and its standard error the relation's own."""
    records = [{"relation": "r", "subject": f"s{i}", "rank": r, "n_candidates": 5} for i, r in enumerate([0, 4])]
    res = LAMA._aggregate(records, [], SimpleNamespace(relation_source={}, source="embedded"), SimpleNamespace())
    assert res.metrics["p@1"] == 0.5 and res.stderr["p@1"] == pytest.approx(_se([1, 0]))
    assert res.details["p@1_per_source"] == {"embedded": 0.5}


def test_mean_stderr_by_hand():
    from acbench.tasks.base import mean_stderr

    nan = lambda v: v != v  # noqa: E731
    m, se = mean_stderr([])
    assert nan(m) and nan(se)
    m, se = mean_stderr([3.0])
    assert m == 3.0 and nan(se)
    # mean 3, sample variance (4 + 1 + 0 + 9) / 3, standard error its root over root 4
    assert mean_stderr([1.0, 2.0, 3.0, 6.0]) == pytest.approx((3.0, math.sqrt(14 / 3 / 4)), rel=1e-12)
    assert mean_stderr([0, 1]) == pytest.approx((0.5, 0.5))  # variance 1/2 over 2 tokens


@pytest.mark.parametrize("chunk, cap", [(5, None), (5, 2.0), (23, None), (64, 2.0)])
def test_target_logprobs_through_a_biased_capped_head(chunk, cap):
    """A head with a bias, sliced with the weights (slices of 5 of 23 words: the last one partial), and the
    soft-capping, against the float64 log-softmax of the whole logits."""
    from acbench.tasks.base import base_model, target_logprobs

    gen = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(6, 23, bias=True)
    with torch.no_grad():
        head.bias.copy_(torch.randn(23, generator=gen) * 3)
    model = SimpleNamespace(get_output_embeddings=lambda: head, config=SimpleNamespace(final_logit_softcapping=cap))
    hidden = torch.randn(4, 6, generator=gen)
    targets = torch.tensor([[0, 22, 5], [4, 4, 10], [11, 15, 20], [21, 1, 9]])
    with torch.no_grad():
        logits = (hidden.double() @ head.weight.double().T + head.bias.double())
        if cap:
            logits = torch.tanh(logits / cap) * cap
        want = torch.log_softmax(logits, -1).gather(1, targets)
        got = target_logprobs(model, hidden, targets, vocab_chunk=chunk)
    assert got.dtype == torch.float64 and got.shape == (4, 3)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    decoder = object()
    assert base_model(SimpleNamespace(get_decoder=lambda: decoder, model="inner")) is decoder
    assert base_model(SimpleNamespace(model="inner")) == "inner"


def test_check_limit_refuses_a_limit_above_every_group():
    from acbench.core.errors import UserError
    from acbench.tasks.base import check_limit

    check_limit(None, [3, 5], "--limit", "subject")
    check_limit(0, [3, 5], "--limit", "subject")  # 0 means all
    check_limit(5, [3, 5], "--limit", "subject")  # the largest group's size is allowed
    with pytest.raises(UserError) as err:
        check_limit(6, [3, 5], "--lama-limit", "relation")
    assert str(err.value) == ("--lama-limit 6 exceeds the largest relation (5 items): pass 0 for all, or at most 5")
    with pytest.raises(UserError, match=r"largest subject \(0 items\)"):
        check_limit(1, [], "--limit", "subject")


def test_a_task_without_overrides_takes_nothing_from_the_run():
    from acbench.tasks.base import RunShared, Task

    class Bare(Task):
        name = "bare"

    t = Bare.for_run({"ignored": None}, RunShared(seed=3, batch_size=8))
    assert Bare.run_settings(RunShared(seed=3)) == {} and t.size_note() == "" and t.check(None) is None
    with pytest.raises(NotImplementedError):
        t.evaluate(None, None)


def test_a_linear_head_is_read_in_slices_never_whole(monkeypatch):
    """A plain Linear head is never called on the whole hidden state (that would materialise the N x V logits):
    its weight is read in slices; and next_token_nll passes its slice width on."""
    import acbench.tasks.base as base

    head = torch.nn.Linear(6, 23, bias=False)
    head.register_forward_pre_hook(lambda *a: (_ for _ in ()).throw(AssertionError("the whole head was called")))
    model = SimpleNamespace(get_output_embeddings=lambda: head, config=SimpleNamespace())
    hidden = torch.randn(2, 3, 6, generator=torch.Generator().manual_seed(0))
    targets = torch.tensor([[1, 2, 22], [0, 7, 9]])
    with torch.no_grad():
        got = base.next_token_nll(model, hidden, targets, vocab_chunk=5)
        want = -torch.log_softmax(hidden.double() @ head.weight.double().T, -1).gather(-1, targets[..., None])[..., 0]
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    seen = []
    real = base.target_logprobs
    monkeypatch.setattr(base, "target_logprobs", lambda m, h, t, chunk: seen.append(chunk) or real(m, h, t, chunk))
    with torch.no_grad():
        base.next_token_nll(model, hidden, targets, vocab_chunk=5)
        base.next_token_nll(model, hidden, targets)
    assert seen == [5, base.VOCAB_CHUNK]
