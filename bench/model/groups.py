"""Input groups: the sets of linear sites in a block that read the same activation tensor."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from core.errors import UserError

# Per architecture: where the decoder blocks live, and each group's sites (relative to a block).
# Groups are listed in forward order. To support a new architecture, add its `config.model_type` here.
_LLAMA_LIKE = {
    "blocks": "model.layers",
    "groups": {
        "attn_in": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
        "attn_out": ("self_attn.o_proj",),
        "mlp_in": ("mlp.gate_proj", "mlp.up_proj"),
        "mlp_out": ("mlp.down_proj",),
    },
}
GROUP_KINDS = tuple(_LLAMA_LIKE["groups"])  # the kinds `--groups` selects from, in forward order
ARCHITECTURES: dict[str, dict] = {
    name: _LLAMA_LIKE
    for name in ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "gemma3", "olmo2")
}
ARCHITECTURES["gemma3"] = {"blocks": "model.language_model.layers", "groups": _LLAMA_LIKE["groups"]}


@dataclass
class InputGroup:
    """Sites that read one activation: compressing it once serves every site in the group."""

    name: str  # e.g. "layers.3.attn_in"
    block: int
    kind: str  # attn_in | attn_out | mlp_in | mlp_out
    site_names: tuple[str, ...]  # full module names in the model
    sites: tuple[nn.Linear, ...]

    @property
    def d_in(self) -> int:
        return self.sites[0].in_features

    @property
    def d_outs(self) -> tuple[int, ...]:
        return tuple(s.out_features for s in self.sites)

    def stacked_weight(self) -> torch.Tensor:
        return torch.cat([s.weight.detach() for s in self.sites], dim=0)


def architecture_of(model: nn.Module) -> dict:
    model_type = getattr(model.config, "model_type", None)
    if model_type not in ARCHITECTURES:
        raise UserError(
            f"unknown architecture '{model_type}': acbench knows {', '.join(sorted(ARCHITECTURES))}; "
            "add its block path and group sites to bench.model.groups.ARCHITECTURES"
        )
    return ARCHITECTURES[model_type]


def find_input_groups(model: nn.Module, kinds: tuple[str, ...] | None = None) -> list[InputGroup]:
    arch = architecture_of(model)
    blocks = model.get_submodule(arch["blocks"])
    groups = []
    for i, block in enumerate(blocks):
        for kind, rel_names in arch["groups"].items():
            if kinds is not None and kind not in kinds:
                continue
            sites = []
            for rel in rel_names:
                mod = block.get_submodule(rel)
                if not isinstance(mod, nn.Linear):
                    raise UserError(
                        f"site {arch['blocks']}.{i}.{rel} is {type(mod).__name__}, not nn.Linear: "
                        "compress the dense model, or fix bench.model.groups.ARCHITECTURES"
                    )
                sites.append(mod)
            groups.append(
                InputGroup(
                    name=f"layers.{i}.{kind}",
                    block=i,
                    kind=kind,
                    site_names=tuple(f"{arch['blocks']}.{i}.{rel}" for rel in rel_names),
                    sites=tuple(sites),
                )
            )
    return groups


def meta_model(config):
    """The model's module tree with no storage behind its tensors: shapes only, in milliseconds."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)
