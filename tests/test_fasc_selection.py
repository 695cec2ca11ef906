"""FASC's coupling correction generalises: synthetic distributions of DESIGN.md section 10, mean of 5 seeds."""

import pytest
import torch

from core.linalg import weighted_subspace
from methods.fasc import _apply, direction_scores, select_discard, swap_path

from coupling_synthetic import Distribution

SEEDS = range(5)


def heldout_change(kind: str, d: int, N: int, seed: int, folds: int = 4) -> tuple[float, float]:
    """(fasc's, an oracle's) held-out surrogate change vs fasc-kfac: C, F from 8,192 tokens, the pair sample their
    first N, held-out surrogate on 40,000 fresh tokens; the oracle searches swaps on another 40,000 tokens."""
    dist = Distribution(kind, d, seed)
    x, g = dist.sample(8192)
    sol = weighted_subspace(x.T @ x / len(x), F=g.T @ g / len(g))
    kfac = torch.arange(d // 2, d)
    D, extras = select_discard(direction_scores(sol, x[:N], g[:N]), kfac, 512, folds)
    assert extras["swaps"] <= extras["swaps_in_sample"]

    def Q_of(n):
        z = direction_scores(sol, *dist.sample(n))
        return z.T @ z / n

    Qh, Qo = Q_of(40_000), Q_of(40_000)
    f = lambda in_D: float(in_D.double() @ Qh @ in_D.double())
    base = f(_apply(d, kfac, []))
    oracle = _apply(d, kfac, swap_path(Qo, kfac, 10_000))
    return f(D) / base - 1, f(oracle) / base - 1


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # small matrices: threads only add overhead
    yield
    torch.set_num_threads(n)


def test_no_overfitting_where_kfac_is_right():
    changes = [heldout_change("A", 64, 512, s)[0] for s in SEEDS]
    assert sum(changes) / len(changes) <= 0.01
    # the unvalidated in-sample search (folds=1) is what overfits: it is measurably worse held-out
    unvalidated = [heldout_change("A", 64, 512, s, folds=1)[0] for s in SEEDS]
    assert sum(unvalidated) / len(unvalidated) > 0.03


@pytest.mark.parametrize("N", [512, 4096])
def test_keeps_half_the_oracle_gain_where_kfac_misranks(N):
    pairs = [heldout_change("B", 128, N, s) for s in SEEDS]
    fasc = sum(p[0] for p in pairs) / len(pairs)
    oracle = sum(p[1] for p in pairs) / len(pairs)
    assert oracle < -0.1
    assert fasc <= 0.5 * oracle


def test_fasc_settings_are_validated():
    from methods.fasc import FASC

    with pytest.raises(ValueError, match="max_swaps must be >= 0"):
        FASC.from_options({"max_swaps": -5})
    with pytest.raises(TypeError, match="max_swaps must be int"):
        FASC.from_options({"max_swaps": "abc"})
    with pytest.raises(ValueError, match="folds must be >= 1"):
        FASC.from_options({"folds": 0})
