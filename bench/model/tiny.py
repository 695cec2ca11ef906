"""A small twin of a model config: the same architecture with every size field it knows shrunk (widths, heads,
vocabulary, experts; optionally the block count), for tracing a model's structure where its own forward cannot run
(a meta-device model whose architecture reads a value back) and for the architecture coverage table."""

from __future__ import annotations

import copy

LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, VOCAB, LAYERS, EXPERTS = 32, 4, 2, 8, 64, 128, 2, 4

# size fields shrunk wherever a config has them (each family spells them its own way)
SIZES = {
    **dict.fromkeys(("hidden_size", "n_embd", "d_model", "dim", "embed_dim", "model_dim", "lru_width",
                     "attention_hidden_size"), HIDDEN),
    **dict.fromkeys(("num_attention_heads", "n_head", "num_heads", "n_heads", "encoder_attention_heads"), HEADS),
    **dict.fromkeys(("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num"), KV_HEADS),
    **dict.fromkeys(("head_dim", "kv_channels", "attention_head_dim", "v_head_dim", "linear_key_head_dim",
                     "linear_value_head_dim", "swa_head_dim", "linear_head_dim", "dim_head"), HEAD_DIM),
    # linear attention (Qwen3-Next's gated delta rule) counts its own heads
    **dict.fromkeys(("linear_num_key_heads",), KV_HEADS), **dict.fromkeys(("linear_num_value_heads",), HEADS),
    **dict.fromkeys(("intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size", "d_ff", "inner_hidden_size",
                     "mlp_hidden_size", "dense_intermediate_size", "dff", "dim_ff",
                     "mlp_only_intermediate_size", "shared_expert_intermediate_size",
                     "moe_intermediate_size", "expert_intermediate_size"), INTER),
    **dict.fromkeys(LAYER_KEYS, LAYERS),
    **dict.fromkeys(("vocab_size", "vocab_size_per_layer_input", "unpadded_vocab_size"), VOCAB),
    **dict.fromkeys(("hidden_size_per_layer_input", "global_head_dim"), HEAD_DIM),
    **dict.fromkeys(("max_position_embeddings", "n_positions", "n_ctx", "seq_length", "max_seq_len"), 512),
    **dict.fromkeys(("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"), EXPERTS),
    **dict.fromkeys(("num_experts_per_tok", "moe_topk", "top_k", "num_experts_per_token"), 2),
    **dict.fromkeys(("sliding_window",), 16),
    **dict.fromkeys(("rotary_dim",), HEAD_DIM // 2),
    # multi-head latent attention (DeepSeek-V2/V3, MiniCPM3 and their descendants): low-rank query and key-value
    **dict.fromkeys(("qk_rope_head_dim", "qk_nope_head_dim"), HEAD_DIM),
    **dict.fromkeys(("kv_lora_rank", "q_lora_rank"), 2 * HIDDEN // 4),
    # Mamba-2 mixers (Bamba, Granite-MoE-Hybrid, Zamba2): heads x head width must equal expand x hidden (2 x 32)
    **dict.fromkeys(("mamba_n_heads", "n_mamba_heads"), 2 * HIDDEN // HEAD_DIM),
    **dict.fromkeys(("mamba_d_head", "mamba_headdim"), HEAD_DIM), **dict.fromkeys(("mamba_d_ssm",), 2 * HIDDEN),
    **dict.fromkeys(("mamba_d_state", "state_size"), 16), **dict.fromkeys(("mamba_n_groups", "mamba_ngroups"), 1),
    # experts routed in groups (DeepSeek-V3): the groups must divide the shrunk experts
    **dict.fromkeys(("n_group",), 2), **dict.fromkeys(("topk_group",), 1),
}
# size fields some config classes leave None by default (Hunyuan's and Ministral's head_dim, Nemotron's key-value
# heads, DeepSeek-V2's and dots1's expert counts), filled where the field exists and is None
EXPERT_KEYS = ("n_routed_experts", "n_shared_experts", "num_experts_per_tok")
UNSET = {"head_dim": HEAD_DIM, "num_key_value_heads": KV_HEADS, "n_routed_experts": EXPERTS, "n_shared_experts": 1,
         "num_experts_per_tok": 2}
SPLIT_BLOCKS = ("n_input_layers", "n_recurrent_layers", "n_output_layers")
TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id", "sep_token_id")


def _field(cfg, key: str, default=None):
    """A config field as stored: a per-layer attribute (Gemma 4's head_dim) refuses a global read, not its own."""
    if key in vars(cfg):
        return vars(cfg)[key]
    try:
        return getattr(cfg, key, default)
    except Exception:  # noqa: BLE001 - a property that cannot be read globally is not a size this shrinks
        return default


def _has_experts(cfg) -> bool:
    return any(isinstance(_field(cfg, k), int) for k in ("n_routed_experts", "num_experts", "num_local_experts",
                                                          "moe_intermediate_size"))


def _is_block_pattern(v) -> bool:
    return (isinstance(v, list) and len(v) == 1 and isinstance(v[0], list) and len(v[0]) == 2
            and isinstance(v[0][0], list) and v[0][0] and isinstance(v[0][1], int))


def _shrink_overrides(cfg, keep_layers: bool) -> None:
    """A config whose sizes vary by layer (Gemma 4's full-attention head_dim) keeps per-layer overrides: those of
    the blocks kept, their sizes shrunk like the global ones."""
    spec = vars(cfg).get("_heterogeneity_spec")
    overrides = getattr(spec, "per_layer_overrides", None)
    if not isinstance(overrides, dict):
        return
    spec.per_layer_overrides = {
        i: {k: SIZES[k] if k in SIZES and isinstance(v, int) and not isinstance(v, bool) else v for k, v in o.items()}
        for i, o in overrides.items() if keep_layers or i < LAYERS}


def shrink(config, keep_layers: bool = False):
    """The config with every known size field small, its token ids inside the small vocabulary, and its per-layer
    lists cut to the number of blocks."""
    cfg = copy.deepcopy(config)
    blocks = next((_field(config, k) for k in LAYER_KEYS if isinstance(_field(config, k), int)), None)
    # multi-head attention stays multi-head (latent attention expands its keys to every head): grouped heads only
    # where the config groups them
    mha = _field(config, "num_key_value_heads") == _field(config, "num_attention_heads", 0)
    for key, value in SIZES.items():
        if keep_layers and value == LAYERS and key in LAYER_KEYS:
            continue
        current = _field(cfg, key)
        if isinstance(current, int) and not isinstance(current, bool):
            try:
                setattr(cfg, key, value)
            except AttributeError:  # a derived property (falcon's head_dim): it follows the fields it derives from
                pass
    for key, value in UNSET.items():  # defaults a config class leaves None that its model needs to be built
        if key in vars(cfg) and vars(cfg)[key] is None and (key not in EXPERT_KEYS or _has_experts(cfg)):
            setattr(cfg, key, value)
    if mha and isinstance(_field(cfg, "num_key_value_heads"), int):
        cfg.num_key_value_heads = cfg.num_attention_heads
    _shrink_overrides(cfg, keep_layers)
    if all(isinstance(_field(cfg, k), int) for k in ("expand", "state_size", "num_heads", "head_dim", "n_groups")):
        # a Mamba-2 model's own heads (Mamba2Config's num_heads is the mixer's): they tile expand x hidden
        cfg.num_heads, cfg.n_groups = cfg.expand * cfg.hidden_size // cfg.head_dim, 1
    if all(isinstance(_field(cfg, k), int) for k in ("qk_head_dim", "qk_nope_head_dim", "qk_rope_head_dim")):
        # derived at construction: follows its parts
        cfg.qk_head_dim = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    for key in TOKEN_IDS:
        v = _field(cfg, key)
        if isinstance(v, int) and v >= VOCAB:
            setattr(cfg, key, 1)
        elif isinstance(v, list):
            setattr(cfg, key, [t if t < VOCAB else 1 for t in v])
    for key, v in list(vars(cfg).items()):
        if keep_layers or not isinstance(v, list) or len(v) <= LAYERS:
            continue
        if len(v) == blocks or key.endswith(("layer_types", "layers_block_type", "mlp_only_layers",
                                             "layer_types_pattern")):  # one entry per block: the kept blocks'
            v = v[:LAYERS]
            if "heads" in key and all(isinstance(h, int) for h in v):  # per-block head counts shrink as the global
                v = [HEADS] * len(v)
            setattr(cfg, key, v)
    if not keep_layers and _is_block_pattern(_field(cfg, "attention_types")):
        # GPT-Neo: [[pattern, repeats]] expands to one attention kind per block; one pass of the pattern here
        pattern = cfg.attention_types[0][0]
        cfg.attention_types = [[pattern, max(1, LAYERS // len(pattern))]]
    if not keep_layers and all(isinstance(_field(cfg, k), int) for k in SPLIT_BLOCKS):
        # blocks counted by role (Dory: input, recurrent, output): one input and one output block
        for k, n in zip(SPLIT_BLOCKS, (1, 0, 1)):
            setattr(cfg, k, n)
    if hasattr(cfg, "first_k_dense_replace") and not keep_layers:
        cfg.first_k_dense_replace = 1  # one dense block and one mixture-of-experts block
    for key, inner in list(vars(cfg).items()):  # text, vision and audio sub-configs alike
        if key.endswith("_config") and hasattr(inner, "to_dict") and inner is not cfg:
            setattr(cfg, key, shrink(inner, keep_layers))
    if hasattr(cfg, "tie_word_embeddings"):
        cfg.tie_word_embeddings = False
    return _as_reloaded(cfg)


def _as_reloaded(cfg):
    """The config as a checkpoint of it would load: rebuilt from its dict, so the class's own normalisations run on
    the shrunk fields (Gemma 4 makes its last block full attention), and a tiny model equals its own reload."""
    try:
        return type(cfg).from_dict(cfg.to_dict())
    except Exception:  # noqa: BLE001 - a config that does not rebuild from its dict is used as shrunk
        return cfg


