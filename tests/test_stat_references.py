"""The calibration statistics against a direct computation on a tiny model: C = X^T X / n, E|x|, E[x] from the
captured group inputs, and the row Fisher as the sum over calibration batches of each batch's squared weight
gradient, row-summed, by autograd. (F and the (x, g) pairs: test_methods.py; the |x| histogram: test_speed.py.)"""

import torch

from acbench.calibration.engine import CalibSpec, calibrate, next_token_loss_sum
from acbench.model.groups import find_input_groups

from conftest import tiny_model


def test_first_and_second_moments_and_row_fisher_equal_direct_computation(windows):
    model = tiny_model("llama", hidden=32, inter=48, layers=2)
    groups = find_input_groups(model)
    g = next(g for g in groups if g.name == "layers.1.mlp_in")
    stats = calibrate(model, groups, windows, frozenset({"C", "abs_mean", "mean", "row_fisher"}), CalibSpec(),
                      batch_size=3, progress=False)[g.name]

    xs = []
    hook = g.sites[0].register_forward_pre_hook(lambda m, a: xs.append(a[0].detach().reshape(-1, g.d_in).double()))
    rows = {n: torch.zeros(s.out_features, dtype=torch.float64) for n, s in zip(g.site_names, g.sites)}
    for p in model.parameters():
        p.requires_grad_(False)
    for start in range(0, len(windows), 3):  # the calibration's batches: 3, 3, 2 windows
        ids = windows[start:start + 3]
        for s in g.sites:
            s.weight.requires_grad_(True)
        loss = next_token_loss_sum(model(input_ids=ids, use_cache=False).logits, ids)
        grads = torch.autograd.grad(loss, [s.weight for s in g.sites])
        for n, gr in zip(g.site_names, grads):
            rows[n] += (gr.double() ** 2).sum(1)
        for s in g.sites:
            s.weight.requires_grad_(False)
    hook.remove()
    X = torch.cat(xs)
    assert stats.n_tokens == X.shape[0] == windows.numel()

    def close(a, b, tol=1e-5):
        assert (a - b).abs().max() <= tol * b.abs().max(), float((a - b).abs().max() / b.abs().max())

    close(stats.C, X.T @ X / X.shape[0])
    close(stats.abs_mean, X.abs().mean(0))
    close(stats.mean, X.mean(0))
    assert X.mean(0).abs().max() > 1e-3  # a mean that is not zero, so a dropped or doubled sum shows
    for n in g.site_names:
        close(stats.row_fisher[n], rows[n], 1e-4)


def test_row_fisher_holds_one_weight_gradient_at_a_time(windows):
    """Each site's weight gradient is read and dropped as it lands: when autograd computes the next one, no other
    site still holds its gradient (held to the end of the backward, all of them were alive at once)."""
    model = tiny_model("llama", hidden=32, inter=48, layers=2)
    groups = find_input_groups(model)
    sites = [s for g in groups for s in g.sites]
    alive = []
    for s in sites:
        s.weight.requires_grad_(True)  # a hook needs it; calibrate sets and restores the flags itself
        s.weight.register_hook(lambda g, me=s.weight: alive.append(
            sum(o.weight.grad is not None for o in sites if o.weight is not me)))
    stats = calibrate(model, groups, windows, frozenset({"row_fisher"}), CalibSpec(), batch_size=3, progress=False)
    assert len(alive) == 3 * len(sites)  # every site, every batch (3, 3, 2 windows)
    assert max(alive) == 0
    assert all(s.weight.grad is None for s in sites)
    assert all(float(stats[g.name].row_fisher[n].sum()) > 0 for g in groups for n in g.site_names)
