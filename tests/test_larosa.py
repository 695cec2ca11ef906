"""LaRoSa against its paper's forward pass written out here: z = x Q with Q the eigenvectors of the damped input
second moment (numpy, H = X^T X + 0.01 mean(diag) I), the top-k of |z| per token with k = floor((1 - 0.8 s) d) at
the q/k/v and gate/up inputs, x~ = (mask * z) Q^T through the dense weights; a plain top-k at o/down with 1.2 s. The
deployed sites of a tiny model are compared with it on a prefill (masked product) and a decode step (gathered)."""

import numpy as np
import pytest
import torch

from acbench import methods
from acbench.calibration.engine import CalibSpec, calibrate
from acbench.deploy.compression import compressed
from acbench.model.groups import find_input_groups
from acbench.core.stats import SparsitySpec

from conftest import tiny_model


def reference_site(x, W, b, X, keep_fraction, rotate):
    """One token x through one site of the dense model, per the paper: y = W x~ + b."""
    if rotate:
        H = X.T @ X
        H = H + 0.01 * np.mean(np.diag(H)) * np.eye(len(H))
        _, Q = np.linalg.eigh(H)
    else:
        Q = np.eye(len(x))
    z = x @ Q
    k = max(1, round(keep_fraction * len(x)))
    kept = np.zeros_like(z)
    top = np.argsort(-np.abs(z), kind="stable")[:k]
    kept[top] = z[top]
    return W @ (kept @ Q.T) + (0.0 if b is None else b)


@pytest.fixture(scope="module")
def calibrated():
    model = tiny_model("llama", hidden=32, inter=48, layers=1)
    windows = torch.randint(0, 101, (8, 24), generator=torch.Generator().manual_seed(1))
    groups = find_input_groups(model)
    inputs = {}
    hooks = [g.sites[0].register_forward_pre_hook(lambda m, a, name=g.name: inputs.setdefault(name, []).append(
        a[0].detach().reshape(-1, a[0].shape[-1]).double())) for g in groups]
    with torch.no_grad():
        model(windows)
    for h in hooks:
        h.remove()
    stats = calibrate(model, groups, windows, frozenset({"C"}), CalibSpec(), progress=False)
    return model, groups, stats, {n: torch.cat(v).numpy() for n, v in inputs.items()}


@pytest.mark.parametrize("density", [0.5, 0.75])
def test_deployed_sites_equal_the_paper_forward(calibrated, density):
    model, groups, stats, X = calibrated
    s = 1 - density
    gen = torch.Generator().manual_seed(7)
    checked = set()
    with compressed(model, "larosa", SparsitySpec(density=density), stats, progress=False) as (m, summaries):
        for g in groups:
            rotate = g.kind in ("attn_in", "mlp_in")
            keep = 1 - (0.8 if rotate else 1.2) * s
            x = torch.randn(3, g.d_in, generator=gen)
            for name, dense in zip(g.site_names, g.sites):  # the dense modules, kept by reference
                site = m.get_submodule(name)
                W = dense.weight.detach().double().numpy()
                want = np.stack([reference_site(x[i].double().numpy(), W, None, X[g.name], keep, rotate)
                                 for i in range(3)])
                with torch.no_grad():
                    prefill = site(x.unsqueeze(0)).squeeze(0)  # three tokens at once: the masked product
                    decode = torch.cat([site(x[i:i + 1]) for i in range(3)])  # one at a time: gathered
                for got in (prefill, decode):
                    assert np.allclose(got.double().numpy(), want, rtol=1e-4, atol=1e-4), (g.name, name)
                checked.add(g.kind)
        by_kind = {s_["group"]: s_ for s_ in summaries}
        g = next(g for g in groups if g.kind == "attn_in")
        d, out = g.d_in, sum(g.d_outs)
        kept = max(1, round((1 - 0.8 * s) * d)) / d
        assert by_kind[g.name]["compute_ratio"] == pytest.approx(kept + d * d / (d * out))
        assert by_kind[g.name]["param_ratio"] == pytest.approx(1 + d * d / (d * out))
    assert checked == {"attn_in", "attn_out", "mlp_in", "mlp_out"}


def test_full_density_is_dense_and_unrotated(calibrated):
    model, groups, stats, _ = calibrated
    ids = torch.randint(0, 101, (1, 10), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = model(ids).logits
        with compressed(model, "larosa", SparsitySpec(density=1.0), stats, progress=False) as (m, summaries):
            got = m(ids).logits
    assert torch.allclose(got, want, atol=1e-5) and not any(s.get("rotated") for s in summaries)


def test_patterns_and_settings_are_refused_in_one_line():
    assert "density" in methods.pattern_problem("larosa", SparsitySpec.parse("2:4"))
    assert methods.pattern_problem("larosa", SparsitySpec.parse("0.5")) is None
    for bad in ("in_factor=0", "out_factor=-1", "in_factor=nan", "out_factor=true", "in_factor=11"):
        with pytest.raises(ValueError, match="larosa"):
            methods.build(f"larosa:{bad}")


def test_plan_prices_the_rotation_and_the_split():
    from pathlib import Path

    from acbench.measure.costs import estimate_costs as make_plan

    comp = methods.build("larosa")
    p = SparsitySpec(density=0.5)
    assert comp.group_pattern("attn_in", p)[0].density == pytest.approx(0.6) and comp.group_pattern("attn_in", p)[1]
    assert comp.group_pattern("mlp_out", p) == (SparsitySpec(density=pytest.approx(0.4)), False)
    assert comp.group_pattern("attn_mid", p) == (p, False)
    assert methods.build("act-sparse").group_pattern("attn_in", p) == (p, False)
    # Llama-3-8B's block: attn_in 4096 -> q 4096, k 1024, v 1024; attn_out 4096 -> 4096; mlp_in 4096 -> 2 x 14336;
    # mlp_out 14336 -> 4096. Rotated: attn_in, mlp_in keep 0.6 and pay 4096^2 each; attn_out, mlp_out keep 0.4.
    plan = make_plan(str(Path(__file__).parent / "fixtures" / "configs" / "llama-3-8b"), ["larosa"], [0.5],
                     sparsity=[p])
    d, f = 4096, 14336
    dense = d * 6144 + d * d + d * 2 * f + f * d
    kept = round(0.6 * d) * 6144 + round(0.4 * d) * d + round(0.6 * d) * 2 * f + round(0.4 * f) * d + 2 * d * d
    got = plan.sparse["larosa"]["unstructured 0.5"]
    assert got["compute_ratio"] == pytest.approx(kept / dense) and got["param_ratio"] == pytest.approx(1 + 2 * d * d / dense)
