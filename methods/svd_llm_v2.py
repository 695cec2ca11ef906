"""SVD-LLM V2 (Wang et al., NAACL 2025): each weight truncated by two SVDs instead of a Cholesky whitening, and the
ranks of each type of matrix (q_proj of every block, k_proj of every block, ...) reallocated by each matrix's
theoretical truncation loss.

Truncation (the paper's Theorem 3.1): with X X^T = U_s diag(lam) U_s^T, the SVD of D = W U_s diag(lam)^1/2 =
U Sigma V^T gives W' = U_r Sigma_r V_r^T diag(lam)^-1/2 U_s^T, the rank-r W' of least ||W X - W' X||_F; directions
of zero variance are dropped (the pseudo-inverse: D's columns there are zero, so nothing is lost). Deployed as
A = U_r Sigma_r, B = V_r^T diag(lam)^-1/2 U_s^T.

Allocation (the paper's Algorithm 1): per matrix i, its least loss at the run's uniform rank, L_i = sqrt(sum over
the dropped singular values of D^2), with X X^T the sum over the calibration tokens (not their mean: the rule is
not scale-invariant, and the paper's V1 code sums); within each type G, the uniform compression ratio R (the
fraction of parameters removed) becomes R_i = |G| R l_i / sum_j l_j with l_i = 1 / log L_i, so the matrices that
lose more are compressed less, and r_i = floor((1 - R_i) m n / (m + n)) within [1, min(m, n)]. Where some L_i of a
type is at most 1 (its log is not positive: the rule has no answer) that type keeps uniform ranks, and the cell
records it as a fallback."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch

from acbench.core.linalg import NumericError, check_finite, pca_basis, rank_tolerance

from .base import AuthorsCalibration, Compressor, ONE_PASS, basis_ops, site_svd_ops

_BLOCK_INDEX = re.compile(r"\.\d+\.")


@dataclass(frozen=True)
class SVDLLMV2Settings:
    allocate: bool = True  # False: the truncation alone (the paper's "truncation only" ablation)

    def __post_init__(self):
        if not isinstance(self.allocate, bool):
            raise ValueError(f"svd-llm-v2 allocate {self.allocate!r} is not true or false")


def matrix_type(site: str) -> str:
    """The type of a site across blocks: its module name with the block index taken out."""
    return _BLOCK_INDEX.sub(".#.", site, count=1)


def whitened(stats) -> tuple[torch.Tensor, torch.Tensor]:
    """(U_s, lam^1/2) over the directions of non-zero variance of X X^T = n_tokens * C (C's eigenvectors, shared
    with pca through the memo)."""
    sol = pca_basis(stats)
    lam = sol["lam"].clamp_min(0) * max(int(stats.n_tokens), 1)
    keep = lam > lam.max().clamp_min(0) * rank_tolerance(lam.dtype, lam.numel())
    return sol["U"][:, keep], lam[keep].sqrt()


def truncation_loss(W: torch.Tensor, Us: torch.Tensor, root: torch.Tensor, k: int) -> float:
    """The least ||W X - W' X||_F over rank-k W': the norm of D's singular values past the k-th."""
    s = torch.linalg.svdvals((W @ Us) * root[None, :])
    return float(s[k:].pow(2).sum().sqrt())


def allocate_ranks(losses: dict[str, dict]) -> tuple[dict[str, int], list[dict]]:
    """{site: k} from {site: {"type", "loss", "k", "m", "n"}} (the uniform k and its least loss), and the
    fallbacks (a type left uniform, a rank clipped)."""
    ks, fallbacks = {}, []
    by_type: dict[str, list[str]] = {}
    for site, info in losses.items():
        by_type.setdefault(info["type"], []).append(site)
    for kind, sites in by_type.items():
        full = all(losses[s]["k"] >= min(losses[s]["m"], losses[s]["n"]) for s in sites)
        if full or len(sites) == 1 or any(losses[s]["loss"] <= 1.0 for s in sites):
            ks.update({s: losses[s]["k"] for s in sites})  # nothing to move, or no rule to move it by
            if not full and len(sites) > 1:
                fallbacks.append({"fallback": "svd-llm-v2 uniform ranks", "type": kind, "site": sites[0],
                                  "reason": "a least truncation loss <= 1 (1 / log L is undefined)"})
            continue
        ratio = {s: 1 - losses[s]["k"] * (losses[s]["m"] + losses[s]["n"]) / (losses[s]["m"] * losses[s]["n"])
                 for s in sites}
        R = sum(ratio.values()) / len(sites)
        weight = {s: 1.0 / math.log(losses[s]["loss"]) for s in sites}
        total = sum(weight.values())
        for s in sites:
            m, n = losses[s]["m"], losses[s]["n"]
            R_i = len(sites) * R * weight[s] / total
            k = math.floor((1 - R_i) * m * n / (m + n))
            ks[s] = min(max(k, 1), min(m, n))
            if ks[s] != k:
                fallbacks.append({"fallback": "svd-llm-v2 rank clipped", "site": s, "k": k, "clipped_to": ks[s]})
    return ks, fallbacks


class SVDLLMV2(Compressor):
    name = "svd-llm-v2"
    description = ("per weight, truncated SVD of W U diag(lam)^1/2 (X X^T = U diag(lam) U^T) with ranks reallocated "
                   "within each matrix type by 1 / log of the least truncation loss (SVD-LLM V2)")
    needs = frozenset({"C"})
    authors_calibration = AuthorsCalibration(256, 2048, ONE_PASS, "WikiText-2 train windows", "SVD-LLM V2 paper (256 samples), at the window length of V1's code")
    per_site = True
    Settings = SVDLLMV2Settings

    def solve_ops(self, d_in, d_outs, k, pair_tokens):
        # C's eigenvectors, then per site the product W U diag(lam)^1/2 and its SVD (twice with the allocation: the
        # singular values for the losses, the full SVD for the factors)
        svds = site_svd_ops(d_in, d_outs) * (2 if self.settings.allocate else 1)
        return [basis_ops(d_in)["pca_basis"], ("", "flops", 2 * sum(d_outs) * d_in * d_in), *svds]

    def site_ranks(self, groups, stats, rank):
        if not self.settings.allocate:
            return None
        losses, group_of = {}, {}
        for g in groups:
            st = stats.get(g.name)
            check_finite("svd-llm-v2", C=st.C)
            Us, root = whitened(st.on("cpu"))
            for name, site in zip(g.site_names, g.sites):
                W = site.weight.detach().to("cpu", torch.float64)
                k = rank.k_site(g.d_in, site.out_features)
                losses[name] = {"type": matrix_type(name), "loss": truncation_loss(W, Us, root, k), "k": k,
                                "m": site.out_features, "n": g.d_in}
                group_of[name] = g.name
        ks, fallbacks = allocate_ranks(losses)
        out: dict[str, dict[str, int]] = {}
        for site, k in ks.items():
            out.setdefault(group_of[site], {})[site] = k
        return out, fallbacks

    def solve(self, weights, stats, k):
        check_finite("svd-llm-v2", C=stats.C)
        Us, root = whitened(stats)
        if not root.numel():
            raise NumericError("svd-llm-v2: the group's input has no variance (C = 0: it never fired in calibration); "
                               "calibrate on text that reaches it, or leave its kind out with --groups")
        factors = {}
        for n, W in weights.items():
            if k[n] >= min(W.shape):  # nothing truncated: W itself (the pseudo-inverse would drop the directions
                # calibration never saw, which an expert reached by few tokens has)
                factors[n] = (W.clone(), torch.eye(W.shape[1], dtype=W.dtype, device=W.device))
                continue
            U, S, Vh = torch.linalg.svd((W @ Us) * root[None, :], full_matrices=False)
            r = min(k[n], S.numel())
            factors[n] = (U[:, :r] * S[:r], (Vh[:r] / root[None, :]) @ Us.T)
        return factors, False, [], {}
