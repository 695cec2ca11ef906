"""Input groups found by tracing, on tiny random models of many architectures (studies/architectures.py builds
them from each config class's defaults, shrunk; no download): discovery reproduces the hand-written groups of the
9 architectures acbench listed before it, and on each architecture of issue 63's list every method deploys dense's
logits at full rank or density 1, runs at 0.5, restores the dense model bit for bit, and a checkpoint reloads."""

from __future__ import annotations

import pytest

from acbench.core.errors import UserError

# The table acbench kept by hand until input groups were discovered (bench/model/groups.py, before issue 63): the
# default run's numbers depend on discovery finding exactly these names, sites and order.
_LLAMA_GROUPS = {"attn_in": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                 "attn_out": ("self_attn.o_proj",), "mlp_in": ("mlp.gate_proj", "mlp.up_proj"),
                 "mlp_out": ("mlp.down_proj",)}
HAND_WRITTEN = {t: ("model.layers", _LLAMA_GROUPS) for t in ("llama", "mistral", "qwen2", "qwen3", "gemma",
                                                            "gemma2", "gemma3_text", "olmo2")}
HAND_WRITTEN["gemma3"] = ("model.language_model.layers", _LLAMA_GROUPS)

ISSUE_63 = ["llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma2", "gemma3_text", "phi",
            "phi3", "gpt2", "gpt_neox", "gptj", "opt", "falcon", "olmo2", "olmoe", "starcoder2", "granite"]
MIXTURE_OF_EXPERTS = {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe"}
# one type per shape the tiny configs or the checkpoint path had to learn: multi-head latent attention (DeepSeek-V3),
# per-layer size overrides (Gemma 4), a causal LM on a config class the auto mapping does not key (Emu3), a fused
# query_key_value in the original key format (Sarvam-MoE), GPT-Neo's attention-kind pattern, a head_dim left unset
# (Hunyuan), a multimodal head saved under its language model's prefix (Gemma 3), a sparse-attention indexer
# (DeepSeek-V3.2), GPT-2's Conv1D siblings (OpenAI GPT), embeddings added to in place during calibration (GIT),
# blocks run in cycles whose first ones take no gradient (HRM), a site no gradient reaches (Doge's dt_proj), a site
# whose weight the forward reads directly (Mamba's dt_proj), transposed experts with biases and a custom gate (GPT-OSS),
# Mamba-2 mixer sizes and an infinite float in config.json (Bamba's time_step_limit)
REACHED = ["deepseek_v3", "gemma4_text", "emu3", "sarvam_moe", "gpt_neo", "hunyuan_v1_dense", "gemma3",
           "deepseek_v32", "openai-gpt", "git", "hrm_text", "doge", "mamba", "gpt_oss", "bamba"]
PARALLEL = {"phi", "gptj", "falcon"}  # attention and MLP read one normed input: one group


@pytest.mark.parametrize("model_type", sorted(HAND_WRITTEN))
def test_discovery_reproduces_the_hand_written_groups(model_type):
    from acbench.model.groups import find_input_groups
    from acbench.studies.architectures import tiny_model

    blocks, table = HAND_WRITTEN[model_type]
    groups = find_input_groups(tiny_model(model_type))
    want = [(f"layers.{b}.{kind}", kind, tuple(f"{blocks}.{b}.{s}" for s in sites))
            for b in range(2) for kind, sites in table.items()]
    assert [(g.name, g.kind, g.site_names) for g in groups] == want
    assert groups.fused_experts == ()


@pytest.mark.parametrize("model_type", ISSUE_63)
def test_every_method_on_the_architecture(model_type, tmp_path):
    from acbench.studies.architectures import check_architecture

    cov = check_architecture(model_type, save_to=tmp_path / "checkpoint")
    assert cov.refused is None, cov.refused
    assert {k: v for k, v in cov.checks.items() if v != "ok"} == {}
    assert cov.scope == "all"  # mixtures of experts too: each expert's sites are groups of their own
    if model_type in PARALLEL:
        assert cov.kinds == ["attn_mlp_in", "attn_out", "mlp_out"]
    else:
        assert cov.kinds == ["attn_in", "attn_out", "mlp_in", "mlp_out"]


@pytest.mark.parametrize("model_type", REACHED)
def test_every_check_passes_on_the_shapes_reached_later(model_type, tmp_path):
    from acbench.studies.architectures import check_architecture

    cov = check_architecture(model_type, save_to=tmp_path / "checkpoint")
    assert cov.refused is None, cov.refused
    assert cov.passed and "save and reload" in cov.checks
    assert {k: v for k, v in cov.checks.items() if v != "ok"} == (
        {} if model_type not in ("mamba", "gpt_oss") else {"cats": cov.checks["cats"]})  # no activation module


def test_fused_experts_are_split_and_grouped_per_expert():
    from acbench.model.groups import find_input_groups, fused_experts_problem
    from acbench.studies.architectures import tiny_model

    for model_type in sorted(MIXTURE_OF_EXPERTS):
        groups = find_input_groups(tiny_model(model_type))
        assert fused_experts_problem(groups, None) is None and groups.fused_experts == ()
        assert any(".experts.1.mlp_out" in g.name for g in groups)
    assert fused_experts_problem(find_input_groups(tiny_model("llama")), None) is None


def test_an_architecture_without_linear_blocks_is_refused_in_one_line():
    """Blocks with no linear layer (here, convolutions only) give acbench nothing to compress: one line says so."""
    import torch
    from torch import nn

    from acbench.model.groups import find_input_groups

    class ConvOnly(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(16, 8)
            self.blocks = nn.ModuleList(nn.Conv1d(8, 8, 1) for _ in range(2))

        def forward(self, input_ids, **kwargs):
            x = self.embed(input_ids).transpose(1, 2)
            for b in self.blocks:
                x = b(x)
            return x

    with pytest.raises(UserError, match="no list of decoder blocks with linear layers") as e:
        find_input_groups(ConvOnly())
    assert "\n" not in str(e.value)
    assert torch.is_tensor(ConvOnly()(torch.zeros(1, 4, dtype=torch.long)))


def test_conv1d_sites_are_linear_views_of_the_same_storage(tmp_path):
    """GPT-2's Conv1D sites become nn.Linear over the same storage: the same logits bit for bit, the same state
    dict (keys, [in, out] shapes, values), and a model whose site weights were replaced (a pruned mask merged in)
    saves a checkpoint plain transformers loads with that model's logits."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.pytorch_utils import Conv1D

    from acbench.model.conv1d import Conv1DLinear, linearize_conv1d
    from acbench.studies.architectures import tiny_model

    model = tiny_model("gpt2")
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(ids).logits
    state = {k: v.clone() for k, v in model.state_dict().items()}
    pointers = {n: m.weight.data_ptr() for n, m in model.named_modules() if isinstance(m, Conv1D)}
    assert linearize_conv1d(model) == len(pointers) == 8
    assert not any(isinstance(m, Conv1D) for m in model.modules())
    for name, ptr in pointers.items():
        site = model.get_submodule(name)
        assert isinstance(site, Conv1DLinear) and site.weight.data_ptr() == ptr
        assert site.weight.shape == (site.out_features, site.in_features)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before)
    after = model.state_dict()
    assert list(after) == list(state) and all(torch.equal(after[k], state[k]) for k in state)

    site = model.get_submodule("transformer.h.0.mlp.c_fc")
    with torch.no_grad():
        site.weight = torch.nn.Parameter(site.weight * (site.weight.abs() > 0.01))  # a merged mask: [out, in]
        want = model(ids).logits
    model.save_pretrained(tmp_path)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert isinstance(plain.get_submodule("transformer.h.0.mlp.c_fc"), Conv1D)
    with torch.no_grad():
        assert torch.allclose(plain(ids).logits, want, atol=1e-6)
    model.load_state_dict(plain.state_dict())  # read back in Conv1D's layout
    with torch.no_grad():
        assert torch.equal(model(ids).logits, plain(ids).logits)


def test_kinds_follow_the_forward_order():
    from acbench.model.groups import _kinds

    assert _kinds([["attn.q"], ["attn.o"], ["mlp.up"], ["mlp.down"]]) == ["attn_in", "attn_out", "mlp_in", "mlp_out"]
    assert _kinds([["attn.qkv", "mlp.fc1"], ["attn.dense"], ["mlp.fc2"]]) == ["attn_mlp_in", "attn_out", "mlp_out"]
    # low-rank query and key-value projections (DeepSeek's attention): the middle groups are attn_mid
    assert _kinds([["self_attn.q_a", "self_attn.kv_a"], ["self_attn.q_b"], ["self_attn.kv_b"], ["self_attn.o"]]) == [
        "attn_in", "attn_mid", "attn_mid", "attn_out"]
    assert _kinds([["fc1"], ["fc2"]]) == ["mlp_in", "mlp_out"]


def test_bench_plan_of_a_mixture_of_experts_config(tmp_path, capsys):
    """A Mixtral config is planned whole (each expert's groups); Llama 4's experts, outside transformers' experts
    decorator, are refused in one line whose own advice (attention only) is then planned."""
    import warnings

    from transformers import Llama4TextConfig, MixtralConfig

    from acbench.cli import main

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        MixtralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=100, num_local_experts=4, bos_token_id=1,
                      eos_token_id=2).save_pretrained(tmp_path / "mixtral")
        Llama4TextConfig(hidden_size=64, intermediate_size=128, intermediate_size_mlp=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=100,
                         num_local_experts=4).save_pretrained(tmp_path / "llama4")
    common = ["plan", "--methods", "pca", "--rank", "0.5"]
    assert main([*common, "--model", str(tmp_path / "mixtral")]) == 0
    assert "mlp_out" in capsys.readouterr().out
    llama4 = [*common, "--model", str(tmp_path / "llama4")]
    assert main([*llama4, "--groups", "attn_in", "attn_out"]) == 0
    assert "attn_in" in capsys.readouterr().out
    assert main(llama4) == 2
    err = capsys.readouterr().err.strip()
    assert "fused 3-D parameters" in err and "--groups attn_in attn_out" in err and len(err.splitlines()) == 1


def test_routing_sites_stay_dense_and_a_site_without_gradient_is_one_line():
    """DeepSeek-V3.2's sparse-attention indexer picks keys through a top-k: discovery leaves its sites out (as it
    leaves routers out), and a group made of one anyway gets one line from gradient calibration, not a crash."""
    import torch

    from acbench.calibration.engine import CalibSpec, calibrate
    from acbench.model.groups import InputGroup, find_input_groups
    from acbench.core.stats import ACTIVATION_STATS, GRADIENT_STATS
    from acbench.studies.architectures import tiny_model

    model = tiny_model("deepseek_v32")
    groups = find_input_groups(model)
    assert groups and not any("indexer" in s for g in groups for s in g.site_names)
    name = "model.layers.0.self_attn.indexer.wk"
    forced = InputGroup("layers.0.indexer", 0, "attn_in", (name,), (model.get_submodule(name),))
    ids = torch.randint(3, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    calibrate(model, [forced], ids, ACTIVATION_STATS, CalibSpec(pair_tokens=16), progress=False)  # no gradients: fine
    with pytest.raises(UserError, match=f"site {name} got no gradient") as e:
        calibrate(model, [forced], ids, ACTIVATION_STATS | GRADIENT_STATS, CalibSpec(pair_tokens=16), progress=False)
    assert "\n" not in str(e.value)


def test_only_an_experts_module_counts_as_fused_experts():
    """A 3-D weight outside an experts module (RecurrentGemma's per-head recurrent gates, a convolution's kernel)
    stays dense like a norm and does not shut the MLP out; Nemotron-H's stacked experts (ungated) are split."""
    from acbench.model.groups import find_input_groups, fused_experts_problem
    from acbench.core.experts import SplitExperts
    from acbench.studies.architectures import tiny_model

    gemma = find_input_groups(tiny_model("recurrent_gemma"))
    assert gemma.fused_experts == () and fused_experts_problem(gemma, None) is None
    assert any(p.dim() == 3 for n, p in tiny_model("recurrent_gemma").named_parameters() if "rg_lru" in n)
    model = tiny_model("nemotron_h")
    nemotron = find_input_groups(model)
    assert nemotron.fused_experts == () and any(isinstance(m, SplitExperts) for m in model.modules())
    assert any(g.site_names[0].endswith("mixer.experts.0.up") for g in nemotron)

def test_a_method_refusing_in_one_line_is_an_answer_a_crash_is_not(tmp_path):
    """The table counts a type as passing when a method refuses there in one line (CATS without an activation
    module) and lists the refusal; a method that crashes fails the type."""
    from acbench.studies.architectures import REFUSED, Coverage, write_table

    ok = Coverage("alpha", kinds=["mlp_in"], checks={"svd": "ok", "cats": REFUSED + "no activation module"})
    crash = Coverage("beta", kinds=["mlp_in"], checks={"svd": "ok", "cats": "AttributeError: weight"})
    assert ok.passed and ok.refusals == {"cats": "no activation module"}
    assert not crash.passed and not Coverage("gamma").passed
    out = tmp_path / "table.md"
    assert write_table([(ok, None), (crash, None)], 60.0, out) == (1, 2)
    text = out.read_text()
    assert "| `alpha` | cats | no activation module |" in text and "| `beta` | 1 of 2 checks |" in text


def test_sites_the_forward_never_calls_stay_dense_and_are_named():
    """Mamba's scan reads dt_proj's weight directly: the site is never called, so it is named idle and left out
    of every group (it stays dense), and the rest of the block is grouped as usual."""
    from acbench.model.groups import find_input_groups
    from acbench.studies.architectures import tiny_model

    groups = find_input_groups(tiny_model("mamba"))
    assert groups.idle_sites == ("backbone.layers.0.mixer.dt_proj", "backbone.layers.1.mixer.dt_proj")
    assert not any("dt_proj" in s for g in groups for s in g.site_names)
    assert [g.kind for g in groups if g.block == 0] == ["mlp_in", "mlp_mid", "mlp_out"]
    assert find_input_groups(tiny_model("llama")).idle_sites == ()


def test_recurrent_cycles_without_gradients_give_pairs_and_fisher_from_the_cycle_with_them():
    """HRM runs its blocks in cycles, all but the last under no_grad: (x, g) pairs come from the last cycle only
    (as many x as g), and F averages over the tokens a gradient reached, not over every call."""
    import torch

    from acbench.calibration.engine import CalibSpec, calibrate
    from acbench.model.groups import find_input_groups
    from acbench.studies.architectures import tiny_model

    model = tiny_model("hrm_text")
    groups = find_input_groups(model)
    ids = torch.randint(3, 100, (2, 16), generator=torch.Generator().manual_seed(0))
    grads, calls = [], []

    def pre(module, args):
        calls.append(args[0].shape[:-1].numel())
        if args[0].requires_grad:
            args[0].register_hook(lambda g: grads.append(g.detach().reshape(-1, g.shape[-1]).double()))

    handle = groups[0].sites[0].register_forward_pre_hook(pre)
    stats = calibrate(model, groups[:1], ids, frozenset({"C", "F", "pairs"}), CalibSpec(pair_tokens=16),
                      progress=False)[groups[0].name]
    handle.remove()
    assert stats.xs.shape == stats.gs.shape and stats.n_tokens == sum(calls) > 32  # several calls per forward
    g = torch.cat(grads)
    assert g.shape[0] < stats.n_tokens  # the gradient reached only some calls
    torch.testing.assert_close(stats.F, g.T @ g / g.shape[0], rtol=1e-4, atol=1e-12)


def test_an_expert_of_a_module_list_the_trace_never_routes_to_is_one_line():
    """Experts kept as a module list (not transformers' fused experts, which every expert's trace runs): one the
    4-token trace did not route to cannot be calibrated, and staying dense would be silent, so it is one line."""
    import torch
    from torch import nn

    from acbench.model.groups import find_input_groups

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_attn = nn.Linear(8, 8)
            self.experts = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))

        def forward(self, x):
            return self.experts[0](self.q_attn(x))  # a router that always picks expert 0

    class Toy(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(16, 8)
            self.layers = nn.ModuleList(Block() for _ in range(2))

        def forward(self, input_ids, **kwargs):
            x = self.embed(input_ids)
            for b in self.layers:
                x = b(x)
            return x

    with pytest.raises(UserError, match=r"layers\.0\.experts\.1 is an expert the traced forward did not route to") as e:
        find_input_groups(Toy())
    assert "\n" not in str(e.value) and torch.is_tensor(Toy()(torch.zeros(1, 4, dtype=torch.long)))


def test_a_type_gets_its_seconds_on_the_clock_once_its_worker_started():
    """--seconds 1 let a type run 61 s (the start-up allowance was added to every type, and the wait went in 5 s
    steps): the worker's next message is awaited for exactly the given time, and a worker that ended still has its
    last message read."""
    import queue
    import time

    from acbench.studies.architectures import _next_message

    class Alive:
        def is_alive(self):
            return True

    class Ended:
        def is_alive(self):
            return False

    t0 = time.monotonic()
    assert _next_message(queue.Queue(), Alive(), 0.3) is None
    assert 0.3 <= time.monotonic() - t0 < 1.3
    q = queue.Queue()
    q.put({"model_type": "llama"})
    assert _next_message(q, Ended(), 5) == {"model_type": "llama"}
    assert _next_message(queue.Queue(), Ended(), 5) is None
