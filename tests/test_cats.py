"""CATS against its equations written out here: a = SiLU(W_gate x) (Gemma: GELU-tanh), CATS_t(a)_i = a_i * 1[|a_i| > t],
y = W_down (CATS_t(a) * W_up x), with t the magnitude that the target fraction of calibration values |a| lies below.
The statistic (the |a| histogram) is checked against the activations recomputed by hand, the threshold against
the empirical quantile of those values, the deployed MLP against the formula, and the price against the paper's
d h + 2 d h (1 - k) multiply-adds per token."""

import numpy as np
import pytest
import torch

from acbench import methods
from acbench.calibration.engine import CalibSpec, calibrate
from acbench.deploy.compression import compressed
from acbench.model.groups import activation_module, find_input_groups
from acbench.core.errors import UserError
from acbench.core.stats import HIST_BINS, SparsitySpec, magnitude_histogram

from conftest import tiny_model

WINDOWS = torch.randint(0, 101, (4, 16), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def calibrated(request):
    model = tiny_model(request.param, hidden=32, inter=48, layers=1)
    groups = find_input_groups(model)
    return model, groups, calibrate(model, groups, WINDOWS, frozenset({"act_hist"}), CalibSpec(), progress=False)


def gate_activations(model, windows):
    """act(W_gate x) of block 0's MLP over the windows, from the MLP's input and its weights, by hand."""
    mlp = model.model.layers[0].mlp
    seen = []
    h = mlp.register_forward_pre_hook(lambda m, args: seen.append(args[0].detach()))
    with torch.no_grad():
        model(input_ids=windows)
    h.remove()
    x = torch.cat([s.reshape(-1, s.shape[-1]) for s in seen])
    z = x @ mlp.gate_proj.weight.detach().T
    return mlp, x, mlp.act_fn(z) if not hasattr(mlp.act_fn, "act") else mlp.act_fn.act(z)


def test_the_histogram_is_of_the_mlp_activation_and_of_nothing_else(calibrated):
    model, groups, stats = calibrated
    _, _, a = gate_activations(model, WINDOWS)
    want = magnitude_histogram(a.reshape(-1))
    by_kind = {g.kind: stats[g.name].act_hist for g in groups}
    assert torch.allclose(by_kind["mlp_out"], want / want.sum(), atol=1e-12)
    for kind in ("attn_in", "attn_out", "mlp_in"):  # no activation feeds them: an empty histogram
        assert by_kind[kind].shape == (HIST_BINS,) and float(by_kind[kind].abs().sum()) == 0


@pytest.mark.parametrize("density", [0.3, 0.5, 0.7])
def test_the_threshold_is_the_quantile_of_the_calibration_activations(calibrated, density):
    model, groups, stats = calibrated
    _, _, a = gate_activations(model, WINDOWS)
    (down,) = [g for g in groups if g.kind == "mlp_out"]
    res = methods.build("cats").compress(down, stats[down.name], SparsitySpec.parse(str(density)))
    values = np.sort(a.abs().reshape(-1).double().numpy())
    t_ref = values[int(np.ceil((1 - density) * len(values))) - 1]  # min t with F(t) >= 1 - density
    # the histogram's bins are 0.7 % wide in value: the two agree to a bin, and keep the density to 1 %
    assert abs(res.threshold / t_ref - 1) < 0.01
    assert abs(float((a.abs() > res.threshold).double().mean()) - density) < 0.01


@pytest.mark.parametrize("density", ["0.5", "1"])
def test_the_deployed_mlp_is_down_of_the_thresholded_activation_times_up(calibrated, density):
    model, groups, stats = calibrated
    mlp, x, _ = gate_activations(model, WINDOWS[:1])
    Wg, Wu, Wd = (getattr(mlp, n).weight.detach().double() for n in ("gate_proj", "up_proj", "down_proj"))
    act = mlp.act_fn
    dense = mlp(x.unsqueeze(0)).detach().double()
    with compressed(model, "cats", SparsitySpec.parse(density), stats, progress=False) as (m, summaries), \
            torch.no_grad():
        (t,) = [s["threshold"] for s in summaries if s["cats_role"] == "threshold"]
        a = act(x.double() @ Wg.T)
        ref = (torch.where(a.abs() > t, a, 0.0) * (x.double() @ Wu.T)) @ Wd.T
        got = m.model.layers[0].mlp(x.unsqueeze(0)).double()[0]
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-6)
    if density == "1":  # full budget: the threshold keeps every value, the model is dense
        assert torch.allclose(got, dense[0], rtol=1e-5, atol=1e-6)
    else:
        assert not torch.allclose(got, dense[0], rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("density", [0.25, 0.5])
def test_the_price_is_the_papers_mlp_cost(calibrated, density):
    """Per MLP and token, d h (gate) + 2 d h k' (up's kept rows, down's kept columns), k' the density kept;
    attention is priced dense; the results' own ratios say the same."""
    model, groups, stats = calibrated
    cats, pattern = methods.build("cats"), SparsitySpec.parse(str(density))
    d, h = 32, 48
    costs = {g.kind: cats.group_cost(g, pattern) for g in groups}
    assert costs["mlp_in"][0] + costs["mlp_out"][0] == d * h + 2 * d * h * density
    for kind in ("attn_in", "attn_out"):
        g = next(g for g in groups if g.kind == kind)
        assert costs[kind] == (g.d_in * sum(g.d_outs), g.d_in * sum(g.d_outs), 0)
    for g in groups:
        s = cats.compress(g, stats[g.name], pattern).summary()
        assert s["compute_ratio"] * g.d_in * sum(g.d_outs) == pytest.approx(costs[g.kind][0])
        assert s["param_ratio"] == 1.0


def test_the_statistic_is_found_only_beside_an_activation_module():
    model = tiny_model("llama", hidden=32, inter=48, layers=1)
    groups = find_input_groups(model)
    found = {g.kind: activation_module(model, g) for g in groups}
    assert found["mlp_out"][0] == "model.layers.0.mlp.act_fn"
    assert all(found[k] is None for k in ("attn_in", "attn_out", "mlp_in"))
    mlp = model.model.layers[0].mlp
    del mlp.act_fn
    mlp.act_fn = torch.nn.functional.silu  # a plain function: nothing to hook
    (down,) = [g for g in groups if g.kind == "mlp_out"]
    assert activation_module(model, down) is None
    stats = calibrate(model, groups, WINDOWS, frozenset({"act_hist"}), CalibSpec(), progress=False)
    with pytest.raises(UserError, match=r"^group layers\.0\.mlp_out: calibration found no activation module of width "
                                        r"48 beside its sites, so cats has no threshold to set there: this "
                                        r"architecture's MLP is not one cats can threshold; leave cats out of "
                                        r"--methods$"):
        methods.build("cats").compress(down, stats[down.name], SparsitySpec.parse("0.5"))


def test_structured_patterns_are_refused_in_one_line():
    problem = methods.pattern_problem("cats", SparsitySpec.parse("2:4"))
    assert problem and "\n" not in problem and "--sparsity 0.5" in problem


def test_only_the_up_projection_of_an_mlp_input_follows_the_mask(calibrated):
    from acbench.model.groups import InputGroup
    from acbench.methods.cats import follows

    model, groups, stats = calibrated
    (mlp_in,) = [g for g in groups if g.kind == "mlp_in"]
    assert follows(mlp_in) == ("model.layers.0.mlp.up_proj",)
    s = methods.build("cats").compress(mlp_in, stats[mlp_in.name], SparsitySpec.parse("0.5")).summary()
    assert s["cats_role"] == "follows" and s["follows"] == "up_proj"
    other = InputGroup("g", 0, "mlp_out", ("x.up_proj", "x.gate_proj"), mlp_in.sites)
    assert follows(other) == ()  # an up-named site outside an MLP's first group follows nothing
    # a group that carries a threshold follows nothing, whatever its sites are called
    hist = stats[next(g.name for g in groups if g.kind == "mlp_out")]
    res = methods.build("cats").compress(mlp_in, hist, SparsitySpec.parse("0.5"))
    assert res.role == "threshold" and res.follows == () and "follows" not in res.summary()


def test_non_finite_histograms_and_n_m_patterns_are_refused_by_compress(calibrated):
    from acbench.testing import poisoned
    from acbench.core.linalg import NumericError

    model, groups, stats = calibrated
    (down,) = [g for g in groups if g.kind == "mlp_out"]
    with pytest.raises(NumericError, match="^non-finite act_hist statistics in cats: "):
        methods.build("cats").compress(down, poisoned(stats[down.name], "act_hist"), SparsitySpec.parse("0.5"))
    with pytest.raises(ValueError, match="cannot be an N:M pattern"):
        methods.build("cats").compress(down, stats[down.name], SparsitySpec.parse("2:4"))


def test_a_per_group_k_is_refused(calibrated):
    model, groups, stats = calibrated
    with pytest.raises(ValueError, match="a per-group k does not apply"):
        methods.build("cats").compress(groups[0], stats[groups[0].name], SparsitySpec.parse("0.5"), k=3)
