"""Swap a compression into a transformers model in place; the model stays a normal transformers model.

The modules deployed live in acbench.core.compressed_layers (the code a saved checkpoint carries); this module turns a
method's typed result into them, records the layout in the config, and puts the dense model back."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from acbench.core.compressed_layers import (LAYOUT_KEY, InputSparsifier, SparseInputLinear, ThresholdedActivation,
                                    build_factorised)
from acbench.core.compressed_layers import set_module as _set_module
from acbench.core.errors import UserError
from acbench.methods.base import ActivationThreshold, GroupCompression, MaskedWeights, SparseActivation

from acbench.model.groups import activation_module

import acbench.deploy.semi_structured as semi_structured

@dataclass
class Undo:
    """What one group's deployment replaced, held by reference (never copied), to put the dense model back."""

    modules: dict[str, nn.Module] = field(default_factory=dict)  # site name -> the original module
    weights: list[tuple[nn.Module, nn.Parameter]] = field(default_factory=list)  # (site, original weight)
    layouts: dict | None = None  # the model's compression layout before
    had_layouts: bool = False


def restore(model: nn.Module, undo: Undo) -> None:
    for name, module in undo.modules.items():
        _set_module(model, name, module)
    for site, weight in undo.weights:
        site.weight = weight
    if undo.had_layouts:
        setattr(model.config, LAYOUT_KEY, undo.layouts)
    elif hasattr(model.config, LAYOUT_KEY):
        delattr(model.config, LAYOUT_KEY)


def swap(model: nn.Module, undo: Undo) -> Undo:
    """restore(model, undo), returning the Undo that puts back what it replaced: a deployed model and its dense
    original trade places by reference, as often as wanted, with nothing rebuilt or copied."""
    redo = Undo(modules={n: model.get_submodule(n) for n in undo.modules},
                weights=[(site, site.weight) for site, _ in undo.weights],
                layouts=getattr(model.config, LAYOUT_KEY, None), had_layouts=hasattr(model.config, LAYOUT_KEY))
    restore(model, undo)
    return redo


def _new_undo(model) -> Undo:
    return Undo(layouts=getattr(model.config, LAYOUT_KEY, None), had_layouts=hasattr(model.config, LAYOUT_KEY))


def _record_layout(model, layout: dict) -> None:
    layouts = dict(getattr(model.config, LAYOUT_KEY, None) or {})
    layouts.update(layout)
    setattr(model.config, LAYOUT_KEY, layouts)


def apply_compression(model: nn.Module, group, result) -> Undo:
    """Deploy one group's result in place with the handler of its type; `restore(model, undo)` gives back the
    dense model bit for bit (the originals are never modified, only replaced by reference)."""
    for kind, handler in HANDLERS.items():
        if isinstance(result, kind):
            return handler(model, group, result)
    raise TypeError(f"no deployment for a {type(result).__name__} result: register one in acbench.deploy.apply.HANDLERS")


_GROUP_SCALE = object()  # sparsifier_for's default: the result's own (group) scale


def sparsifier_for(result: SparseActivation, dtype=None, device=None, scale=_GROUP_SCALE) -> InputSparsifier:
    """The sparsifier of the group's mask, or (`scale` given: a tensor, or None for |x|) of one of its masks."""
    n, m = result.pattern.topk_args(result.d_in)
    return InputSparsifier(n, m, result.mitigation, result.scale if scale is _GROUP_SCALE else scale, result.mu, dtype,
                           device, result.threshold, result.rotation, result.dense_prefix)


def _apply_sparse_activation(model: nn.Module, group, result: SparseActivation) -> Undo:
    """Every site of the group wrapped to read one sparse x; the dense modules are kept, unchanged, inside."""
    undo = _new_undo(model)
    ref = group.sites[0].weight
    undo.modules = {n: model.get_submodule(n) for n in group.site_names}
    sites = dict(zip(group.site_names, group.sites))
    layout = {}
    for readers, scale in result.mask_groups(group.site_names):  # one mask per group, or one per site (WINA)
        sparsifier = sparsifier_for(result, ref.dtype, ref.device, scale)
        sparsifier.n_readers = len(readers)
        shape = {"form": result.form, "pattern": result.pattern.budget, "density": result.pattern.density,
                 "mitigation": result.mitigation, "owner": readers[0], "keep": sparsifier.n, "block": sparsifier.m,
                 "scale": sparsifier.scale is not None, "mu": result.mu is not None,
                 "threshold": result.threshold is not None, "d_in": group.d_in,
                 **({"rotation": True} if result.rotation is not None else {}),
                 **({"dense_prefix": result.dense_prefix} if result.dense_prefix else {})}
        for i, name in enumerate(readers):
            mod = SparseInputLinear(sites[name], sparsifier, owner=i == 0)
            spec = {**shape, "d_out": sites[name].out_features}
            if result.residual_factors and name in result.residual_factors:
                mod.set_residual(*result.residual_factors[name])
                spec["rank"] = int(mod.res_B.shape[0])
            _set_module(model, name, mod)
            layout[name] = spec
    _record_layout(model, {n: layout[n] for n in group.site_names})
    return undo


def _apply_masked_weights(model: nn.Module, group, result: MaskedWeights) -> Undo:
    """Each site gets a new weight W * mask: a semi-structured sparse tensor where sparse tensor cores run it (2:4
    on CUDA), else dense-shaped with zeros. The original is kept by reference."""
    undo = _new_undo(model)
    with torch.no_grad():
        for name, site in zip(group.site_names, group.sites):
            undo.weights.append((site, site.weight))
            weight = semi_structured.deploy_semi_structured(result.deployed_weight(name, site.weight.detach()), result.pattern.n,
                                            result.pattern.m)
            site.weight = nn.Parameter(weight, requires_grad=False)
    _record_layout(model, {n: {"form": result.form, "pattern": result.pattern.budget} for n in group.site_names})
    return undo


def _apply_factors(model: nn.Module, group, result: GroupCompression) -> Undo:
    """Factorised modules, or merged dense weights W_i' = A_i B_i (a merged site gets a new weight tensor)."""
    undo = _new_undo(model)
    layout = {}
    owner = group.site_names[0]
    for name, site in zip(group.site_names, group.sites):
        A, B = result.factors[name]
        layout[name] = {
            "form": result.form, "k": int(A.shape[1]), "d_in": site.in_features, "d_out": site.out_features,
            "bias": site.bias is not None, "owner": owner if result.shared_projection else name,
        }
    if result.form == "merged":
        with torch.no_grad():
            for name, site in zip(group.site_names, group.sites):
                A, B = result.factors[name]
                merged = (A.double() @ B.double()).to(dtype=site.weight.dtype, device=site.weight.device)
                undo.weights.append((site, site.weight))
                site.weight = nn.Parameter(merged, requires_grad=False)
    else:
        biases = {n: s.bias for n, s in zip(group.site_names, group.sites)}
        undo.modules = {n: model.get_submodule(n) for n in group.site_names}
        built = build_factorised(model, {n: layout[n] for n in group.site_names})
        with torch.no_grad():
            for name, mod in built.items():
                A, B = result.factors[name]
                mod.A.weight.copy_(A.to(mod.A.weight.dtype))
                if biases[name] is not None:
                    mod.A.bias.copy_(biases[name])
                if mod._owner is mod:
                    mod.B.weight.copy_(B.to(mod.B.weight.dtype))
    _record_layout(model, layout)
    return undo


def _apply_activation_threshold(model: nn.Module, group, result: ActivationThreshold) -> Undo:
    """CATS: the activation module the group reads wrapped with its threshold; a group that only follows the mask
    (gate and up) or stays dense (attention) keeps its modules, its savings priced in its result alone."""
    undo = _new_undo(model)
    if result.role != "threshold":
        return undo
    found = activation_module(model, group)
    if found is None:
        raise UserError(f"group {group.name}: CATS thresholds the activation function its input is made of, and no "
                        "single activation module sits beside its sites; leave cats out of --methods")
    name, act = found
    undo.modules = {name: act}
    ref = group.sites[0].weight
    _set_module(model, name, ThresholdedActivation(act, result.threshold, ref.device))
    _record_layout(model, {name: {"form": result.form, "d_in": group.d_in}})
    return undo


# One deployment per result type (as torchao dispatches on a config's type); a new result type adds its handler.
HANDLERS = {GroupCompression: _apply_factors, SparseActivation: _apply_sparse_activation,
            MaskedWeights: _apply_masked_weights, ActivationThreshold: _apply_activation_threshold}
