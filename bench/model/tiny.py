"""A small twin of a model config: the same architecture with every size field it knows shrunk (widths, heads,
vocabulary, experts; optionally the block count), for tracing a model's structure where its own forward cannot run
(a meta-device model whose architecture reads a value back) and for the architecture coverage table."""

from __future__ import annotations

import copy

LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, VOCAB, LAYERS, EXPERTS = 32, 4, 2, 8, 64, 128, 2, 4

# size fields shrunk wherever a config has them (each family spells them its own way)
SIZES = {
    **dict.fromkeys(("hidden_size", "n_embd", "d_model", "dim", "embed_dim", "model_dim"), HIDDEN),
    **dict.fromkeys(("num_attention_heads", "n_head", "num_heads", "n_heads", "encoder_attention_heads"), HEADS),
    **dict.fromkeys(("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num"), KV_HEADS),
    **dict.fromkeys(("head_dim", "kv_channels", "attention_head_dim", "v_head_dim"), HEAD_DIM),
    **dict.fromkeys(("intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size", "d_ff", "inner_hidden_size",
                     "mlp_hidden_size", "dense_intermediate_size", "shared_expert_intermediate_size",
                     "moe_intermediate_size", "expert_intermediate_size"), INTER),
    **dict.fromkeys(LAYER_KEYS, LAYERS),
    **dict.fromkeys(("vocab_size",), VOCAB),
    **dict.fromkeys(("max_position_embeddings", "n_positions", "n_ctx", "seq_length", "max_seq_len"), 128),
    **dict.fromkeys(("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"), EXPERTS),
    **dict.fromkeys(("num_experts_per_tok", "moe_topk", "top_k", "num_experts_per_token"), 2),
    **dict.fromkeys(("sliding_window",), 16),
    **dict.fromkeys(("rotary_dim",), HEAD_DIM // 2),
}
TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id", "sep_token_id")


def shrink(config, keep_layers: bool = False):
    """The config with every known size field small, its token ids inside the small vocabulary, and its per-layer
    lists cut to the number of blocks."""
    cfg = copy.deepcopy(config)
    for key, value in SIZES.items():
        if keep_layers and value == LAYERS and key in LAYER_KEYS:
            continue
        if isinstance(getattr(cfg, key, None), int) and not isinstance(getattr(cfg, key), bool):
            try:
                setattr(cfg, key, value)
            except AttributeError:  # a derived property (falcon's head_dim): it follows the fields it derives from
                pass
    for key in TOKEN_IDS:
        v = getattr(cfg, key, None)
        if isinstance(v, int) and v >= VOCAB:
            setattr(cfg, key, 1)
        elif isinstance(v, list):
            setattr(cfg, key, [t if t < VOCAB else 1 for t in v])
    for key, v in list(vars(cfg).items()):
        if not keep_layers and isinstance(v, list) and len(v) > LAYERS and key.endswith(("layer_types", "layers_block_type", "mlp_only_layers",
                                                                   "layer_types_pattern")):
            setattr(cfg, key, v[:LAYERS])
    if hasattr(cfg, "first_k_dense_replace") and not keep_layers:
        cfg.first_k_dense_replace = 1  # one dense block and one mixture-of-experts block
    for key, inner in list(vars(cfg).items()):  # text, vision and audio sub-configs alike
        if key.endswith("_config") and hasattr(inner, "to_dict") and inner is not cfg:
            setattr(cfg, key, shrink(inner, keep_layers))
    if hasattr(cfg, "tie_word_embeddings"):
        cfg.tie_word_embeddings = False
    return cfg


