"""Each method against the objective it claims to minimise, on the statistics it was solved from (in sample),
where the inequality holds by construction: a method that loses on its own objective is a bug, not a finding.
The same objectives measured on held-out tokens of the real models are studies/objectives.py's (docs/objectives.md).

- whitened SVD (SVD-LLM) minimises the output error E||(W - W')x||^2: per site below SVD and ASVD at the same k,
  with one shared subspace below PCA, fasc-kfac and a random subspace; SVD-LLM V2's truncation reaches the same
  least error;
- PCA minimises the input error E||x - Px||^2 among rank-k projections;
- fasc-kfac minimises the K-FAC surrogate tr((I - P)^T F (I - P) C), fasc the per-token surrogate
  E[(g^T (I - P) x)^2] on its token sample (below fasc-kfac's there);
- Wanda keeps, per output row, the weights of largest W_ij^2 C_jj (the diagonal output error), magnitude pruning
  those of largest W_ij^2;
- SVD-LLM V2's allocation is its Algorithm 1, with weights 1 / log L (pinned where 1 / L would differ).
"""

import math

import pytest
import torch

from acbench import methods
from conftest import calibrated_tiny
from acbench.core.stats import RankSpec, SparsitySpec
from acbench.model.groups import find_input_groups
from acbench.studies import objectives as study
from acbench.studies.objectives import input_error, kfac_surrogate, output_error, weights

RANK = RankSpec(0.5)


@pytest.fixture(scope="module")
def calibrated():
    """A tiny random Llama (hidden 48, MLP 64, 2 blocks) and every statistic of its groups from 6 x 32 tokens."""
    model, stats = calibrated_tiny(windows=6, seq_len=32, pair_tokens=96)
    return find_input_groups(model), stats


def solved(name, group, stats, rank=RANK):
    return methods.build(name).compress(group, stats[group.name], rank)


def projection(group, res) -> torch.Tensor:
    return study.projection(group, study.deployed(group, res))


def wide(groups):
    """The groups whose stacked outputs outnumber their inputs (so P is recoverable): attention's q/k/v and the MLP's
    gate/up."""
    return [g for g in groups if sum(g.d_outs) > g.d_in]


def test_whitened_svd_has_the_least_output_error_per_site(calibrated):
    groups, stats = calibrated
    for g in groups:
        C = stats[g.name].C
        best = output_error(g, C, study.deployed(g, solved("whitened-svd:per_site=true", g, stats)))
        for rival in ("svd", "asvd"):
            other = output_error(g, C, study.deployed(g, solved(rival, g, stats)))
            assert best < other * (1 - 1e-3), (g.name, rival, best, other)
        # SVD-LLM V2's truncation (without its reallocation) is the same least error by another factorisation
        v2 = output_error(g, C, study.deployed(g, solved("svd-llm-v2:allocate=false", g, stats)))
        assert v2 == pytest.approx(best, rel=1e-6), g.name


def test_whitened_svd_has_the_least_output_error_of_the_shared_subspaces(calibrated):
    groups, stats = calibrated
    for g in groups:
        C = stats[g.name].C
        best = output_error(g, C, study.deployed(g, solved("whitened-svd", g, stats)))
        for rival in ("pca", "fasc-kfac", "random"):
            assert best < output_error(g, C, study.deployed(g, solved(rival, g, stats))) * (1 - 1e-3), (g.name, rival)


def test_pca_has_the_least_input_error(calibrated):
    groups, stats = calibrated
    for g in wide(groups):
        C = stats[g.name].C
        best = input_error(projection(g, solved("pca", g, stats)), C)
        for rival in ("whitened-svd", "fasc-kfac", "random"):
            assert best < input_error(projection(g, solved(rival, g, stats)), C) * (1 - 1e-3), (g.name, rival)


def test_fasc_kfac_has_the_least_kfac_surrogate_and_records_it(calibrated):
    groups, stats = calibrated
    for g in wide(groups):
        C, F = stats[g.name].C, stats[g.name].F
        res = solved("fasc-kfac", g, stats)
        best = kfac_surrogate(projection(g, res), C, F)
        assert res.extras["surrogate_kfac"] == pytest.approx(best, rel=1e-4)  # factors stored in float32
        for rival in ("pca", "whitened-svd", "random"):
            assert best < kfac_surrogate(projection(g, solved(rival, g, stats)), C, F) * (1 - 1e-3), (g.name, rival)


def test_fasc_lowers_the_per_token_surrogate_on_its_sample(calibrated):
    """fasc swaps directions only where they lower E[(g^T (I - P) x)^2] on its (x, g) sample: never above
    fasc-kfac's there, and below it where it swapped."""
    groups, stats = calibrated
    swapped = 0
    for g in wide(groups):
        st = stats[g.name]
        x, gr = st.xs.double(), st.gs.double()

        def per_token(name):
            P = projection(g, solved(name, g, stats))
            return float(((gr @ (torch.eye(P.shape[0], dtype=P.dtype) - P)) * x).sum(1).pow(2).mean())

        res = solved("fasc:folds=1", g, stats)
        mine, kfac = per_token("fasc:folds=1"), per_token("fasc-kfac")
        assert mine <= kfac * (1 + 1e-9), g.name
        if res.extras["swaps_in_sample"]:
            swapped += 1
            assert mine < kfac, g.name
    assert swapped  # the check above was reached


def _pruned_sums(group, res, C):
    """(sum of W_ij^2 C_jj, sum of W_ij^2) over the weights a mask prunes, per site."""
    out = {}
    for n, W in weights(group).items():
        off = ~res.masks[n].bool()
        out[n] = (float((W.pow(2) * torch.diagonal(C)[None, :])[off].sum()), float(W.pow(2)[off].sum()))
    return out


@pytest.mark.parametrize("pattern", ["0.5", "2:4"])
def test_wanda_and_magnitude_each_prune_the_least_of_their_own_score(calibrated, pattern):
    groups, stats = calibrated
    p = SparsitySpec.parse(pattern)
    for g in groups:
        C = stats[g.name].C
        wanda = _pruned_sums(g, methods.build("wanda").compress(g, stats[g.name], p), C)
        magnitude = _pruned_sums(g, methods.build("magnitude-prune").compress(g, stats[g.name], p), C)
        for n, W in weights(g).items():
            assert wanda[n][0] < magnitude[n][0], (g.name, n)  # the diagonal output error
            assert magnitude[n][1] < wanda[n][1], (g.name, n)  # the weights' own energy
            # and each is the least its pattern allows: per row (and per M inputs), the smallest scores pruned
            for score, got in ((W.pow(2) * torch.diagonal(C)[None, :], wanda[n][0]), (W.pow(2), magnitude[n][1])):
                keep, m = p.topk_args(W.shape[1])
                blocks = score.reshape(W.shape[0], -1, m) if m else score[:, None, :]
                per = blocks.shape[-1] - keep
                least = float(blocks.sort(-1).values[..., :per].sum())
                assert got == pytest.approx(least, rel=1e-9), (g.name, n)


def _site(kind, loss, m=16, n=16, k=4):
    return {"type": kind, "loss": loss, "k": k, "m": m, "n": n}


def test_svd_llm_v2_allocation_weighs_by_one_over_log_loss():
    """Algorithm 1 by hand, at losses where 1 / log L and 1 / L give other ranks: three 16 x 16 weights at ratio 0.5
    (k = 4), L = e, e^2, e^3, so l = 1, 1/2, 1/3 and R_i = 3 (0.5) l_i / (11/6) = 9/11, 9/22, 3/11; r_i =
    floor((1 - R_i) 8) = 1, 4, 5 (1 / L would give 1, 5, 6)."""
    from acbench.methods.svd_llm_v2 import allocate_ranks as allocate

    ks, fallbacks = allocate({f"b.{i}.q": _site("b.#.q", math.e ** (i + 1)) for i in range(3)})
    assert ks == {"b.0.q": 1, "b.1.q": 4, "b.2.q": 5}
    assert fallbacks == []
    # the parameters it moves stay within the type's budget (floors only round down)
    assert sum(k * 32 for k in ks.values()) <= 3 * 4 * 32
