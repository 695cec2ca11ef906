"""Every architecture the coverage table passes (docs/architectures.md) compresses, saves a checkpoint that reloads
to the same logits, and is evaluated from that checkpoint by `bench run`, as a user types it (issue 76, class 1):
`bench compress` of a tiny GPT-2 used to save a checkpoint that `bench run` then refused, its sizes spelled under
a model type acbench names itself."""

from __future__ import annotations

import contextlib
import functools
import io
from pathlib import Path

import pytest

from bench.cli import main

ROOT = Path(__file__).resolve().parent.parent
# the shapes a checkpoint had to learn, run in the fast suite: sizes spelled n_embd / d_model (GPT-2, GPT-J, MPT), a
# causal LM on a config the auto mapping does not key (Emu3), a get_decoder that answers with the causal LM itself
# (Mllama), experts split per expert (Mixtral), a hybrid whose cache holds no attention layer (Bailing), a decoder
# named like a head (ModernBERT), fused experts left dense (Llama 4, attention only), weights rescaled in place (RWKV)
FAST = ("gpt2", "gptj", "mpt", "emu3", "mllama", "mixtral", "bailing_hybrid", "modernbert-decoder", "llama4_text",
        "rwkv")


@functools.lru_cache(maxsize=1)
def _passing() -> dict[str, bool]:
    from studies.architectures import passing_types

    return passing_types((ROOT / "docs" / "architectures.md").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def tokenizer():
    from studies.architectures import tiny_tokenizer

    return tiny_tokenizer()


def compress_save_and_run(model_type: str, tmp: Path, tokenizer) -> None:
    from studies.architectures import save_tiny

    source = save_tiny(model_type, tmp / model_type, tokenizer)
    saved = tmp / f"{model_type}-pca"
    said = io.StringIO()
    # pca: a projection method, as the table's own save check (fasc-kfac) deploys, from activations alone; attention
    # only where the table says the experts are fused
    only = ["--groups", "attn_in", "attn_out"] if _passing()[model_type] else []
    with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()) as out:
        rc = main(["compress", "--model", str(source), "--method", "pca", "--rank", "0.5", "--save", str(saved),
                   "--calib-samples", "2", "--calib-seq-len", "16", "--quiet", *only])
        assert rc == 0, said.getvalue()[-400:]
        assert "reloaded and checked: logits within" in out.getvalue()
        rc = main(["run", "--model", str(saved), "--methods", "dense", "--tasks", "ppl-token", "--ppl-windows", "1",
                   "--ppl-seq-len", "16", "--output", str(tmp / "results"), "--quiet", "--no-latency",
                   "--no-report"])
        assert rc == 0, said.getvalue()[-400:]
    assert list((tmp / "results").rglob("ppl-token-*.json"))


def test_the_table_lists_the_fast_types_as_passing():
    assert set(FAST) <= set(_passing()) and len(_passing()) >= 140


@pytest.mark.parametrize("model_type", FAST)
def test_a_checkpoint_of_each_shape_is_evaluated_by_bench_run(model_type, tmp_path, tokenizer):
    compress_save_and_run(model_type, tmp_path, tokenizer)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", [t for t in _passing() if t not in FAST])
def test_every_passing_architecture_compresses_saves_reloads_and_runs(model_type, tmp_path, tokenizer):
    compress_save_and_run(model_type, tmp_path, tokenizer)
