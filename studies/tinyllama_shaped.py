"""A random-weight Llama with TinyLlama-1.1B's shapes, saved as a checkpoint acbench loads (issue 24's 1B proof).

22 blocks, hidden 2048, intermediate 5632, grouped-query attention 32/4, a 32,000-word vocabulary (1.1B parameters,
4.4 GB in float32; no download). The tokenizer is a byte-level BPE of exactly that size trained on the embedded wiki
text's calibration articles (a few seconds), so the token ids fit the embedding. Then, on a quiet machine:

    .venv/bin/python -m acbench.studies.tinyllama_shaped --out /tmp/tinyllama-shaped
    .venv/bin/bench plan --model /tmp/tinyllama-shaped --methods pca whitened-svd fasc-kfac fasc --rank 0.5 \\
        --stats-memory 6GB
    /usr/bin/time -v .venv/bin/bench run --model /tmp/tinyllama-shaped --methods pca whitened-svd fasc-kfac fasc \\
        --rank 0.5 --tasks ppl-token --ppl-windows 4 --stats-memory 6GB --no-latency --output /tmp/tinyllama-results
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch


SHAPES = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
              num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048, rope_theta=10000.0,
              rms_norm_eps=1e-5, tie_word_embeddings=False)


def train_tokenizer(vocab_size: int):
    """A byte-level BPE with <s> (BOS, prepended to every encoding), </s> and <unk>, `vocab_size` words in all."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    from acbench.tasks.data.text_data import wiki_split

    text = wiki_split("calib")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    paragraphs = [p for p in text.split("\n\n") if p.strip()]
    tok.train_from_iterator(paragraphs, trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.add_bos_token = True
    return fast


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="checkpoint folder to write (must not exist)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    out = Path(args.out)
    if out.exists():
        sys.exit(f"{out} exists: pass a new folder to --out")
    from acbench.studies import output_problem

    problem = output_problem(out, "--out", folder=True)
    if problem:
        sys.exit(problem)
    from transformers import AutoModelForCausalLM, LlamaConfig

    t0 = time.perf_counter()
    tok = train_tokenizer(SHAPES["vocab_size"])
    if len(tok) != SHAPES["vocab_size"]:
        sys.exit(f"the trained tokenizer has {len(tok)} words, not {SHAPES['vocab_size']}: the text is too small")
    tok_s = time.perf_counter() - t0
    torch.manual_seed(args.seed)
    cfg = LlamaConfig(**SHAPES, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    n_params = sum(p.numel() for p in model.parameters())
    tmp = out.with_name(out.name + ".partial")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tmp.rename(out)
    print(f"{out}: {n_params / 1e9:.3f}B parameters, tokenizer {len(tok)} words ({tok_s:.0f} s), model built and "
          f"saved in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    from acbench.core.log import console_lines

    with console_lines():  # a script: acbench's lines on its stdout
        main()
