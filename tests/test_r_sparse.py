"""R-Sparse against its paper's forward written out here: per matrix and token, the k = floor(n d rho) channels
with the largest |x_j| ||W[:, j]|| through W, the rest through W's rank-r truncated SVD (numpy), r =
floor((m n d - k m) / (m + n)); rho = 1: the top floor(n d) by |x_j| alone. The deployed sites of a tiny model are
compared with it on a prefill (masked product) and on a decode step (gathered product plus the branch)."""

import math

import numpy as np
import pytest
import torch

from acbench import methods
from acbench.deploy.compression import compressed
from acbench.core.stats import SparsitySpec

from conftest import one_block_with_c


def reference(x, W, density, rho):
    m, n = W.shape
    k = max(1, math.floor(n * density * rho))
    c = np.sqrt((W ** 2).sum(0)) if rho < 1 else np.ones(n)
    top = sorted(range(n), key=lambda j: -abs(x[j]) * c[j])[:k]
    mask = np.zeros(n)
    mask[top] = 1.0
    y = W @ (mask * x)
    r = min(m, n, max(0, math.floor((m * n * density - k * m) / (m + n)))) if rho < 1 else 0
    if r:
        U, S, Vt = np.linalg.svd(W, full_matrices=False)
        y = y + (U[:, :r] * S[:r]) @ Vt[:r] @ ((1 - mask) * x)
    return y, k, r


@pytest.fixture(scope="module")
def model_and_stats():
    return one_block_with_c()


@pytest.mark.parametrize("density,rho", [(0.5, 0.95), (0.5, 0.6), (0.3, 0.8), (0.5, 1.0)])
def test_deployed_sites_equal_the_paper_forward(model_and_stats, density, rho):
    model, groups, stats = model_and_stats
    gen = torch.Generator().manual_seed(5)
    macs = dense = 0
    with compressed(model, f"r-sparse:sparse_ratio={rho}", SparsitySpec(density=density), stats,
                    progress=False) as (m, summaries):
        for g in groups:
            x = torch.randn(3, g.d_in, generator=gen)
            for name, site_dense in zip(g.site_names, g.sites):
                W = site_dense.weight.detach().double().numpy()
                want = [reference(x[i].double().numpy(), W, density, rho) for i in range(3)]
                site = m.get_submodule(name)
                with torch.no_grad():
                    prefill = site(x.unsqueeze(0)).squeeze(0)
                    decode = torch.cat([site(x[i:i + 1]) for i in range(3)])
                for got in (prefill, decode):
                    assert np.allclose(got.double().numpy(), np.stack([w[0] for w in want]), rtol=1e-4, atol=1e-4)
                _, k, r = want[0]
                macs += k * W.shape[0] + r * sum(W.shape)
                dense += W.size
    total = sum(s["compute_ratio"] * s["params_dense"] for s in summaries) / sum(s["params_dense"] for s in summaries)
    assert total == pytest.approx(macs / dense) and total <= density + 1e-9


def test_full_density_is_dense_and_settings_and_patterns_are_refused(model_and_stats):
    model, _, stats = model_and_stats
    ids = torch.randint(0, 101, (1, 10), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = model(ids).logits
        with compressed(model, "r-sparse", SparsitySpec(density=1.0), stats, progress=False) as (m, _):
            got = m(ids).logits
    assert torch.allclose(got, want, atol=1e-5)
    assert "density" in methods.pattern_problem("r-sparse", SparsitySpec.parse("2:4"))
    for bad in ("sparse_ratio=0", "sparse_ratio=1.5", "sparse_ratio=nan", "sparse_ratio=true"):
        with pytest.raises(ValueError, match="r-sparse"):
            methods.build(f"r-sparse:{bad}")


@pytest.mark.parametrize("method", ["r-sparse", "r-sparse:sparse_ratio=1", "wina", "larosa", "sparsegpt",
                                    "act-sparse", "wanda"])
def test_plan_prices_each_group_as_deployed(model_and_stats, method):
    """`bench plan`'s per-group price (group_cost, from shapes alone) equals what the deployed group reports: its
    multiply-adds, its parameters and its mask index bits per token."""
    model, groups, stats = model_and_stats
    comp = methods.build(method)
    pattern = SparsitySpec(density=0.5)
    with compressed(model, method, pattern, stats, progress=False) as (_, summaries):
        for g, s in zip(groups, summaries):
            macs, params, bits = comp.group_cost(g, pattern)
            assert macs == pytest.approx(s["compute_ratio"] * s["params_dense"]), (method, g.name)
            assert params == s["params_deployed"], (method, g.name)
            assert bits == s.get("index_bits_per_token", 0), (method, g.name)
