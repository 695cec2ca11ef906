"""Task metrics on hand-built cases whose answers are worked out here, with fractions: LAMA's macro and micro
P@1, P@10 and MRR and their standard errors (from stored ranks), MMLU's micro and macro accuracy and their
standard errors (from letter scores the test sets)."""

import math
from fractions import Fraction as Fr
from types import SimpleNamespace

import pytest
import torch

import tasks.mmlu as mmlu
from tasks.data.mmlu_data import MMLUQuestion
from tasks.lama import LAMA


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
