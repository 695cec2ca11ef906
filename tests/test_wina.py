"""WINA as its authors run it, against a brute force written out here: per token and per site, the top-k channels
by |x_j| times that site's own column norm ||W[:, j]|| for k_proj and gate_proj, by |x_j| for every other site,
through y = W (mask * x). The deployed sites of a tiny model are compared with it on a prefill (masked product)
and a decode step (gathered product)."""

import numpy as np
import pytest
import torch

from acbench import methods
from acbench.deploy.compression import compressed
from acbench.core.stats import SparsitySpec

from conftest import one_block_with_c


def brute(x, W, keep, weighted):
    c = np.sqrt((W ** 2).sum(0)) if weighted else np.ones(W.shape[1])
    order = sorted(range(len(x)), key=lambda j: -abs(x[j]) * c[j])
    kept = np.zeros_like(x)
    kept[order[:keep]] = x[order[:keep]]
    return W @ kept


@pytest.fixture(scope="module")
def model_and_stats():
    return one_block_with_c()


@pytest.mark.parametrize("weighted", ["authors", "all"])
@pytest.mark.parametrize("budget", ["0.5", "2:4"])
def test_each_site_keeps_its_own_top_k(model_and_stats, weighted, budget):
    model, groups, stats = model_and_stats
    pattern = SparsitySpec.parse(budget)
    gen = torch.Generator().manual_seed(5)
    with compressed(model, f"wina:weighted={weighted}", pattern, stats, progress=False) as (m, summaries):
        for g in groups:
            x = torch.randn(3, g.d_in, generator=gen)
            for name, dense in zip(g.site_names, g.sites):
                W = dense.weight.detach().double().numpy()
                own = weighted == "all" or name.endswith(("k_proj", "gate_proj"))
                want = []
                for i in range(3):
                    xi = x[i].double().numpy()
                    if pattern.structured:  # per block of M channels
                        c = np.sqrt((W ** 2).sum(0)) if own else np.ones(g.d_in)
                        kept = np.zeros_like(xi)
                        for b in range(0, g.d_in, pattern.m):
                            top = sorted(range(b, b + pattern.m), key=lambda j: -abs(xi[j]) * c[j])[:pattern.n]
                            kept[top] = xi[top]
                        want.append(W @ kept)
                    else:
                        want.append(brute(xi, W, pattern.keep(g.d_in), own))
                site = m.get_submodule(name)
                with torch.no_grad():
                    prefill = site(x.unsqueeze(0)).squeeze(0)
                    decode = torch.cat([site(x[i:i + 1]) for i in range(3)])
                for got in (prefill, decode):
                    assert np.allclose(got.double().numpy(), np.stack(want), rtol=1e-4, atol=1e-4), (name, budget)
    masks = {s["group"].rsplit(".", 1)[-1]: s.get("masks", 1) for s in summaries}
    assert masks == ({"attn_in": 2, "attn_out": 1, "mlp_in": 2, "mlp_out": 1} if weighted == "authors" else
                     {"attn_in": 3, "attn_out": 1, "mlp_in": 2, "mlp_out": 1})


def test_wina_differs_from_the_group_form_and_is_dense_at_full_density(model_and_stats):
    model, groups, stats = model_and_stats
    ids = torch.randint(0, 101, (1, 10), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        dense = model(ids).logits
        with compressed(model, "wina", SparsitySpec.parse("0.5"), stats, progress=False) as (m, _):
            authors = m(ids).logits
        with compressed(model, "act-sparse:score=wina", SparsitySpec.parse("0.5"), stats, progress=False) as (m, _):
            group_form = m(ids).logits
        with compressed(model, "wina", SparsitySpec.parse("1"), stats, progress=False) as (m, _):
            full = m(ids).logits
    assert not torch.allclose(authors, group_form, atol=1e-4)
    assert torch.allclose(full, dense, atol=1e-5)
    with pytest.raises(ValueError, match="wina weighted"):
        methods.build("wina:weighted=some")
