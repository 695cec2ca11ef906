"""Training the emergence experiment's model: a small Llama on the synthetic fact corpus, checkpointed at
log-spaced steps as ordinary transformers checkpoints (`bench run --model <checkpoint>` loads them).

Deterministic by construction: the initial weights come from the seed, the batch of step t from (seed, t), the
learning rate from t, so a run killed at any point resumes from its last checkpoint (weights, optimizer moments,
step; safetensors and JSON, nothing pickled) and reaches the same weights as one that never stopped.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from acbench.core.io import atomic_write_json

SPECIAL_TOKENS = ("<pad>", "<unk>", "<s>", "</s>")


@dataclass(frozen=True)
class TrainConfig:
    layers: int = 4
    d_model: int = 128
    steps: int = 3000
    batch_size: int = 32
    seq_len: int = 64
    lr: float = 3e-3
    warmup: int = 100
    weight_decay: float = 0.01
    seed: int = 0

    def model_config(self, vocab_size: int):
        from transformers import LlamaConfig

        heads = max(1, self.d_model // 64)
        return LlamaConfig(vocab_size=vocab_size, hidden_size=self.d_model,
                           intermediate_size=64 * math.ceil(8 * self.d_model / 3 / 64), num_hidden_layers=self.layers,
                           num_attention_heads=heads, num_key_value_heads=heads,
                           max_position_embeddings=self.seq_len, tie_word_embeddings=True, pad_token_id=0,
                           bos_token_id=2, eos_token_id=3)


def checkpoint_steps(steps: int, spacing: str = "log") -> list[int]:
    """0 and every power of two from 16 below `steps`, then `steps` ("log"); or ten even steps ("linear")."""
    if spacing == "linear":
        return sorted({round(steps * i / 10) for i in range(11)})
    out = [0] + [2 ** k for k in range(4, 31) if 2 ** k < steps]
    return out + [steps] if steps > 0 else out


def word_tokenizer(words: list[str]):
    """A word-level tokenizer over the corpus (whitespace words; every value one token); no BOS is added."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(list(SPECIAL_TOKENS) + [w for w in words if w not in SPECIAL_TOKENS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # words joined by spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>")


def token_stream(tokenizer, documents: list[str]) -> torch.Tensor:
    ids = []
    for doc in documents:
        ids += tokenizer.encode(doc, add_special_tokens=False) + [tokenizer.eos_token_id]
    return torch.tensor(ids, dtype=torch.long)


def batch_at(stream: torch.Tensor, cfg: TrainConfig, step: int) -> torch.Tensor:
    """The batch of one step: windows at offsets drawn from (seed, step) alone, so a resumed run sees the same."""
    g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
    starts = torch.randint(0, len(stream) - cfg.seq_len, (cfg.batch_size,), generator=g)
    return torch.stack([stream[s:s + cfg.seq_len] for s in starts.tolist()])


def lr_at(cfg: TrainConfig, step: int) -> float:
    """Linear warm-up, then cosine decay to a tenth."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * min(t, 1.0))))


def _optimizer(model, cfg: TrainConfig):
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    rest = [p for n, p in model.named_parameters() if p.ndim < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": rest, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))


def save_checkpoint(folder: Path, model, tokenizer, opt, step: int, cfg: TrainConfig) -> None:
    """An ordinary transformers checkpoint plus the optimizer's moments, written to a temp folder and renamed
    (a checkpoint folder with state.json is complete)."""
    from safetensors.torch import save_file

    tmp = folder.with_name(folder.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    state = opt.state_dict()
    tensors = {f"{i}.{k}": v.contiguous() for i, st in state["state"].items() for k, v in st.items()}
    save_file(tensors, str(tmp / "optimizer.safetensors"))
    groups = [{k: v for k, v in g.items() if k != "params"} | {"params": g["params"]} for g in state["param_groups"]]
    atomic_write_json(tmp / "state.json", {"step": step, "train": asdict(cfg), "param_groups": groups})
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)


def load_checkpoint(folder: Path, cfg: TrainConfig):
    """(model, optimizer, step) from a complete checkpoint folder."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    opt = _optimizer(model, cfg)
    info = json.loads((folder / "state.json").read_text())
    flat = load_file(str(folder / "optimizer.safetensors"))
    state: dict = {}
    for key, v in flat.items():
        i, name = key.split(".", 1)
        state.setdefault(int(i), {})[name] = v
    opt.load_state_dict({"state": state, "param_groups": info["param_groups"]})
    return model, opt, info["step"]


def checkpoint_name(tag: str, step: int) -> str:
    return f"{tag}-step{step:06d}"


def train(folder: Path, tag: str, tokenizer, documents: list[str], cfg: TrainConfig, spacing: str = "log",
          progress: bool = True) -> list[Path]:
    """Train (or resume) and return the checkpoint folders in step order; `tag` names them (and their results)."""
    from transformers import AutoModelForCausalLM

    if not progress:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    folder.mkdir(parents=True, exist_ok=True)
    steps = checkpoint_steps(cfg.steps, spacing)
    paths = [folder / checkpoint_name(tag, s) for s in steps]
    done = [p for p in paths if (p / "state.json").exists()]
    if done:
        saved = json.loads((done[-1] / "state.json").read_text()).get("train")
        if saved != asdict(cfg):
            from acbench.core.errors import UserError

            raise UserError(f"{done[-1]} holds a training run with other training settings ({saved}): pass "
                            "another --work folder or delete it")
        model, opt, start = load_checkpoint(done[-1], cfg)
    else:
        torch.manual_seed(cfg.seed)
        model, start = AutoModelForCausalLM.from_config(cfg.model_config(len(tokenizer))), 0
        opt = _optimizer(model, cfg)
        save_checkpoint(paths[0], model, tokenizer, opt, 0, cfg)
    stream = token_stream(tokenizer, documents)
    model.train()
    t0 = time.perf_counter()
    for step in tqdm(range(start, cfg.steps), desc=f"train {tag}", disable=not progress, initial=start,
                     total=cfg.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(cfg, step)
        ids = batch_at(stream, cfg, step)
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step + 1 in steps:
            model.eval()
            save_checkpoint(folder / checkpoint_name(tag, step + 1), model, tokenizer, opt, step + 1, cfg)
            model.train()
    if start < cfg.steps:
        atomic_write_json(folder / f"{tag}-train.json", {"seconds": time.perf_counter() - t0, "from_step": start,
                                                          "steps": cfg.steps})
    return paths
