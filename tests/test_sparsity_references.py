"""Activation sparsity against a brute force written out here: per token and per block, the channels with the
highest score (each score by its formula: |x|, |x| times the stacked column norm (wina), times the standardised
column norm over its minimum (amber), times sqrt(F_jj) (fisher)), after each mitigation's centring (the calibrated
mean, the token's median), the kept energy restored (variance), and what was moved out of x added back as W mu or
median W 1. The deployed sites of a tiny model are compared with it on a prefill (masked product) and on a
one-token decode step (gathered product), at non-identity F, non-zero mean and inputs without ties."""

import itertools

import numpy as np
import pytest
import torch

from acbench.calibration.engine import CalibSpec, calibrate
from acbench.deploy.compression import compressed
from acbench.model.groups import find_input_groups
from acbench.core.stats import SparsitySpec

from conftest import tiny_model

SCORES = ["abs", "wina", "amber", "fisher"]
MITIGATIONS = ["none", "variance", "shift", "median"]


def _scale(score, Ws, F):
    """Per input channel, the factor the score multiplies |x| by, from the formulas."""
    stacked = np.concatenate(Ws)
    d = stacked.shape[1]
    if score == "abs":
        return np.ones(d)
    if score == "wina":
        return np.array([np.sqrt(sum(stacked[i, j] ** 2 for i in range(stacked.shape[0]))) for j in range(d)])
    if score == "amber":
        z = (stacked - stacked.mean(1, keepdims=True)) / stacked.std(1, ddof=1, keepdims=True)
        norms = np.sqrt((z ** 2).sum(0))
        return norms / norms.min()
    return np.sqrt(np.diag(F))


def _brute(x, W, b, n, m, scale, mitigation, mu):
    """One token x (d,) through one site: W s(x) + b, by loops."""
    d = x.size
    shift = mu if mitigation == "shift" else (np.median(x) if mitigation == "median" else 0.0)
    if mitigation == "median":  # torch's median of an even count is the lower middle value
        shift = np.sort(x)[(d - 1) // 2]
    c = x - shift
    kept = np.zeros(d)
    block = m or d
    for start in range(0, d, block):
        idx = range(start, start + block)
        order = sorted(idx, key=lambda j: -abs(c[j]) * scale[j])
        for j in order[:n]:
            kept[j] = c[j]
    if mitigation == "variance" and (kept ** 2).sum() > 0:
        kept = kept * np.sqrt((c ** 2).sum() / (kept ** 2).sum())
    y = W @ kept + (W @ (shift * np.ones(d)) if mitigation in ("shift", "median") else 0.0)
    return y + (b if b is not None else 0.0)


@pytest.fixture(scope="module")
def calibrated():
    model = tiny_model("llama", hidden=32, inter=48, layers=1)
    windows = torch.randint(0, 101, (8, 24), generator=torch.Generator().manual_seed(1))
    groups = find_input_groups(model)
    stats = calibrate(model, groups, windows, frozenset({"F", "mean", "C"}), CalibSpec(), progress=False)
    return model, groups, stats


@pytest.mark.parametrize("score,mitigation,pattern", list(itertools.product(SCORES, MITIGATIONS, ["2:4", "0.25"])))
def test_deployed_sites_equal_the_brute_force(calibrated, score, mitigation, pattern):
    model, groups, stats = calibrated
    g = next(g for g in groups if g.name.endswith("mlp_in"))  # two sites (gate, up): wina/amber stack them
    Ws = [s.weight.detach().double().numpy() for s in g.sites]
    bs = [None if s.bias is None else s.bias.detach().double().numpy() for s in g.sites]
    st = stats[g.name]
    F, mu = st.F.numpy(), st.mean.numpy()
    assert np.abs(F - np.diag(np.diag(F))).max() > 0 and np.abs(mu).max() > 0  # not the identity, not centred
    spec = SparsitySpec.parse(pattern)
    n, m = spec.topk_args(g.d_in)
    scale = _scale(score, Ws, F)
    gen = torch.Generator().manual_seed(7)
    method = f"act-sparse:score={score},mitigation={mitigation}"
    with compressed(model, method, spec, stats, only_groups={g.name}, progress=False):
        sites = [dict(model.named_modules())[name] for name in g.site_names]
        for tokens in (5, 1):  # prefill: the masked product; one token: the gathered one
            x = torch.randn(1, tokens, g.d_in, generator=gen) * 2 + 0.3
            with torch.no_grad():
                got = [s(x)[0].double().numpy() for s in sites]
            for W, b, y in zip(Ws, bs, got):
                want = np.stack([_brute(x[0, t].double().numpy(), W, b, n, m, scale, mitigation, mu)
                                 for t in range(tokens)])
                assert np.abs(y - want).max() <= 1e-4 * np.abs(want).max(), (tokens, np.abs(y - want).max())


# ---------------------------------------------------------------- the tensor functions on their own

from acbench.core.sparsity import _block_starts, keep_top, sparse_input, sparsify, top_indices, topk_mask  # noqa: E402


@pytest.mark.parametrize("n,m", [(2, 4), (3, 8), (5, 0)])
@pytest.mark.parametrize("mitigation", ["none", "variance", "median", "shift"])
@pytest.mark.parametrize("scale", [1.0, 0.01])  # 0.01: tokens whose energy is below 1 are rescaled too
def test_gathered_form_equals_the_masked_form_on_batched_inputs(n, m, mitigation, scale):
    """(batch, tokens, d) inputs, as the masked form sees them and as the gathered form would: scattering the
    gathered values back gives the masked x, token by token, and the per-token medians agree in shape and value."""
    gen = torch.Generator().manual_seed(n + m)
    x = (torch.randn(2, 3, 16, generator=gen) * 2 + 0.3) * scale
    mu = torch.randn(16, generator=gen) * scale if mitigation == "shift" else None
    w = torch.rand(16, generator=gen) + 0.5
    xs, eta = sparsify(x, n, m, w, mitigation, mu)
    idx, vals, eta_g = sparse_input(x, n, m, w, mitigation, mu)
    assert idx.shape == vals.shape == (2, 3, n * 16 // m if m else n)
    back = torch.zeros_like(x).scatter_(-1, idx, vals)
    assert torch.allclose(back, xs, rtol=1e-6, atol=1e-9)
    if mitigation == "median":
        assert eta.shape == eta_g.shape == (2, 3) and torch.equal(eta, eta_g)
    else:
        assert eta is None and eta_g is None
    if mitigation == "variance":  # every token keeps its full energy, also below 1
        c = x
        assert torch.allclose(xs.pow(2).sum(-1), c.pow(2).sum(-1), rtol=1e-5)


def test_masks_are_boolean_and_the_default_block_is_the_whole_row():
    score = torch.rand(3, 8, generator=torch.Generator().manual_seed(0))
    mask = topk_mask(score, 2)
    assert mask.dtype == torch.bool and torch.equal(mask, topk_mask(score, 2, 0))
    assert mask.sum(-1).tolist() == [2, 2, 2]
    assert torch.equal(keep_top(score, score, 2), keep_top(score, score, 2, 0))
    assert torch.equal(top_indices(score, 2).sort(-1).values, top_indices(score, 2, 0).sort(-1).values)
    assert topk_mask(score, 1, 4).dtype == torch.bool


def test_block_starts_are_kept_per_device():
    cpu = _block_starts(8, 4, torch.device("cpu"))
    meta = _block_starts(8, 4, torch.device("meta"))
    assert cpu.device.type == "cpu" and meta.device.type == "meta" and meta.shape == (2, 1)
    assert cpu.reshape(-1).tolist() == [0, 4]


@pytest.mark.parametrize("density", [0.2, 0.3, 0.7, 0.9])
def test_teal_keeps_the_density_asked_not_its_complement(density):
    """TEAL's threshold at densities other than 0.5 (where d and 1 - d coincide): on 20,000 calibration magnitudes
    spread log-uniformly over four decades, the share of them above the threshold is the density asked, to within
    the histogram's bin width, and a fresh draw of the same distribution keeps it at run time."""
    from acbench import methods
    from acbench.testing import FakeGroup
    from acbench.core.stats import GroupStats, SparsitySpec, magnitude_histogram

    gen = torch.Generator().manual_seed(int(density * 100))
    x = 10.0 ** (4 * torch.rand(20000, generator=gen, dtype=torch.float64) - 2)
    stats = GroupStats(n_tokens=20000, abs_hist=magnitude_histogram(x))
    res = methods.build("teal").compress(FakeGroup({"a": torch.ones(3, 8)}), stats, SparsitySpec.parse(str(density)))
    above = float((x > res.threshold).double().mean())
    assert above == pytest.approx(density, abs=0.002)
    fresh = 10.0 ** (4 * torch.rand(20000, generator=gen, dtype=torch.float64) - 2)
    assert float((fresh > res.threshold).double().mean()) == pytest.approx(density, abs=0.015)
