"""Perplexity under two named protocols: `ppl-token` (SVD-LLM/GPTQ windows) and `ppl-word` (lm-eval rolling)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from .base import RunShared, Shortcut, Task, TaskResult, base_model, mean_stderr, model_device, next_token_nll
from acbench.core.registry import added_setting, keyed_settings

from .data.text_data import evaluation_windows, load_text, resolve_bos, sliding_windows


token_windows = evaluation_windows


@torch.no_grad()
def window_nll(model, windows: torch.Tensor, batch_size: int, progress: bool = True,
               scored: int | None = None) -> torch.Tensor:
    """Per window: summed NLL of tokens 2..T given their prefix (labels shifted once); with `scored`, of its last
    `scored` tokens only."""
    device = model_device(model)
    out = []
    for start in tqdm(range(0, len(windows), batch_size), desc="ppl", disable=not progress, leave=False):
        ids = windows[start:start + batch_size].to(device)
        hidden = base_model(model)(input_ids=ids, use_cache=False).last_hidden_state
        nll = next_token_nll(model, hidden[:, :-1], ids[:, 1:])
        out.append((nll if scored is None else nll[:, -scored:]).sum(1).cpu())
    return torch.cat(out)


@dataclass(frozen=True)
class PPLTokenSettings:
    source: str = "wiki"  # wiki (embedded eval articles) | wikitext2 | file:<path>
    seq_len: int = 256
    max_windows: int | None = 16  # None: every window of the text
    batch_size: int = 2
    # BOS protocol shared with calibration: window | stream | none | auto (window if the tokenizer adds BOS)
    bos: str = "auto"
    # sliding windows (TEAL's protocol): each window advances by `scored` tokens and is scored on its last `scored`
    # only, the rest its context; None: non-overlapping windows scored on every token after the first
    scored: int | None = added_setting(None)

    def minimums(self):
        return {"seq_len": (self.seq_len, 2), "batch_size": (self.batch_size, 1), "max_windows": (self.max_windows, 1),
                "scored": (self.scored, 1)}

    @property
    def scored_per_window(self) -> int:
        return self.seq_len - 1 if self.scored is None else self.scored

    def windows(self, tokenizer, bos: str) -> torch.Tensor:
        text = load_text(self.source, "eval")
        if self.scored is None:
            return token_windows(tokenizer, text, self.seq_len, self.max_windows, bos)
        return sliding_windows(tokenizer, text, self.seq_len, self.scored, self.max_windows, bos)


class PPLToken(Task):
    name = "ppl-token"
    # 2: the NLL from a running log-sum-exp over vocabulary slices (acbench.tasks.base.next_token_nll); version 1's float32
    # log-softmax came out 2e-4 nats per token below a float64 reference on Gemma's 262k words (ppl 0.02 % low)
    version = 2
    description = "token perplexity: exp(mean NLL) over non-overlapping seq_len windows (SVD-LLM/GPTQ protocol)"
    higher_is_better = {"ppl": False, "nll": False}
    primary_metric = "ppl"
    Settings = PPLTokenSettings
    label, order = "PPL (ppl-token)", 2
    margin = 0.02  # nats of mean NLL: perplexity within 2 %
    shortcuts = (Shortcut("--ppl-windows", "max_windows", "perplexity windows (default 16)"),
                 Shortcut("--ppl-seq-len", "seq_len", "tokens per perplexity window (default 256)"),
                 Shortcut("--text-source", "source", "evaluation text: wiki, wikitext2, c4, file:<path>"))

    @classmethod
    def run_settings(cls, shared: RunShared) -> dict:
        # at most two windows per forward, as runs always sized it (the batch size is part of the cell key)
        return {"batch_size": min(shared.batch_size, 2), "bos": shared.bos}

    def size_note(self) -> str:
        s = self.settings
        slide = "" if s.scored is None else f" sliding, the last {s.scored} scored"
        return f"ppl-token {s.max_windows or 'all'} x {s.seq_len} tokens{slide}"

    def check(self, tokenizer) -> None:
        self.settings.windows(tokenizer, resolve_bos(tokenizer, self.settings.bos))

    def item_pool(self, tokenizer) -> list | None:
        """The windows --ppl-windows allows (every window of the text by default under --until-decided), in a
        seeded random order (seed 0): (index in the text, window) pairs."""
        s = self.settings
        self._pool_bos = bos = resolve_bos(tokenizer, s.bos)
        windows = s.windows(tokenizer, bos)
        order = torch.randperm(len(windows), generator=torch.Generator().manual_seed(0)).tolist()
        return [(i, windows[i]) for i in order]

    def score_items(self, model, tokenizer, items: list, progress: bool = True) -> list[dict]:
        s = self.settings
        nll = window_nll(model, torch.stack([w for _, w in items]), s.batch_size, progress,
                         s.scored) / s.scored_per_window
        return [{"window": i, "nll": float(v)} for (i, _), v in zip(items, nll.tolist())]

    def item_identity(self, item) -> dict:
        return {"window": item[0]}

    def result_of(self, records: list[dict]) -> TaskResult:
        return self._result([r["nll"] for r in records], [r["window"] for r in records], self._pool_bos)

    def _result(self, per_window: list[float], index: list[int], bos: str) -> TaskResult:
        s = self.settings
        nll, nll_se = mean_stderr(per_window)
        ppl = math.exp(nll) if nll < 700 else float("inf")  # a destroyed model's perplexity overflows: stored as null
        return TaskResult(
            metrics={"ppl": ppl, "nll": nll},
            stderr={"ppl": ppl * nll_se, "nll": nll_se},  # delta method
            details={"protocol": "ppl-token" if s.scored is None else "ppl-token sliding", "bos": bos,
                     "n_windows": len(per_window), "n_tokens": len(per_window) * s.scored_per_window,
                     "window": s.seq_len, "scored_per_window": s.scored_per_window},
            records=[{"window": i, "nll": float(v)} for i, v in zip(index, per_window)],
            config={**keyed_settings(s), "bos": bos},
        )

    def evaluate(self, model, tokenizer, progress=True) -> TaskResult:
        s = self.settings
        bos = resolve_bos(tokenizer, s.bos)
        windows = s.windows(tokenizer, bos)
        per_window = window_nll(model, windows, s.batch_size, progress, s.scored) / s.scored_per_window
        return self._result(per_window.tolist(), list(range(len(windows))), bos)


@dataclass(frozen=True)
class PPLWordSettings:
    source: str = "wiki"
    max_docs: int | None = 16
    max_length: int = 512
    batch_size: int = 1


class PPLWord(Task):
    name = "ppl-word"
    description = "word perplexity via lm-eval's loglikelihood_rolling over whole documents"
    higher_is_better = {"word_ppl": False, "byte_ppl": False}
    primary_metric = "word_ppl"
    Settings = PPLWordSettings
    label, order = "PPL (ppl-word)", 3
    margin = 0.02  # nats of mean NLL per word
    shortcuts = (Shortcut("--ppl-windows", "max_docs", "perplexity windows (ppl-word: documents; default 16)"),
                 Shortcut("--text-source", "source", "evaluation text: wiki, wikitext2, c4, file:<path>"))

    def size_note(self) -> str:
        return f"ppl-word {self.settings.max_docs or 'all'} documents"

    def check(self, tokenizer) -> None:
        load_text(self.settings.source, "eval")

    def evaluate(self, model, tokenizer, progress=True) -> TaskResult:
        from .lm_eval_bridge import make_lm, rolling_loglikelihood

        s = self.settings
        docs = [d for d in load_text(s.source, "eval").split("\n\n") if d.strip()]
        if s.max_docs:
            docs = docs[: s.max_docs]
        lm = make_lm(model, tokenizer, batch_size=s.batch_size, max_length=s.max_length)
        lls = rolling_loglikelihood(lm, docs)
        words = sum(len(re.split(r"\s+", d.strip())) for d in docs)
        nbytes = sum(len(d.encode("utf-8")) for d in docs)
        total = sum(lls)
        return TaskResult(
            metrics={"word_ppl": math.exp(-total / words), "byte_ppl": math.exp(-total / nbytes)},
            details={"protocol": "ppl-word (lm-eval loglikelihood_rolling)", "n_docs": len(docs), "n_words": words},
            config=dict(s.__dict__),
        )
