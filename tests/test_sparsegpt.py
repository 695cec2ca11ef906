"""SparseGPT against the paper's equations, written out here with explicit inverses: each column visited in turn,
a pruned weight w_j moving -w_j / [H_F^-1]_jj * [H_F^-1]_j,F onto the columns F = {j, ...} not yet visited (the
optimal brain surgeon update, H_F^-1 the inverse of H restricted to F, no Cholesky), the mask chosen with the
weights as updated so far by w^2 / [H_F^-1]_jj (per block over every row, or per row within each M columns)."""

import math

import numpy as np
import pytest
import torch

from acbench import methods
from acbench.testing import FakeGroup
from acbench.core.stats import GroupStats, SparsitySpec


def reference(W, H, keep, m, block, damping):
    W, H = W.copy(), H.copy()
    rows, cols = W.shape
    dead = np.diag(H) == 0
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    H = H + damping * np.mean(np.diag(H)) * np.eye(cols)
    pruned = np.zeros(W.shape, dtype=bool)
    hjj = [np.linalg.inv(H[j:, j:])[0, 0] for j in range(cols)]
    block = block if not m else math.ceil(block / m) * m
    total = (cols - keep) * rows
    for i1 in range(0, cols, block):
        i2 = min(i1 + block, cols)
        if not m:
            count = round(total * i2 / cols) - round(total * i1 / cols)
            cells = sorted(((W[r, j] ** 2 / hjj[j], r, j) for r in range(rows) for j in range(i1, i2)))
            for _, r, j in cells[:count]:
                pruned[r, j] = True
        for j in range(i1, i2):
            if m and (j - i1) % m == 0:
                for r in range(rows):
                    order = sorted(range(j, j + m), key=lambda c: W[r, c] ** 2 / hjj[c])
                    pruned[r, order[:m - keep]] = True
            inv = np.linalg.inv(H[j:, j:])
            for r in range(rows):
                if pruned[r, j]:
                    W[r, j:] -= W[r, j] / inv[0, 0] * inv[0, :]
                    W[r, j] = 0.0  # exactly what the update leaves, without its round-off
    return W, ~pruned


def _layer(rows=6, cols=24, dead=()):
    gen = torch.Generator().manual_seed(11)
    X = torch.randn(60, cols, generator=gen, dtype=torch.float64) @ torch.randn(cols, cols, generator=gen,
                                                                              dtype=torch.float64)
    X[:, list(dead)] = 0.0
    W = torch.randn(rows, cols, generator=gen, dtype=torch.float64)
    return W, X.T @ X / X.shape[0]


@pytest.mark.parametrize("budget", ["0.5", "0.3", "2:4", "4:8", "1:4"])
@pytest.mark.parametrize("dead", [(), (5,)])
def test_sparsegpt_equals_the_obs_reference(budget, dead):
    W, C = _layer(dead=dead)
    pattern = SparsitySpec.parse(budget)
    comp = methods.build("sparsegpt:block_size=8")
    res = comp.compress(FakeGroup({"a": W.float()}), GroupStats(n_tokens=60, C=C), pattern)
    keep, m = pattern.topk_args(W.shape[1])
    want_W, want_mask = reference(W.numpy(), C.numpy(), keep, m, 8, 0.01)
    assert torch.equal(res.masks["a"], torch.from_numpy(want_mask))
    got = res.deployed_weight("a", torch.zeros(1, dtype=torch.float64).expand(W.shape))
    assert np.allclose(got.numpy(), want_W * want_mask, rtol=0, atol=1e-5 * np.abs(want_W).max())
    kept = int(res.masks["a"].sum())
    assert kept == (keep * W.shape[0] if not m else W.shape[0] * W.shape[1] // m * keep)


def test_sparsegpt_reconstructs_better_than_its_own_mask_without_the_updates():
    W, C = _layer()
    res = methods.build("sparsegpt").compress(FakeGroup({"a": W.float()}), GroupStats(n_tokens=60, C=C),
                                              SparsitySpec.parse("2:4"))
    mask = res.masks["a"].double()
    err = lambda V: float(torch.trace((W - V) @ C @ (W - V).T))  # ||(W - W') X||^2 / n
    assert err(res.deployed_weight("a", W)) < 0.7 * err(W * mask)


def test_sparsegpt_at_full_density_is_dense_and_bad_settings_are_refused():
    W, C = _layer(dead=(3,))
    res = methods.build("sparsegpt").compress(FakeGroup({"a": W.float()}), GroupStats(n_tokens=60, C=C),
                                              SparsitySpec.parse("1"))
    assert torch.equal(res.deployed_weight("a", W.float()), W.float())
    for bad in ("damping=0", "damping=1.5", "damping=nan", "block_size=0", "block_size=2.5", "damping=true"):
        with pytest.raises(ValueError, match="sparsegpt"):
            methods.build(f"sparsegpt:{bad}")


def test_a_singular_hessian_raises_the_damping_and_records_it():
    W, C = _layer()
    C = torch.ones_like(C)  # rank one: the Cholesky of H + 1e-300 mean(diag H) I fails
    res = methods.build("sparsegpt:damping=1.0e-300").compress(FakeGroup({"a": W.float()}),
                                                              GroupStats(n_tokens=60, C=C), SparsitySpec.parse("2:4"))
    assert [f["fallback"] for f in res.fallbacks] == ["sparsegpt damping raised"]
    assert res.fallbacks[0]["damping"] > 1e-300 and res.summary()["fallbacks"] == res.fallbacks


def test_the_per_block_budget_adds_up_where_the_pruned_count_does_not_divide():
    """3 rows x 23 columns at density 0.3 keep 7 of 23 per row: 48 weights pruned over blocks of 8, 8 and 7 columns.
    Their shares, rounded cumulatively by hand: round(48 * 8 / 23) = 17, round(48 * 16 / 23) - 17 = 33 - 17 = 16,
    48 - 33 = 15. Rounding each block's share alone would prune 17 + 17 + 15 = 49, one more than the budget."""
    W, C = _layer(rows=3, cols=23)
    pattern = SparsitySpec.parse("0.3")
    assert pattern.topk_args(23) == (7, 0)
    res = methods.build("sparsegpt:block_size=8").compress(FakeGroup({"a": W.float()}), GroupStats(n_tokens=60, C=C),
                                                            pattern)
    pruned = ~res.masks["a"]
    assert [int(pruned[:, a:b].sum()) for a, b in ((0, 8), (8, 16), (16, 23))] == [17, 16, 15]
    want_W, want_mask = reference(W.numpy(), C.numpy(), 7, 0, 8, 0.01)
    assert torch.equal(res.masks["a"], torch.from_numpy(want_mask))
