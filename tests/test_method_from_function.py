"""A method in one decorated function (methods/from_function.py): what the decorator derives (registration, the
contract, the plan's cost and the run's summary from one result type) and what it refuses in the function's answer."""

from __future__ import annotations

import pytest
import torch

from acbench import methods
from acbench.testing import FakeGroup, check_method, random_stats, random_weights
from acbench.core.stats import RankSpec, SparsitySpec
from acbench.methods.from_function import Basis, low_rank_method, sparsity_method
from tests.test_method_authors import Registered


@low_rank_method("fn-top-c", needs={"C"}, description="top-k eigenvectors of C, by a decorated function")
def TopC(stats, k):
    _, vectors = torch.linalg.eigh(stats.C)
    return vectors[:, -k:]


@sparsity_method("fn-mean-score", needs={"abs_mean"})
def MeanScore(stats):
    """|x_j| weighed by the calibrated E|x_j| (a decorated sparsity function with statistics)."""
    return stats.abs_mean


def test_decorated_functions_are_methods_that_meet_the_contract():
    for cls in (TopC, MeanScore):
        with Registered(cls) as name:
            failed = {c.name: c.detail for c in check_method(name) if c.passed is False}
            assert failed == {}, failed
            assert methods.get_method(name) is cls
    assert MeanScore.description.startswith("|x_j| weighed by")  # the docstring's first line, where none is given
    assert TopC().capabilities() == {"data_free": False, "activations": True, "gradients": False}


def test_the_plan_cost_and_the_run_summary_of_a_decorated_sparsity_method_agree():
    weights = random_weights((7, 5), 16)
    group = FakeGroup(weights)
    for pattern in (SparsitySpec.parse("2:4"), SparsitySpec.parse("0.5")):
        res = MeanScore().compress(group, random_stats(16, sites={"s0": 7, "s1": 5}), pattern)
        macs, params, bits = MeanScore().group_cost(group, pattern)
        summary = res.summary()
        assert params == summary["params_deployed"] and macs == pytest.approx(summary["compute_ratio"] *
                                                                               summary["params_dense"])
        assert bits == summary["index_bits_per_token"]


@pytest.mark.parametrize("answer,needle", [
    (lambda stats, k: torch.ones(stats.C.shape[0], k), "not orthonormal"),
    (lambda stats, k: torch.eye(stats.C.shape[0])[:, : k + 1], "not (16, "),
    (lambda stats, k: Basis(torch.eye(16)[:, :k], torch.eye(16)[:k, :].T), "returned B of"),
    (lambda stats, k: Basis(torch.full((16, k), float("nan")), torch.zeros(k, 16)), "NaN or inf"),
])
def test_a_basis_that_cannot_deploy_is_refused_in_one_line(answer, needle):
    cls = low_rank_method("fn-bad-basis", needs={"C"})(answer)
    with pytest.raises(ValueError, match="method fn-bad-basis returned") as e:
        cls().compress(FakeGroup(random_weights((7, 5), 16)), random_stats(16, sites={"s0": 7, "s1": 5}),
                       RankSpec(0.5))
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("answer,needle", [
    (lambda weights: -torch.ones(16), "negative, NaN or inf"), (lambda weights: torch.ones(15), "not (16,)"),
    (lambda weights: [1.0] * 16, "of list"),
])
def test_score_factors_that_cannot_deploy_are_refused_in_one_line(answer, needle):
    cls = sparsity_method("fn-bad-scores")(answer)
    with pytest.raises(ValueError, match="method fn-bad-scores returned score factors") as e:
        cls().compress(FakeGroup(random_weights((7, 5), 16)), random_stats(16, sites={"s0": 7, "s1": 5}),
                       SparsitySpec.parse("2:4"))
    assert needle in str(e.value)


def test_a_function_asking_for_an_argument_no_method_receives_is_refused_where_it_is_decorated():
    with pytest.raises(TypeError, match="takes tokens: a method function takes any of stats, weights, k, settings"):
        low_rank_method("fn-odd")(lambda stats, tokens: None)
    with pytest.raises(TypeError, match="first argument is the method's name"):
        sparsity_method(None)(lambda weights: None)
