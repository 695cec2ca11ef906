"""Input groups: the sets of linear sites in a block that read the same activation tensor.

Found, not listed: the decoder blocks are the `nn.ModuleList` of identical blocks that a text-only forward reaches
first; one short forward (4 tokens) with a pre-hook on every linear site of every block records which tensor each
site reads, and the sites of a block that read the same tensor form a group. Each group's kind comes from its
place in its block: the sites under an attention module (a path component naming attn or attention) against the
rest (the MLP), in forward order. Blocks may differ (a dense first block before mixture-of-experts ones). The
trace runs once per model object, on whatever device the model is (the meta device included: `bench plan` traces
a model without storage).
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass

import torch
from torch import nn

from acbench.model.conv1d import linearize_conv1d
from acbench.core.errors import UserError
from acbench.core.experts import SplitExperts, split_experts

# The kinds `--groups` selects from, in forward order. A Llama-shaped block has the four classic ones; a parallel
# block (GPT-J, Falcon: attention and MLP read one normed input) has attn_mlp_in; attention or MLP with more than
# two groups (low-rank query and key-value projections, as in DeepSeek's) has the middle ones.
GROUP_KINDS = ("attn_in", "attn_mid", "attn_out", "attn_mlp_in", "mlp_in", "mlp_mid", "mlp_out")
# Sites that route tokens to experts (or gate a shared expert) stay dense: their few outputs decide which weights
# run, so compressing them changes the computation itself, not its precision.
ROUTER_NAMES = frozenset({"gate", "router", "shared_expert_gate", "expert_gate"})
# Modules whose every site routes: a router built of several layers (LongCat-Flash's router.classifier), a router
# module holding its linear layer (Hunyuan-MoE's gate.wg), and a sparse-attention indexer (DeepSeek-V3.2's lightning indexer), which picks the keys each query attends to (its
# output reaches the loss only through a top-k, so it has no gradient either).
ROUTING_MODULES = frozenset({"router", "indexer", "gate"})
TRACE_TOKENS = 4


@dataclass
class InputGroup:
    """Sites that read one activation: compressing it once serves every site in the group."""

    name: str  # e.g. "layers.3.attn_in"
    block: int
    kind: str  # one of GROUP_KINDS
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


class InputGroups(list):
    """A model's input groups, in block and forward order, with what the model holds that no group covers:
    `fused_experts`, the modules whose experts are one 3-D parameter (not per-expert sites), and `idle_sites`, the
    linear sites the forward never calls as modules (their weight read directly), which stay dense."""

    def __init__(self, groups=(), fused_experts: tuple[str, ...] = (), idle_sites: tuple[str, ...] = ()):
        super().__init__(groups)
        self.fused_experts = fused_experts
        self.idle_sites = idle_sites


@dataclass(frozen=True)
class ModelLayout:
    """What one trace finds: where the blocks are, and per block each group's kind and sites (relative to the block,
    in forward order), and the modules whose experts are fused 3-D parameters."""

    blocks: str
    groups: tuple[tuple[tuple[str, tuple[str, ...]], ...], ...]  # per block: (kind, relative site names)
    fused_experts: tuple[str, ...] = ()  # full module names
    idle_sites: tuple[str, ...] = ()  # full names of linear sites the forward never calls (they stay dense)


_LAYOUTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _model_type(model: nn.Module) -> str:
    return str(getattr(getattr(model, "config", None), "model_type", None) or type(model).__name__)


def _candidate_block_lists(model: nn.Module) -> list[tuple[str, nn.ModuleList]]:
    """ModuleLists of blocks: identical classes, each holding at least two linear sites."""
    out = []
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and len(mod) and all(type(c) is type(mod[0]) for c in mod):
            if sum(isinstance(m, nn.Linear) for m in mod[0].modules()) >= 2:
                out.append((name, mod))
    return out


def _is_router(rel: str) -> bool:
    parts = rel.split(".")
    return parts[-1] in ROUTER_NAMES or any(p in ROUTING_MODULES for p in parts[:-1])


def _has_fused_experts(rel: str, module: nn.Module) -> bool:
    """An experts module holding its experts stacked in one 3-D parameter. Other 3-D weights (a convolution's kernel,
    per-head recurrent gates as in RecurrentGemma and Zamba) are no experts: like norms, they stay dense."""
    named = "expert" in rel.rsplit(".", 1)[-1].lower() or "expert" in type(module).__name__.lower()
    return named and any(p.dim() == 3 for p in module.parameters(recurse=False))


def _input_device(model: nn.Module) -> torch.device:
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    weight = getattr(emb, "weight", None)
    return weight.device if weight is not None else next(model.parameters()).device


class _Traced(Exception):
    """Raised when the last block has run: the head and whatever follows it are skipped (on the meta device some
    architectures read a value back there, which a tensor without storage cannot give)."""


def _stop(module, args, output):
    raise _Traced


def _trace(model: nn.Module) -> tuple[str, nn.ModuleList, list[list[tuple[str, object]]]]:
    """(blocks path, the blocks, per block [(relative site name, the tensor it read)] in call order) from one
    short text-only forward. The blocks are the candidate list whose first block the forward reaches first (a
    multimodal model's vision tower does not run on text)."""
    candidates = _candidate_block_lists(model)
    if not candidates:
        raise UserError(f"architecture '{_model_type(model)}': no list of decoder blocks with linear layers found; "
                        "acbench compresses nn.Linear sites inside repeated decoder blocks")
    reads: dict[int, list] = {}
    first: list[int] = []
    handles = []
    for c, (_, blocks) in enumerate(candidates):
        for block in blocks:
            log = reads.setdefault(id(block), [])
            for rel, mod in block.named_modules():
                if isinstance(mod, nn.Linear) and not _is_router(rel):
                    handles.append(mod.register_forward_pre_hook(
                        lambda m, args, rel=rel, log=log: log.append((rel, args[0] if args else None))))
            handles.append(block.register_forward_pre_hook(lambda m, args, c=c: first.append(c)))
        handles.append(blocks[-1].register_forward_hook(_stop))  # what follows the blocks (the head) is not needed
    ids = torch.zeros(1, TRACE_TOKENS, dtype=torch.long, device=_input_device(model))
    split = [m for m in model.modules() if isinstance(m, SplitExperts)]
    for m in split:  # 4 tokens reach few experts: every expert runs, each on its own copy of the tokens
        m.run_every_expert = True
    try:
        with torch.no_grad():
            # no cache: a hybrid model's cache wants a generation set-up
            model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    except _Traced:
        pass
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure of the architecture's own forward is said in one line
        message = str(e).splitlines()[0][:160] if str(e) else ""
        raise UserError(f"architecture '{_model_type(model)}': a short text-only forward failed "
                        f"({type(e).__name__}: {message}); acbench finds input groups by tracing one") from None
    finally:
        for h in handles:
            h.remove()
        for m in split:
            m.run_every_expert = False
    if not first:
        raise UserError(f"architecture '{_model_type(model)}': a text-only forward reached no decoder block; "
                        "acbench finds input groups by tracing one")
    name, blocks = candidates[first[0]]
    return name, blocks, [reads[id(b)] for b in blocks]


def _block_groups(model: nn.Module, block: nn.Module, where: str, reads: list) -> list[tuple[str, tuple[str, ...]]]:
    """One block's groups from what its sites read: sites that read one tensor form a group, in forward order."""
    seen: dict[str, object] = {}
    groups: list[list[str]] = []
    tensors: list[object] = []
    for rel, x in reads:
        if rel in seen:
            if seen[rel] is not x:
                raise UserError(f"architecture '{_model_type(model)}': site {where}.{rel} runs twice in its block "
                                "on different inputs; acbench compresses a site that reads one input")
            continue
        seen[rel] = x
        for i, t in enumerate(tensors):
            if t is x:
                groups[i].append(rel)
                break
        else:
            tensors.append(x)
            groups.append([rel])
    return list(zip(_kinds(groups), map(tuple, groups)))


def _idle_sites(block: nn.Module, where: str, reads: list) -> list[str]:
    """The block's linear sites the traced forward never called as modules: their weight is read directly (Mamba's
    dt_proj, which the scan applies itself) or the forward skips them, so no input of theirs can be hooked and no
    replacement would run. They stay dense, named by `bench run` in one line."""
    seen = {rel for rel, _ in reads}
    idle = [rel for rel, m in block.named_modules() if isinstance(m, nn.Linear) and not _is_router(rel)
            and rel not in seen]
    expert = next((rel for rel in idle if expert_unit(rel)), None)
    if seen and expert:  # the block ran, but its router chose other experts: leaving this one dense would be silent
        raise UserError(f"{where}.{expert} is an expert the traced forward did not route to, in a per-expert module "
                        "list acbench cannot make run every expert (it does for transformers' fused experts); "
                        "compress attention only with --groups attn_in attn_out")
    return [f"{where}.{rel}" for rel in idle]


def expert_unit(rel: str) -> str | None:
    """The path of the expert a site belongs to (`mlp.experts.3`), or None: each expert is an MLP of its own."""
    m = re.match(r"(.*?(?:^|\.)[^.]*experts?)\.(\d+)(?:\.|$)", rel)
    return f"{m.group(1)}.{m.group(2)}" if m else None


def _kinds(groups: list[list[str]]) -> list[str]:
    """Each group's kind from its place: attention sites against MLP sites, in forward order; the groups of each
    expert are placed among that expert's own."""
    def attention(rel: str) -> bool:
        return any("attn" in part or "attention" in part for part in rel.split("."))

    has_attn = [any(attention(r) for r in g) for g in groups]
    has_mlp = [any(not attention(r) for r in g) for g in groups]
    units = [expert_unit(g[0]) if has_mlp[i] and not has_attn[i] else None for i, g in enumerate(groups)]
    attn_idx = [i for i, a in enumerate(has_attn) if a]
    kinds = []
    for i in range(len(groups)):
        if has_attn[i] and has_mlp[i]:
            kinds.append("attn_mlp_in")
            continue
        idx, prefix = (attn_idx, "attn") if has_attn[i] else (
            [j for j, m in enumerate(has_mlp) if m and not has_attn[j] and units[j] == units[i]]
            if units[i] is not None else [j for j, m in enumerate(has_mlp) if m and units[j] is None], "mlp")
        pos = idx.index(i)
        kinds.append(f"{prefix}_in" if pos == 0 else f"{prefix}_out" if pos == len(idx) - 1 else f"{prefix}_mid")
    return kinds


def model_layout(model: nn.Module) -> ModelLayout:
    """The model's layout, traced once per model object, on the model as it is first asked for (loaded, dense)."""
    known = _LAYOUTS.get(model)
    if known is not None:
        return known
    linearize_conv1d(model)  # GPT-2's transposed Conv1D sites become nn.Linear views of the same storage
    split_experts(model)  # fused 3-D experts become per-expert nn.Linear views of the same storage
    try:
        path, blocks, reads = _trace(model)
    except UserError:
        if not _on_meta(model):
            raise
        layout = _twin_layout(model)  # an architecture whose forward reads a value back, which meta cannot give
        _LAYOUTS[model] = layout
        return layout
    groups = tuple(tuple(_block_groups(model, block, f"{path}.{i}", r)) for i, (block, r) in
                   enumerate(zip(blocks, reads)))
    if not any(groups):
        raise UserError(f"architecture '{_model_type(model)}': its decoder blocks ran no nn.Linear site; acbench "
                        "compresses nn.Linear sites")
    fused = tuple(f"{path}.{i}.{rel}" for i, block in enumerate(blocks) for rel, m in block.named_modules()
                  if _has_fused_experts(rel, m))
    idle = tuple(n for i, (block, r) in enumerate(zip(blocks, reads)) for n in _idle_sites(block, f"{path}.{i}", r))
    layout = ModelLayout(path, groups, fused, idle)
    _LAYOUTS[model] = layout
    return layout


def _on_meta(model: nn.Module) -> bool:
    return any(p.is_meta for p in model.parameters())


def _twin_layout(model: nn.Module) -> ModelLayout:
    """The layout of a meta-device model traced on a real twin: the same config with its widths shrunk and its
    block count kept (tiny, on the CPU), whose module names are the model's own."""
    from acbench.model.tiny import shrink

    try:
        small = shrink(model.config, keep_layers=True)
        twin = causal_lm_class(small)._from_config(small, dtype=torch.float32)
    except Exception as e:  # noqa: BLE001 - a config that cannot be shrunk: its own trace's failure stands
        raise UserError(f"architecture '{_model_type(model)}': its structure cannot be traced without its weights "
                        f"({type(e).__name__}); run with the model's weights (bench run) instead of bench plan") from None
    layout = model_layout(twin)
    model.get_submodule(layout.blocks)  # the same module tree: its names are the model's
    return layout


def _group_name(block: int, kind: str, taken: set[str], first_site: str = "") -> str:
    unit = expert_unit(first_site)
    stem = f"layers.{block}." + (".".join(unit.split(".")[-2:]) + "." if unit else "")
    name, n = f"{stem}{kind}", 2
    while name in taken:
        name, n = f"{stem}{kind}_{n}", n + 1
    taken.add(name)
    return name


def find_input_groups(model: nn.Module, kinds: tuple[str, ...] | None = None) -> InputGroups:
    layout = model_layout(model)
    blocks = model.get_submodule(layout.blocks)
    groups = []
    for i, block in enumerate(blocks):
        taken: set[str] = set()
        for kind, rel_names in layout.groups[i]:
            name = _group_name(i, kind, taken, rel_names[0])
            if kinds is not None and kind not in kinds:
                continue
            sites = tuple(block.get_submodule(rel) for rel in rel_names)
            for rel, mod in zip(rel_names, sites):
                if not isinstance(mod, nn.Linear):  # a variant deployed in place, or a compressed checkpoint
                    raise UserError(f"site {layout.blocks}.{i}.{rel} is {type(mod).__name__}, not nn.Linear: "
                                    "compress the dense model")
            groups.append(InputGroup(name=name, block=i, kind=kind,
                                     site_names=tuple(f"{layout.blocks}.{i}.{rel}" for rel in rel_names),
                                     sites=sites))
    return InputGroups(groups, layout.fused_experts, layout.idle_sites)


# Where an activation function lives as a module: transformers' own (ACT2FN's classes) and torch's.
ACTIVATION_PACKAGES = ("transformers.activations", "torch.nn.modules.activation")


def activation_module(model: nn.Module, group: InputGroup) -> tuple[str, nn.Module] | None:
    """(name, module) of the activation function whose output an MLP's last group reads (down(act(gate x) * up x),
    or down(act(fc x))): the one parameter-free activation module beside the group's sites in their MLP, or else the
    one outside attention in their block; None for any other group, or where the MLP applies its activation as a
    plain function (no module to hook)."""
    if group.kind != "mlp_out":
        return None
    parent = group.site_names[0].rpartition(".")[0]
    found = _activations(model, parent, recurse=False)
    if not found:  # an MLP split in two modules (BERT-like: the activation in the first, down in the second)
        block = f"{model_layout(model).blocks}.{group.block}"
        found = [(n, m) for n, m in _activations(model, block, recurse=True)
                 if not any("attn" in p or "attention" in p for p in n[len(block):].split("."))]
    return found[0] if len(found) == 1 else None


def _activations(model: nn.Module, path: str, recurse: bool) -> list[tuple[str, nn.Module]]:
    """The parameter-free activation modules under `path`: its children, or every descendant."""
    root = model.get_submodule(path)
    items = root.named_modules() if recurse else root.named_children()
    return [(f"{path}.{rel}", m) for rel, m in items if rel and type(m).__module__ in ACTIVATION_PACKAGES
            and not any(True for _ in m.parameters())]


def fused_experts_problem(groups: list, kinds: tuple[str, ...] | None) -> str | None:
    """One line when the run would compress the MLP of a model whose experts are fused 3-D parameters, which no
    group covers (they would stay dense without a word); None otherwise."""
    fused = getattr(groups, "fused_experts", ())
    if not fused or (kinds is not None and not any(k.startswith("mlp") or k == "attn_mlp_in" for k in kinds)):
        return None
    return (f"{fused[0]} holds its experts as fused 3-D parameters, not per-expert nn.Linear sites: acbench cannot "
            "compress them yet; compress attention only with --groups attn_in attn_out")


def causal_lm_class(config) -> type:
    """The causal-LM class of a config: the auto mapping's (what AutoModelForCausalLM builds), or, for a config
    class the mapping does not key (Emu3's causal LM runs on its text config), the class of the config's own
    modeling module that declares it. Every place that builds or loads a model from a config asks here, so an
    architecture the coverage table passes opens everywhere."""
    import importlib

    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    try:
        return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    except KeyError:
        pass
    try:
        module = importlib.import_module(type(config).__module__.replace(".configuration_", ".modeling_"))
    except ImportError:
        module = None
    for name in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values():
        cls = getattr(module, name, None)
        if cls is not None and getattr(cls, "config_class", None) is type(config):
            return cls
    raise UserError(f"config {type(config).__name__} has no causal-LM class in the installed transformers: pass a "
                    "causal language model")


def meta_model(config):
    """The model's module tree with no storage behind its tensors: shapes only, in milliseconds."""
    with torch.device("meta"):
        return causal_lm_class(config)._from_config(config)
