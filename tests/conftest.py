import atexit
import os
import shutil
import tempfile

import pytest
import torch

# Without CUDA, the decode path's Triton kernel is tested in triton's interpreter, which must be on before triton is
# first imported (its language functions are built for one mode at import).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig
from core.stats import ACTIVATION_STATS, GRADIENT_STATS

# The statistics cache is the suite's own, never the user's: one folder for module- and session-scoped fixtures,
# and one per test (private_stats_cache), so no test reads statistics another wrote or a user's run left.
_SESSION_STATS = tempfile.mkdtemp(prefix="acbench-test-stats-")
os.environ["ACBENCH_STATS_CACHE"] = _SESSION_STATS
atexit.register(shutil.rmtree, _SESSION_STATS, True)


@pytest.fixture(autouse=True)
def private_stats_cache(tmp_path_factory, monkeypatch):
    folder = tmp_path_factory.mktemp("stats-cache")
    monkeypatch.setenv("ACBENCH_STATS_CACHE", str(folder))
    return folder


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


EVERY_STAT = ACTIVATION_STATS | GRADIENT_STATS  # every statistic a method can ask for


def calibrated_tiny(windows: int, seq_len: int, pair_tokens: int, hidden: int = 48, inter: int = 64):
    """A tiny random Llama and every statistic of every group, from `windows` random token windows (seed 0)."""
    from bench.calibrate import CalibSpec, calibrate
    from bench.groups import find_input_groups

    model = tiny_model("llama", hidden=hidden, inter=inter)
    ids = torch.randint(0, 101, (windows, seq_len), generator=torch.Generator().manual_seed(0))
    stats = calibrate(model, find_input_groups(model), ids, EVERY_STAT, CalibSpec(pair_tokens=pair_tokens),
                      progress=False)
    return model, stats


@pytest.fixture(params=["llama", "gemma3"])
def arch(request):
    return request.param


@pytest.fixture
def windows():
    gen = torch.Generator().manual_seed(1)
    return torch.randint(0, 101, (8, 24), generator=gen)


def readme_example(first_line: str) -> dict:
    """Run the README's python block that starts with `first_line`; its namespace (the README's code is real)."""
    import re
    from pathlib import Path

    readme = (Path(__file__).parent.parent / "README.md").read_text()
    code = re.search(r"```python\n(" + re.escape(first_line) + r".*?)```", readme, re.S).group(1)
    ns: dict = {}
    exec(compile(code, "README example", "exec"), ns)
    return ns
