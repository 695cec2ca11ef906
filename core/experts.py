"""A mixture-of-experts layer whose experts are fused 3-D parameters, seen as one nn.Linear per expert and projection.

transformers stores most experts stacked (`gate_up_proj` [E, 2I, H] or transposed, `down_proj` [E, H, I], optional
biases), behind the `use_experts_implementation` decorator, which also declares the layout (transposed, interleaved
gate and up, biases, gated or not, a norm after each expert). Rather than teach every method, the calibration hooks
and the deployment a second weight layout, such a module is swapped for `SplitExperts`: per expert, an
`ExpertMLP` whose sites are nn.Linear views of that expert's slices of the same storage (no copy), run in the
eager implementation's order, so that each expert's hooks see only the tokens routed to it. Its state dict keeps
the fused layout while every site is dense (a checkpoint saved from it loads in plain transformers) and is per
expert once a site is replaced. This file imports torch only: compressed checkpoints carry a copy of it.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

FLAGS = ("has_gate", "has_bias", "is_transposed", "is_concatenated", "has_post_expert_norm")
IN_SITE = {True: "gate_up", False: "up"}  # named apart from transformers' per-expert keys, which load converts


def is_fused_experts(module: nn.Module) -> bool:
    """A module transformers' experts decorator describes (its layout flags set), holding 3-D expert weights."""
    return all(hasattr(module, f) for f in FLAGS) and isinstance(getattr(module, "down_proj", None), torch.Tensor) \
        and module.down_proj.dim() == 3


class ExpertSite(nn.Linear):
    """One expert's projection: an nn.Linear whose weight (and bias) are views of the fused parameters' slices."""

    @classmethod
    def view_of(cls, weight: torch.Tensor, bias: torch.Tensor | None) -> "ExpertSite":
        site = cls.__new__(cls)
        nn.Module.__init__(site)
        site.out_features, site.in_features = int(weight.shape[0]), int(weight.shape[1])
        site.weight = nn.Parameter(weight, requires_grad=weight.requires_grad)
        site.bias = None if bias is None else nn.Parameter(bias, requires_grad=bias.requires_grad)
        return site


class ExpertMLP(nn.Module):
    """One expert: its input projection (gate and up fused, or up alone), its activation, its down projection."""

    def __init__(self, first: nn.Linear, act: nn.Module, down: nn.Linear, gated: bool):
        super().__init__()
        setattr(self, IN_SITE[gated], first)
        self.act_fn = act
        self.down = down


class SplitExperts(nn.Module):
    """A fused experts module's computation, one ExpertMLP per expert (children "0", "1", ...)."""

    def __init__(self, fused: nn.Module):
        super().__init__()
        for f in FLAGS:
            setattr(self, f, bool(getattr(fused, f)))
        # a custom gate (GPT-OSS's clamped, interleaved one) reads the fused module's own settings
        self._gate = None if _default_gate(type(fused)) else type(fused)._apply_gate
        for key, value in vars(fused).items():
            if not key.startswith("_") and isinstance(value, (bool, int, float, str)) and key not in FLAGS:
                setattr(self, key, value)
        self.act_fn = fused.act_fn if isinstance(getattr(fused, "act_fn", None), nn.Module) else None
        if self.has_post_expert_norm:
            self.post_expert_norm = fused.post_expert_norm
        first_name = "gate_up_proj" if self.has_gate else "up_proj"
        first, down = getattr(fused, first_name), fused.down_proj
        self.num_experts = int(down.shape[0])
        self._fused_names = (first_name, "down_proj")
        for e in range(self.num_experts):
            sites = []
            for name, w in ((first_name, first), ("down_proj", down)):
                b = getattr(fused, f"{name}_bias", None) if self.has_bias else None
                weight = w[e].t() if self.is_transposed else w[e]
                sites.append(ExpertSite.view_of(weight.detach(), None if b is None else b[e].detach()))
            act = copy.deepcopy(fused.act_fn) if self.act_fn is not None else nn.Identity()
            self.add_module(str(e), ExpertMLP(sites[0], act, sites[1], self.has_gate))
        self._register_state_dict_hook(_fuse_on_save)
        self._register_load_state_dict_pre_hook(_split_on_load, with_module=True)

    def expert(self, e: int) -> ExpertMLP:
        return self._modules[str(e)]

    def _inner(self, expert: ExpertMLP, x: torch.Tensor) -> torch.Tensor:
        h = getattr(expert, IN_SITE[self.has_gate])(x)
        if not self.has_gate:
            h = expert.act_fn(h)
        elif self._gate is not None:
            h = self._gate(self, h)
        else:
            gate, up = h.chunk(2, dim=-1)
            h = expert.act_fn(gate) * up
        h = expert.down(h)
        return self.post_expert_norm(h) if self.has_post_expert_norm else h

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(hidden_states)
        with torch.no_grad():
            mask = nn.functional.one_hot(top_k_index, num_classes=self.num_experts + 1).permute(2, 1, 0)
            hit = set(torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()[:, 0].tolist())
        for e in range(self.num_experts):
            if e not in hit:
                if self.run_every_expert:  # a trace: each expert reads its own copy of every token
                    self._inner(self.expert(e), hidden_states[torch.arange(hidden_states.shape[0],
                                                                           device=hidden_states.device)])
                continue
            pos, tokens = torch.where(mask[e])
            h = self._inner(self.expert(e), hidden_states[tokens])
            h = h * top_k_weights[tokens, pos, None]
            out.index_add_(0, tokens, h.to(out.dtype))
        return out

    run_every_expert = False

    def pristine(self) -> bool:
        """Every site a dense view and every activation as built: the fused layout describes it whole."""
        return all(type(getattr(m, IN_SITE[self.has_gate])) is ExpertSite and type(m.down) is ExpertSite
                   and type(m.act_fn) is type(self.act_fn or nn.Identity()) for m in self.children()
                   if isinstance(m, ExpertMLP))


def _default_gate(cls: type) -> bool:
    gate = getattr(cls, "_apply_gate", None)
    return gate is None or getattr(gate, "__name__", "") == "_default_apply_gate"


def _site_keys(module: SplitExperts, prefix: str, e: int) -> dict[str, str]:
    """fused key -> this expert's key, for the weights and biases."""
    first, down = module._fused_names
    keys = {first: f"{prefix}{e}.{IN_SITE[module.has_gate]}.weight", down: f"{prefix}{e}.down.weight"}
    if module.has_bias:
        keys |= {f"{first}_bias": f"{prefix}{e}.{IN_SITE[module.has_gate]}.bias", f"{down}_bias": f"{prefix}{e}.down.bias"}
    return keys


def _fuse_on_save(module: SplitExperts, state: dict, prefix: str, _meta) -> None:
    if not module.pristine():
        return  # per expert: a replaced site's own tensors cannot be stacked
    for fused_name in list(_site_keys(module, prefix, 0)):
        parts = []
        for e in range(module.num_experts):
            t = state.pop(_site_keys(module, prefix, e)[fused_name])
            parts.append(t.t() if module.is_transposed and t.dim() == 2 else t)
        state[prefix + fused_name] = torch.stack(parts)


def _split_on_load(module: SplitExperts, state: dict, prefix: str, *_args) -> None:
    for fused_name in list(_site_keys(module, prefix, 0)):
        stacked = state.pop(prefix + fused_name, None)
        if stacked is None:
            continue
        for e in range(module.num_experts):
            t = stacked[e]
            state[_site_keys(module, prefix, e)[fused_name]] = t.t() if module.is_transposed and t.dim() == 2 else t


def split_experts(model: nn.Module, names: list[str] | None = None) -> list[str]:
    """Swap fused experts modules for SplitExperts over the same storage: every one (`names` None), or those on the
    paths of the given module names (a compressed layout's sites). The names of the modules swapped."""
    found = [(n, m) for n, m in model.named_modules() if is_fused_experts(m)
             and (names is None or any(s.startswith(n + ".") for s in names))]
    for name, mod in found:
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, attr, SplitExperts(mod))
    return [n for n, _ in found]
