"""Every low-rank method's deployed product A B against its paper's formula, written out here in numpy at a rank
where the formula matters (k < d, non-identity statistics, non-uniform weightings): the plainest form of each, so
a change to a method's formula (a missing square root, a doubled exponent, another matrix's eigenvectors, another
k) fails here. The optimality of pca / whitened-svd / fasc-kfac on their objectives is in test_methods.py."""

import numpy as np
import pytest
import torch

from acbench import methods
from acbench.core.stats import GroupStats, RankSpec

from test_methods import FakeGroup, random_stats

D, K = 10, 4


def _w(d_out=7, d=D, seed=2):
    return torch.randn(d_out, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _product(name, W, st, options=None):
    comp = methods.get_method(name).from_options(options or {})
    res = comp.compress(FakeGroup({"s": W.float()}), st, RankSpec(K / D))
    A, B = res.factors["s"]
    # k < min(d_out, d_in): truncation matters (how a ratio becomes k is test_methods.py's rank semantics)
    assert 0 < res.k < min(W.shape) and (res.k == K or not comp.projection)
    return (A.double() @ B.double()).numpy(), res.k


def _svd_k(M, k):
    U, s, Vt = np.linalg.svd(M, full_matrices=False)
    return U[:, :k] @ np.diag(s[:k]) @ Vt[:k]


def _top_eigvecs(M, k):
    w, V = np.linalg.eigh((M + M.T) / 2)
    return V[:, np.argsort(w)[::-1][:k]]


def _close(got, want, tol=1e-5):
    assert np.linalg.norm(got - want) <= tol * np.linalg.norm(want), np.linalg.norm(got - want) / np.linalg.norm(want)


def test_svd_is_the_truncated_svd():
    W = _w()
    got, k = _product("svd", W, GroupStats())
    _close(got, _svd_k(W.float().double().numpy(), k))


def test_pca_projects_on_the_top_eigenvectors_of_C():
    W, st = _w(), random_stats(D, seed=4)
    V = _top_eigvecs(st.C.numpy(), K)
    _close(_product("pca", W, st)[0], W.float().double().numpy() @ V @ V.T)


def test_espace_nl_projects_on_the_top_eigenvectors_of_CF_plus_FC():
    W, st = _w(), random_stats(D, seed=6)
    C, F = st.C.numpy() / np.trace(st.C.numpy()), st.F.numpy() / np.trace(st.F.numpy())
    V = _top_eigvecs(C @ F + F @ C, K)
    _close(_product("espace-nl", W, st)[0], W.float().double().numpy() @ V @ V.T)


@pytest.mark.parametrize("alpha", [0.5, 1.0])
@pytest.mark.parametrize("scale", [1.0, 1e-4])  # small activations: E|x| < 1, and the 1e-6 guard is felt
def test_asvd_is_the_svd_of_W_scaled_by_mean_abs_x_to_the_alpha(alpha, scale):
    from dataclasses import replace

    W, st = _w(), random_stats(D, seed=8)
    st = replace(st, abs_mean=st.abs_mean * scale)
    s = st.abs_mean.numpy() ** alpha + 1e-6
    assert s.max() / s.min() > 1.5  # a weighting far from uniform, so alpha matters
    got, k = _product("asvd", W, st, {"alpha": alpha})
    _close(got, _svd_k(W.float().double().numpy() * s[None, :], k) / s[None, :])


def test_fwsvd_is_the_svd_of_W_scaled_by_the_root_row_fisher():
    W = _w()
    row = torch.rand(7, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 9 + 0.1
    st = GroupStats(row_fisher={"s": row})
    r = np.sqrt(row.numpy())
    got, k = _product("fwsvd", W, st)
    _close(got, _svd_k(r[:, None] * W.float().double().numpy(), k) / r[:, None])


@pytest.mark.parametrize("seed", [0, 3])
def test_random_projects_on_the_span_of_its_seeded_draw(seed):
    W = _w()
    draw = torch.randn(D, K, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).numpy()
    P = draw @ np.linalg.inv(draw.T @ draw) @ draw.T  # the orthogonal projector on span(draw), by its formula
    _close(_product("random", W, GroupStats(), {"seed": seed})[0], W.float().double().numpy() @ P)
