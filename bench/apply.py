"""Swap a compression into a transformers model in place; the model stays a normal transformers model."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as Fn
from torch import nn

from core.sparsity import sparsify
from methods.base import GroupCompression, MaskedWeights, SparseActivation

CONFIG_KEY = "acbench_compression"


class ReadOnce:
    """What the sites of one group share: a function of their input x computed once per input tensor and handed to
    each of the `n_readers` sites. The cache holds x itself, so its identity cannot be reused by another tensor
    while cached; once every reader has the value it is freed."""

    def __init__(self):
        self._cache: tuple | None = None
        self.n_readers = 1  # sites reading the shared value (set on the owner)
        self._hits = 0
        self.n_computed = 0  # values actually computed (not served from the cache)

    def shared(self, x: torch.Tensor, compute):
        if self._cache is not None and self._cache[0] is x and self._cache[1] == x._version:
            out = self._cache[2]
            self._hits += 1
        else:
            out = compute(x)
            self.n_computed += 1
            self._cache, self._hits = (x, x._version, out), 1
        if self._hits >= self.n_readers:
            self._cache = None
        return out


class LowRankLinear(ReadOnce, nn.Module):
    """y = A (B x) + bias. Sites of one group share the owner's B, and z = B x is computed once per input."""

    def __init__(self, in_features: int, out_features: int, k: int, bias: bool, owner: "LowRankLinear | None" = None,
                 dtype=None, device=None):
        nn.Module.__init__(self)
        ReadOnce.__init__(self)
        self.in_features, self.out_features, self.k = in_features, out_features, k
        self.A = nn.Linear(k, out_features, bias=bias, dtype=dtype, device=device)
        if owner is None:
            self.B = nn.Linear(in_features, k, bias=False, dtype=dtype, device=device)
            owner = self
        # A plain attribute, not a submodule: the shared B is stored once, under the owner.
        object.__setattr__(self, "_owner", owner)

    def project(self, x: torch.Tensor) -> torch.Tensor:
        return self.shared(x, self.B)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.A(self._owner.project(x))

    def extra_repr(self) -> str:
        return f"in={self.in_features}, k={self.k}, out={self.out_features}, shared_B={self._owner is not self}"


class InputSparsifier(ReadOnce, nn.Module):
    """The sparse x of one input group, computed once per input tensor and read by every site of the group (as an
    accelerator reads the sparse activation once)."""

    def __init__(self, result: SparseActivation, dtype, device):
        nn.Module.__init__(self)
        ReadOnce.__init__(self)
        self.n, self.m = result.pattern.topk_args(result.d_in)
        self.mitigation = result.mitigation
        as_buffer = lambda t: None if t is None else t.to(dtype=dtype, device=device)
        self.register_buffer("scale", as_buffer(result.scale))
        self.register_buffer("mu", as_buffer(result.mu))

    def _sparsify(self, x: torch.Tensor):
        return sparsify(x, self.n, self.m, self.scale, self.mitigation, self.mu)

    def forward(self, x: torch.Tensor):
        return self.shared(x, self._sparsify)

    def extra_repr(self) -> str:
        return f"keep {self.n} of {self.m or 'all'}, mitigation={self.mitigation}, readers={self.n_readers}"


class SparseInputLinear(nn.Module):
    """y = W s(x) + b' : the dense site (kept by reference, its weight unchanged) reading the group's sparse x.
    b' = b + W mu for the shift mitigation; a per-token median eta comes back as eta * (W 1)."""

    def __init__(self, dense: nn.Linear, sparsifier: InputSparsifier, owner: bool):
        super().__init__()
        self.dense = dense
        object.__setattr__(self, "_sparsifier", sparsifier)  # read by every site of the group
        if owner:
            self.sparsifier = sparsifier  # and stored (its buffers) once, under the group's first site
        W = dense.weight.detach()
        with torch.no_grad():
            bias = dense.bias.detach().clone() if dense.bias is not None else None
            if sparsifier.mitigation == "shift":
                shift = (W.double() @ sparsifier.mu.double()).to(W.dtype)
                bias = shift if bias is None else bias + shift
            self.register_buffer("bias", bias)
            self.register_buffer("row_sum", W.sum(1) if sparsifier.mitigation == "median" else None)

    @property
    def in_features(self):
        return self.dense.in_features

    @property
    def out_features(self):
        return self.dense.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xs, eta = self._sparsifier(x)
        y = Fn.linear(xs, self.dense.weight, self.bias)
        return y if eta is None else y + eta.unsqueeze(-1) * self.row_sum


def _set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent), child, module)


def _build_modules(model: nn.Module, layout: dict) -> dict[str, nn.Module]:
    """Create empty low-rank modules from a layout {site: {form, k, owner, d_in, d_out, bias}}."""
    built: dict[str, LowRankLinear] = {}
    factorised = [(site, spec) for site, spec in layout.items() if spec["form"] == "factorised"]
    # Owners first: a saved config may list sites in any order.
    for site, spec in sorted(factorised, key=lambda item: item[1]["owner"] != item[0]):
        owner = built[spec["owner"]] if spec["owner"] != site else None
        ref = model.get_submodule(site).weight  # the site's own device (several with --device-map) and dtype
        built[site] = LowRankLinear(spec["d_in"], spec["d_out"], spec["k"], spec["bias"], owner=owner,
                                    dtype=ref.dtype, device=ref.device)
    for site, mod in built.items():
        if mod._owner is not mod:
            mod._owner.n_readers += 1
    for site, mod in built.items():
        _set_module(model, site, mod)
    return built


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
        setattr(model.config, CONFIG_KEY, undo.layouts)
    elif hasattr(model.config, CONFIG_KEY):
        delattr(model.config, CONFIG_KEY)


def _new_undo(model) -> Undo:
    return Undo(layouts=getattr(model.config, CONFIG_KEY, None), had_layouts=hasattr(model.config, CONFIG_KEY))


def _record_layout(model, layout: dict) -> None:
    layouts = dict(getattr(model.config, CONFIG_KEY, None) or {})
    layouts.update(layout)
    setattr(model.config, CONFIG_KEY, layouts)


def apply_compression(model: nn.Module, group, result) -> Undo:
    """Deploy one group's result in place with the handler of its type; `restore(model, undo)` gives back the
    dense model bit for bit (the originals are never modified, only replaced by reference)."""
    for kind, handler in HANDLERS.items():
        if isinstance(result, kind):
            return handler(model, group, result)
    raise TypeError(f"no deployment for a {type(result).__name__} result: register one in bench.apply.HANDLERS")


def _apply_sparse_activation(model: nn.Module, group, result: SparseActivation) -> Undo:
    """Every site of the group wrapped to read one sparse x; the dense modules are kept, unchanged, inside."""
    undo = _new_undo(model)
    ref = group.sites[0].weight
    sparsifier = InputSparsifier(result, ref.dtype, ref.device)
    sparsifier.n_readers = len(group.sites)
    undo.modules = {n: model.get_submodule(n) for n in group.site_names}
    for i, (name, site) in enumerate(zip(group.site_names, group.sites)):
        _set_module(model, name, SparseInputLinear(site, sparsifier, owner=i == 0))
    _record_layout(model, {n: {"form": result.form, "pattern": result.pattern.budget, "density": result.pattern.density,
                               "mitigation": result.mitigation, "owner": group.site_names[0]}
                           for n in group.site_names})
    return undo


def _apply_masked_weights(model: nn.Module, group, result: MaskedWeights) -> Undo:
    """Each site gets a new weight W * mask (dense shape); the original weight is kept by reference."""
    undo = _new_undo(model)
    with torch.no_grad():
        for name, site in zip(group.site_names, group.sites):
            mask = result.masks[name].to(site.weight.device)
            undo.weights.append((site, site.weight))
            site.weight = nn.Parameter(site.weight.detach() * mask.to(site.weight.dtype), requires_grad=False)
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
        built = _build_modules(model, {n: layout[n] for n in group.site_names})
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


# One deployment per result type (as torchao dispatches on a config's type); a new result type adds its handler.
HANDLERS = {GroupCompression: _apply_factors, SparseActivation: _apply_sparse_activation,
            MaskedWeights: _apply_masked_weights}


def load_compressed(path: str | Path, dtype=torch.float32) -> nn.Module:
    """Reload a model saved with save_pretrained after compression (factorised sites included)."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    path = Path(path)
    config = AutoConfig.from_pretrained(path)
    layout = getattr(config, CONFIG_KEY, None) or {}
    sparse = sorted({spec.get("form") for spec in layout.values()} - {"factorised", "merged", "masked-weights"})
    if sparse:
        raise ValueError(f"checkpoint {path} holds a {sparse[0]} layout, which is deployed at run time and not "
                         "saved as modules: compress it again in the sweep")
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    _build_modules(model, layout)
    index = path / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
    state = {}
    for f in files:
        state.update(load_file(path / f))
    missing, unexpected = model.load_state_dict(state, strict=False)
    model.tie_weights()
    tied = {k for k in missing if "lm_head" in k}
    if set(missing) - tied or unexpected:
        raise ValueError(f"checkpoint {path} does not match its compression layout: missing {sorted(set(missing) - tied)[:5]}, "
                         f"unexpected {sorted(unexpected)[:5]}")
    return model.eval()
