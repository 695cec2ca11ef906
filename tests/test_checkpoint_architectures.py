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

from acbench.cli import main

ROOT = Path(__file__).resolve().parent.parent
# the shapes a checkpoint had to learn, run in the fast suite: sizes spelled n_embd / d_model (GPT-2, GPT-J, MPT), a
# causal LM on a config the auto mapping does not key (Emu3), a get_decoder that answers with the causal LM itself
# (Mllama), experts split per expert (Mixtral), a hybrid whose cache holds no attention layer (Bailing), a decoder
# named like a head (ModernBERT), fused experts left dense (Llama 4, attention only), weights rescaled in place (RWKV)
FAST = ("gpt2", "gptj", "mpt", "emu3", "mllama", "mixtral", "bailing_hybrid", "modernbert-decoder", "llama4_text",
        "rwkv")


@functools.lru_cache(maxsize=1)
def _passing() -> dict[str, bool]:
    from acbench.studies.architectures import passing_types

    return passing_types((ROOT / "docs" / "architectures.md").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def tokenizer():
    from acbench.studies.architectures import tiny_tokenizer

    return tiny_tokenizer()


def compress_save_and_run(model_type: str, tmp: Path, tokenizer) -> None:
    from acbench.studies.architectures import save_tiny

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
@pytest.mark.parametrize("half", [0, 1])
def test_every_passing_architecture_compresses_saves_reloads_and_runs(half, tmp_path, tokenizer):
    """The other 138 types, in two halves (one per CI worker; a test per type cost twice the time in pytest's own
    overhead): every one compresses, saves, reloads and runs, and the failures are listed together."""
    types = [t for t in _passing() if t not in FAST][half::2]
    failed = {}
    for model_type in types:
        try:
            compress_save_and_run(model_type, tmp_path, tokenizer)
        except AssertionError as e:
            failed[model_type] = str(e).splitlines()[0][-300:]
    assert not failed, failed


# ---------------------------------------------------------------- what a checkpoint must be, or be refused as

def _one_line(argv) -> str:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(argv)
    lines = [line for line in err.getvalue().splitlines() if line.strip() and "it/s]" not in line]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err.getvalue(), err.getvalue()[-600:]
    return lines[0]


def _run_dense(model: Path, out: Path) -> list[str]:
    return ["run", "--model", str(model), "--methods", "dense", "--tasks", "ppl-token", "--ppl-windows", "1",
            "--ppl-seq-len", "16", "--output", str(out), "--quiet", "--no-latency", "--no-report"]


def test_a_save_that_reloads_to_another_model_is_refused_and_leaves_nothing(tmp_path, tokenizer):
    """Falcon-H1's compressed checkpoint reloads with other logits (its save and load disagree): the save is refused
    in one line saying so, and no folder is left at --save (it used to save with exit 0, and bench run then gave
    NaN losses blamed on the run's sizes)."""
    from acbench.studies.architectures import save_tiny

    source = save_tiny("falcon_h1", tmp_path / "falcon_h1", tokenizer)
    line = _one_line(["compress", "--model", str(source), "--method", "pca", "--rank", "0.5", "--save",
                      str(tmp_path / "saved"), "--calib-samples", "2", "--calib-seq-len", "16", "--quiet"])
    assert "is not saved: the checkpoint written reloads to another model (logits differ by" in line
    assert not (tmp_path / "saved").exists() and not list(tmp_path.glob(".saved.partial-*"))


def test_a_compressed_model_with_non_finite_logits_is_not_saved(tmp_path):
    import torch

    from acbench.model.checkpoint import verify_reload
    from acbench.core.errors import UserError
    from conftest import tiny_model

    model = tiny_model("llama")
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight[0, 0] = float("nan")
    with pytest.raises(UserError, match="produces non-finite logits on 8 tokens"):
        verify_reload(model, tmp_path / "never-read", tmp_path / "saved")


def test_weights_a_config_does_not_use_are_refused(tmp_path, tiny):
    """num_hidden_layers 1 over two blocks' weights ran as a one-block model under the folder's name, exit 0."""
    import json
    import shutil

    folder = tmp_path / "fewer"
    shutil.copytree(tiny, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["num_hidden_layers"] = 1
    (folder / "config.json").write_text(json.dumps(cfg))
    line = _one_line(_run_dense(folder, tmp_path / "out"))
    assert "tensor(s) its config.json does not use (model.layers.1." in line and "num_hidden_layers" in line
    assert not list((tmp_path / "out").rglob("*.json"))


def test_a_model_whose_scores_are_not_finite_is_named_as_producing_them(tmp_path, tiny):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny)
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.fill_(float("nan"))
    model.save_pretrained(tmp_path / "nan")
    AutoTokenizer.from_pretrained(tiny).save_pretrained(tmp_path / "nan")
    line = _one_line(_run_dense(tmp_path / "nan", tmp_path / "out"))
    assert "the model produces non-finite values" in line and "run's sizes" not in line
    assert not list((tmp_path / "out").rglob("ppl-token-*.json"))
