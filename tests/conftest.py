import pytest
import torch
from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig


def tiny_config(arch: str = "llama", hidden: int = 32, inter: int = 48, layers: int = 2, vocab: int = 101):
    if arch == "llama":
        return LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                           tie_word_embeddings=False)
    if arch == "gemma3":
        return Gemma3TextConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                                num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                max_position_embeddings=256, sliding_window=16,
                                layer_types=["sliding_attention", "full_attention"][:layers] * (layers // 2 or 1))
    raise ValueError(arch)


def tiny_model(arch: str = "llama", seed: int = 0, **kw):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, **kw), dtype=torch.float32)
    return model.eval()


@pytest.fixture(params=["llama", "gemma3"])
def arch(request):
    return request.param


@pytest.fixture
def windows():
    gen = torch.Generator().manual_seed(1)
    return torch.randint(0, 101, (8, 24), generator=gen)
