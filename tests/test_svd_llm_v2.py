"""SVD-LLM V2 against the paper, written out here from its statements: Theorem 3.1's two-SVD truncation (numpy,
X X^T's eigendecomposition and D's SVD), whose loss must be the least one the Eckart-Young bound on W X allows;
Algorithm 1's allocation from losses computed directly as ||W X - W' X||_F; and the deployed sites of a tiny model
carrying the allocated ranks."""

import math

import numpy as np
import pytest
import torch

from acbench import methods
from acbench.testing import FakeGroup
from acbench.core.stats import GroupStats, RankSpec


def _tokens(n=200, d=12, rank=None, seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, rank or d)) @ rng.standard_normal((rank or d, d))
    return scale * X  # n tokens x d


def reference_truncation(W, X, r):
    """Theorem 3.1: X^T X = U diag(lam) U^T (tokens in rows here), D = W U lam^1/2, W' = U_r S_r V_r^T lam^-1/2 U^T
    over the directions of non-zero variance."""
    lam, U = np.linalg.eigh(X.T @ X)
    keep = lam > lam.max() * 1e-10
    U, lam = U[:, keep], lam[keep]
    Ud, S, Vt = np.linalg.svd(W @ U * np.sqrt(lam), full_matrices=False)
    return (Ud[:, :r] * S[:r]) @ Vt[:r] / np.sqrt(lam) @ U.T


def _stats(X):
    Xt = torch.from_numpy(X)
    return GroupStats(n_tokens=X.shape[0], C=Xt.T @ Xt / X.shape[0])


@pytest.mark.parametrize("x_rank", [None, 7])
def test_truncation_is_theorem_3_1_and_reaches_the_least_loss(x_rank):
    X = _tokens(rank=x_rank)
    rng = np.random.default_rng(1)
    weights = {"q": rng.standard_normal((9, 12)), "k": rng.standard_normal((5, 12))}
    comp = methods.build("svd-llm-v2")
    g = FakeGroup({n: torch.from_numpy(W).float() for n, W in weights.items()})
    res = comp.compress(g, _stats(X), RankSpec(0.5))
    for n, W in weights.items():
        W = torch.from_numpy(W).float().double().numpy()  # the site's float32 weight, as solved
        A, B = (t.double().numpy() for t in res.factors[n])
        r = A.shape[1]
        assert r == min(round(0.5 * min(W.shape)), x_rank or 99)
        want = reference_truncation(W, X, r)
        assert np.allclose(A @ B, want, rtol=0, atol=1e-5 * np.abs(want).max())
        s = np.linalg.svd(W @ X.T, compute_uv=False)  # Eckart-Young on W X: nothing of rank r does better
        assert np.linalg.norm((W - A @ B) @ X.T) == pytest.approx(np.sqrt((s[r:] ** 2).sum()), rel=1e-4)


def test_truncation_equals_svd_llm_v1_where_the_cholesky_exists():
    X = _tokens()
    rng = np.random.default_rng(2)
    weights = {"q": torch.from_numpy(rng.standard_normal((9, 12))).float()}
    v2 = methods.build("svd-llm-v2").compress(FakeGroup(weights), _stats(X), RankSpec(0.5))
    v1 = methods.build("whitened-svd:per_site=true").compress(FakeGroup(weights), _stats(X), RankSpec(0.5))
    (A2, B2), (A1, B1) = v2.factors["q"], v1.factors["q"]
    assert torch.allclose(A2 @ B2, A1 @ B1, atol=1e-4)


def _layers(scales, d=12):
    """Two blocks' attention groups (q and k sites), block i's weights scaled by scales[i]."""
    rng = np.random.default_rng(3)
    groups, stats = [], {}
    for i, s in enumerate(scales):
        w = {f"model.layers.{i}.self_attn.q_proj": s * rng.standard_normal((10, d)),
             f"model.layers.{i}.self_attn.k_proj": s * rng.standard_normal((6, d))}
        g = FakeGroup({n: torch.from_numpy(W).float() for n, W in w.items()}, name=f"model.layers.{i}.attn_in")
        groups.append(g)
        stats[g.name] = _stats(_tokens(seed=10 + i, scale=3.0))
    return groups, stats


def test_allocation_is_algorithm_1_on_losses_measured_directly():
    groups, stats = _layers([1.0, 4.0])
    rank = RankSpec(0.5)
    got, fallbacks = methods.build("svd-llm-v2").site_ranks(groups, stats, rank)
    assert fallbacks == []
    want = {}
    for kind in ("q_proj", "k_proj"):
        info = []
        for g in groups:
            n = next(s for s in g.site_names if s.endswith(kind))
            W = g.sites[g.site_names.index(n)].weight.detach().double().numpy()
            X = np.sqrt(stats[g.name].n_tokens) * np.linalg.cholesky(stats[g.name].C.numpy()).T  # X^T X = N C
            m, d = W.shape
            k0 = round(0.5 * min(m, d))
            L = np.linalg.norm((W - reference_truncation(W, X, k0)) @ X.T)
            info.append((g.name, n, L, m, d, 1 - k0 * (m + d) / (m * d)))
        R = sum(i[5] for i in info) / len(info)
        ell = [1 / math.log(i[2]) for i in info]
        for (gname, n, _, m, d, _), e in zip(info, ell):
            want.setdefault(gname, {})[n] = max(1, min(min(m, d), math.floor((1 - len(info) * R * e / sum(ell))
                                                                         * m * d / (m + d))))
    assert got == want
    # the block that would lose more keeps more: its weights are 4 times larger
    assert got[groups[1].name]["model.layers.1.self_attn.q_proj"] > got[groups[0].name]["model.layers.0.self_attn.q_proj"]


def test_a_loss_of_at_most_one_leaves_the_type_uniform_and_says_so():
    groups, stats = _layers([1.0, 1e-4])
    got, fallbacks = methods.build("svd-llm-v2").site_ranks(groups, stats, RankSpec(0.5))
    assert {k for g in got.values() for k in g.values()} == {5, 3}  # round(0.5 * 10), round(0.5 * 6)
    assert [f["type"] for f in fallbacks] == ["model.layers.#.self_attn.q_proj", "model.layers.#.self_attn.k_proj"]
    assert methods.build("svd-llm-v2:allocate=false").site_ranks(groups, stats, RankSpec(0.5)) is None
    with pytest.raises(ValueError, match="allocate"):
        methods.build("svd-llm-v2:allocate=3")


def test_full_rank_is_dense_without_a_fallback():
    groups, stats = _layers([1.0, 4.0])
    got, fallbacks = methods.build("svd-llm-v2").site_ranks(groups, stats, RankSpec(1.0))
    assert fallbacks == [] and all(k == min(grp.d_in, d) for grp in groups for d, k in zip(grp.d_outs, got[grp.name].values()))
    g = groups[1]
    res = methods.build("svd-llm-v2").compress(g, stats[g.name], RankSpec(1.0), k=got[g.name])
    for n, site in zip(g.site_names, g.sites):
        A, B = res.factors[n]
        assert torch.allclose(A @ B, site.weight, atol=1e-4)


def test_deployed_model_carries_the_allocated_ranks():
    from acbench.calibration.engine import CalibSpec, calibrate
    from acbench.deploy.compression import compressed
    from acbench.model.groups import find_input_groups

    from conftest import tiny_model

    model = tiny_model("llama", hidden=32, inter=48, layers=2)
    groups = find_input_groups(model)
    windows = torch.randint(0, 101, (8, 24), generator=torch.Generator().manual_seed(1))
    stats = calibrate(model, groups, windows, frozenset({"C"}), CalibSpec(), progress=False)
    want, _ = methods.build("svd-llm-v2").site_ranks(groups, stats, RankSpec(0.5))
    with compressed(model, "svd-llm-v2", RankSpec(0.5), stats, progress=False) as (_, summaries):
        assert {s["group"]: s["k_sites"] for s in summaries} == want
    uniform = {g.name: {n: RankSpec(0.5).k_site(g.d_in, d) for n, d in zip(g.site_names, g.d_outs)} for g in groups}
    assert want != uniform  # the allocation moved some rank


def test_full_rank_keeps_the_directions_calibration_never_saw():
    X = _tokens(rank=5)  # 5 directions of 12 carry variance: an expert reached by few tokens
    rng = np.random.default_rng(4)
    W = torch.from_numpy(rng.standard_normal((4, 12))).float()
    res = methods.build("svd-llm-v2").compress(FakeGroup({"s": W}), _stats(X), RankSpec(1.0))
    A, B = res.factors["s"]
    assert torch.allclose(A @ B, W, atol=1e-6)
