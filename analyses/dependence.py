"""The Dependence Violation Score: how far M = E[(x x^T) (x) (g g^T)] is from the K-FAC product C (x) F.

Everything is computed from N x N Gram matrices of the token sample (the "Gram trick"); no d^2 x d^2 matrix
is formed. Cost per group: 2 N^2 d for the Grams + O(N^2), plus 2 N d m for rho_dir over m directions.
"""

from __future__ import annotations

import math

import torch


def rho_scores(xs: torch.Tensor, gs: torch.Tensor, discard: torch.Tensor | None = None, debias: bool = True) -> dict:
    """rho, rho_cos and (given unit discarded directions as columns of `discard`) rho_dir, on N sampled tokens.

    C and F are the sample's own second moments. The plug-in estimate of ||M||_F^2 carries a diagonal term
    (n = m) of order d^2/N relative to the signal, which swamps it at LLM widths; with `debias` every moment
    is a U-statistic over distinct tokens, so rho -> 0 for independent x and g whatever d is.
    """
    X, G = xs.double(), gs.double()
    N = X.shape[0]
    Kx2, Kg2 = (X @ X.T) ** 2, (G @ G.T) ** 2
    if debias:
        Kx2.fill_diagonal_(0)
        Kg2.fill_diagonal_(0)
        pairs = N * (N - 1)
        M_sq = (Kx2 * Kg2).sum() / pairs
        rx, rg = Kx2.sum(1), Kg2.sum(1)
        inner = (rx * rg - (Kx2 * Kg2).sum(1)).sum() / (pairs * (N - 2))
        CF_sq = Kx2.sum() / pairs * Kg2.sum() / pairs
    else:
        M_sq = (Kx2 * Kg2).sum() / N**2  # ||M||_F^2
        inner = (Kx2.sum(1) / N * Kg2.sum(1) / N).mean()  # <M, C (x) F> = mean_n (x_n^T C x_n)(g_n^T F g_n)
        CF_sq = Kx2.sum() / N**2 * Kg2.sum() / N**2  # ||C||_F^2 ||F||_F^2
    if M_sq <= 0:  # the unbiased estimate of a square came out non-positive: too few or too heavy-tailed tokens
        return {"rho": float("nan"), "rho_cos": float("nan"), "n_tokens": N, "debiased": debias,
                "note": "||M||^2 estimate <= 0: increase --pair-tokens"}
    diff_sq = (M_sq - 2 * inner + CF_sq).clamp_min(0)
    out = {
        "rho": float(diff_sq.sqrt() / M_sq.sqrt()),
        "rho_cos": float((1 - inner / (M_sq.sqrt() * CF_sq.sqrt())).clamp(0, 1)),
        "n_tokens": N,
        "debiased": debias,
    }
    if discard is not None and discard.shape[1] > 0:
        out["rho_dir"] = rho_directional(X, G, discard)
    return out


def rho_directional(xs: torch.Tensor, gs: torch.Tensor, directions: torch.Tensor) -> float:
    """Mean over unit directions u (columns) of E[(g^T u)^2 (u^T x)^2] / ((u^T F u)(u^T C u)) - 1."""
    U = directions.double()
    U = U / U.norm(dim=0, keepdim=True)
    px, pg = xs.double() @ U, gs.double() @ U  # (N, m)
    joint = (pg**2 * px**2).mean(0)
    indep = (pg**2).mean(0) * (px**2).mean(0)
    return float((joint / indep.clamp_min(1e-300) - 1).mean())


def rho_explicit(xs: torch.Tensor, gs: torch.Tensor) -> dict:
    """The same rho and rho_cos with M and C (x) F formed explicitly (d^2 x d^2): a reference for small d."""
    X, G = xs.double(), gs.double()
    N = X.shape[0]
    M = sum(torch.kron(torch.outer(x, x), torch.outer(g, g)) for x, g in zip(X, G)) / N
    CF = torch.kron(X.T @ X / N, G.T @ G / N)
    rho = (M - CF).norm() / M.norm()
    cos = 1 - (M * CF).sum() / (M.norm() * CF.norm())
    return {"rho": float(rho), "rho_cos": float(cos)}


def cost_flops(N: int, d: int, m: int) -> int:
    """Multiply-adds of rho_scores: two Gram matrices (N^2 d each) plus the directional projections (2 N d m)."""
    return 2 * N * N * d + 2 * N * d * m


EXACT_MAX_N = 8  # up to 8! = 40,320 orderings: the exact permutation p-value


def exact_pairing_p(x, y) -> float:
    """Two-sided p of Pearson's r over every pairing of y with x (n! of them, all at once): the fraction of pairings
    whose |r| reaches the observed one. On ranks it is Spearman's exact test."""
    import itertools

    import numpy as np

    x, y = np.asarray(x, float), np.asarray(y, float)
    xc = x - x.mean()
    pairings = np.array(list(itertools.permutations(y)))
    pc = pairings - pairings.mean(1, keepdims=True)
    r = (pc @ xc) / (np.linalg.norm(pc, axis=1) * np.linalg.norm(xc))
    observed = float((y - y.mean()) @ xc / (np.linalg.norm(y - y.mean()) * np.linalg.norm(xc)))
    return float(np.mean(np.abs(r) >= abs(observed) - 1e-12))


def correlations(x, y, n_boot: int = 1000, seed: int = 0) -> dict:
    """Spearman and Pearson correlation with p-values (scipy's; exact, over every pairing, up to EXACT_MAX_N
    points) and bootstrap 95% intervals."""
    import numpy as np
    from scipy import stats

    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    out = {"n": int(len(x))}
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return {**out, "spearman": None, "pearson": None, "note": "fewer than 3 points or a constant variable"}
    rng = np.random.default_rng(seed)
    for name, fn in (("spearman", stats.spearmanr), ("pearson", stats.pearsonr)):
        res = fn(x, y)
        p = float(res[1])
        if len(x) <= EXACT_MAX_N:  # the asymptotic p says 0 for a perfect rank order of 4 points; 2 of 24 orders are
            ranked = name == "spearman"
            p = exact_pairing_p(stats.rankdata(x) if ranked else x, stats.rankdata(y) if ranked else y)
        boots = []
        for _ in range(n_boot):
            idx = rng.integers(0, len(x), len(x))
            if np.ptp(x[idx]) > 0 and np.ptp(y[idx]) > 0:
                boots.append(float(fn(x[idx], y[idx])[0]))
        lo, hi = (np.percentile(boots, [2.5, 97.5]).tolist() if boots else (math.nan, math.nan))
        out[name] = {"r": float(res[0]), "p": p, "ci95": [lo, hi]}
    return out
