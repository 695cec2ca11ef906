"""Mixture-of-experts layers whose experts are fused 3-D parameters, split into one nn.Linear per expert and
projection (core/experts.py): the same computation, the same storage and state dict, statistics from the tokens
routed to each expert only, a data-free stand-in for an expert calibration never reached, and checkpoints."""

from __future__ import annotations

import pytest
import torch

# one architecture per layout the experts decorator declares: plain (Mixtral), transposed with biases and an
# interleaved custom gate (GPT-OSS), a shared expert beside the routed ones (Qwen2-MoE), a router module holding
# its linear layer (Hunyuan-MoE)
LAYOUTS = ["mixtral", "gpt_oss", "qwen2_moe", "hunyuan_v1_moe"]


def _ids(vocab: int = 64, n: int = 2, t: int = 16, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, vocab, (n, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("model_type", LAYOUTS)
def test_split_experts_keep_the_logits_the_storage_and_the_state_dict(model_type):
    from acbench.model.groups import find_input_groups
    from acbench.core.experts import ExpertSite, SplitExperts, is_fused_experts
    from acbench.studies.architectures import tiny_model

    model = tiny_model(model_type)
    ids = _ids()
    fused = {n: m for n, m in model.named_modules() if is_fused_experts(m)}
    assert fused
    pointers = {n: m.down_proj.data_ptr() for n, m in fused.items()}
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        dense = model(ids).logits
    groups = find_input_groups(model)
    for name in fused:
        split = model.get_submodule(name)
        assert isinstance(split, SplitExperts) and split.expert(0).down.weight.data_ptr() == pointers[name]
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, dense, atol=1e-6, rtol=0)
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    block = [g for g in groups if g.block == 0]
    n_experts = next(iter(fused.values())).down_proj.shape[0]
    for e in range(n_experts):  # each expert: its own input group and its own output group
        mine = [g for g in block if g.name.startswith(f"layers.0.experts.{e}.")]
        assert [g.kind for g in mine] == ["mlp_in", "mlp_out"]
        assert all(isinstance(s, ExpertSite) for g in mine for s in g.sites)
    assert not any(s.endswith((".gate", ".wg", "router")) for g in groups for s in g.site_names)


def test_expert_statistics_come_from_the_tokens_routed_to_it():
    """C of expert e's input group is X_e^T X_e / n_e over exactly the tokens its router chose, summed by hand."""
    from acbench.calibration.engine import CalibSpec, calibrate
    from acbench.model.groups import find_input_groups
    from acbench.core.experts import SplitExperts
    from acbench.studies.architectures import tiny_model

    model = tiny_model("mixtral")
    groups = find_input_groups(model)
    experts = model.get_submodule("model.layers.1.mlp.experts")
    assert isinstance(experts, SplitExperts)
    seen = []
    handle = experts.register_forward_pre_hook(lambda m, args: seen.append((args[0].detach(), args[1].clone())))
    stats = calibrate(model, groups, _ids(n=4), frozenset({"C"}), CalibSpec(pair_tokens=16), progress=False)
    handle.remove()
    for e in range(experts.num_experts):
        rows = torch.cat([h[(idx == e).any(-1)] for h, idx in seen]).double()
        got = stats[f"layers.1.experts.{e}.mlp_in"]
        assert got.n_tokens == rows.shape[0] > 0
        torch.testing.assert_close(got.C, rows.T @ rows / rows.shape[0], rtol=1e-5, atol=1e-6)
    total = sum(stats[f"layers.1.experts.{e}.mlp_in"].n_tokens for e in range(experts.num_experts))
    assert total == 4 * 16 * model.config.num_experts_per_tok  # every token, once per expert it was routed to


def _never_route_to(model, expert: int):
    """Routers rewritten to send every choice of `expert` to expert 0 instead: calibration never reaches it."""
    def hook(module, args, out):
        *rest, index = out
        return (*rest, torch.where(index == expert, torch.zeros_like(index), index))

    return [layer.mlp.gate.register_forward_hook(hook) for layer in model.model.layers]


@pytest.mark.parametrize("method, twin", [("pca", "svd"), ("fwsvd", "svd"), ("fasc-kfac", "svd"),
                                          ("teal", "act-sparse"), ("wanda", "magnitude-prune")])
def test_an_expert_calibration_never_reached_gets_the_recorded_data_free_twin(method, twin):
    from acbench import methods
    from acbench.calibration.engine import CalibSpec, calibrate
    from acbench.deploy.compression import deploy
    from acbench.model.groups import find_input_groups
    from acbench.core.stats import RankSpec, SparsitySpec
    from acbench.studies.architectures import tiny_model

    model = tiny_model("mixtral")
    groups = find_input_groups(model)
    handles = _never_route_to(model, 3)
    needs = methods.build(method).required_stats()
    stats = calibrate(model, groups, _ids(), needs, CalibSpec(pair_tokens=16), progress=False)
    for h in handles:
        h.remove()
    assert stats["layers.0.experts.3.mlp_in"].n_tokens == 0 and stats["layers.0.experts.0.mlp_in"].n_tokens > 0
    budget = RankSpec(0.5) if methods.family_of(method) == methods.LOW_RANK_FAMILY else SparsitySpec(density=0.5)
    dep = deploy(model, method, budget, stats, progress=False)
    try:
        with torch.no_grad():
            assert torch.isfinite(model(_ids()).logits).all()
    finally:
        dep.restore()
    by_group = {s["group"]: s["fallbacks"] for s in dep.summaries}
    stand_in = [f for f in by_group["layers.1.experts.3.mlp_out"] if f.get("method") == method]
    assert stand_in and stand_in[0]["fallback"].startswith(f"{twin} (data-free)")
    assert not any(f.get("method") == method for f in by_group["layers.1.experts.0.mlp_out"])


def test_a_fused_layout_the_decorator_does_not_describe_is_refused_in_one_line():
    """Llama 4 keeps its experts as 3-D parameters outside transformers' experts decorator: its MLP is refused in
    one line, attention alone is compressed."""
    from acbench.model.groups import find_input_groups, fused_experts_problem
    from acbench.studies.architectures import tiny_model

    groups = find_input_groups(tiny_model("llama4_text"))
    line = fused_experts_problem(groups, None)
    assert "fused 3-D parameters" in line and "--groups attn_in attn_out" in line and "\n" not in line
    assert fused_experts_problem(groups, ("attn_in", "attn_out")) is None


def test_a_saved_dense_split_model_loads_in_plain_transformers(tmp_path):
    """Every site dense: the state dict is the fused one, so the base architecture loads it with equal logits."""
    from transformers import AutoModelForCausalLM

    from acbench.model.groups import find_input_groups
    from acbench.studies.architectures import tiny_model

    model = tiny_model("gpt_oss")
    find_input_groups(model)
    with torch.no_grad():
        model.get_submodule("model.layers.0.mlp.experts").expert(1).down.weight.mul_(0.5)  # an edit in place
        want = model(_ids()).logits
    model.save_pretrained(tmp_path)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    with torch.no_grad():
        torch.testing.assert_close(plain(_ids()).logits, want, rtol=0, atol=1e-5)


def _calibrated_mixtral():
    from acbench.calibration.engine import CalibSpec, calibrate
    from acbench.model.groups import find_input_groups
    from acbench.studies.architectures import tiny_model

    model = tiny_model("mixtral")
    groups = find_input_groups(model)
    return model, calibrate(model, groups, _ids(), frozenset({"C"}), CalibSpec(pair_tokens=16), progress=False)


@pytest.mark.parametrize("method, budget, merge", [("pca", 0.9, True), ("magnitude-prune", 0.5, False),
                                                   ("pca", 0.25, False)])
def test_compressed_experts_save_and_reload_in_acbench_and_plain_transformers(method, budget, merge, tmp_path):
    """Dense-shaped forms (merged, masked weights) save the fused layout, which the base architecture loads; a
    factorised form saves the compressed experts module per expert, and only that one: one block's expert 1 is
    compressed, the other block's experts stay fused on disk."""
    from transformers import AutoModelForCausalLM

    from acbench import methods
    from acbench.deploy.compression import deploy
    from acbench.model.checkpoint import load_checkpoint, write_checkpoint
    from acbench.core.stats import RankSpec, SparsitySpec

    model, stats = _calibrated_mixtral()
    spec = RankSpec(budget) if methods.family_of(method) == methods.LOW_RANK_FAMILY else SparsitySpec(density=budget)
    only = None if merge or budget > 0.25 else {"layers.0.experts.1.mlp_in", "layers.0.experts.1.mlp_out"}
    dep = deploy(model, method, spec, stats, only_groups=only, progress=False, merge=merge)
    with torch.no_grad():
        want = model(_ids(seed=1)).logits
    write_checkpoint(model, None, tmp_path / "ck", {"method": method, "budget": str(budget)})
    dep.restore()
    from safetensors import safe_open

    with safe_open(tmp_path / "ck" / "model.safetensors", "pt") as f:
        keys = set(f.keys())
    factorised = only is not None
    split_keys = {k for k in keys if ".experts.1.gate_up." in k or ".experts.1.down." in k}
    if factorised:  # the compressed experts module per expert, the other one fused as transformers holds it
        assert "model.layers.1.mlp.experts.gate_up_proj" in keys and split_keys
        assert all(k.startswith("model.layers.0.") for k in split_keys)
    else:  # the base architecture's own key format (transformers saves Mixtral's experts per expert, w1/w2/w3)
        assert not split_keys and "model.layers.0.block_sparse_moe.experts.1.w1.weight" in keys
    for loaded in (load_checkpoint(tmp_path / "ck"),
                   AutoModelForCausalLM.from_pretrained(tmp_path / "ck", trust_remote_code=factorised,
                                                        dtype=torch.float32).eval()):
        with torch.no_grad():
            torch.testing.assert_close(loaded(_ids(seed=1)).logits, want, rtol=0, atol=1e-5)
