"""MMLU: lm-eval's `mmlu` prompt, prediction = argmax over the four answer-letter logits, one forward pass each."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from core.errors import UserError

from .base import RunShared, Shortcut, Task, TaskResult, check_limit, mean_stderr, model_device
from .data.mmlu_data import LETTERS, MMLUQuestion, load_mmlu


def doc_to_text(q: MMLUQuestion) -> str:
    return (f"{q.question.strip()}\nA. {q.choices[0]}\nB. {q.choices[1]}\nC. {q.choices[2]}\nD. {q.choices[3]}"
            "\nAnswer:")


def build_prompt(q: MMLUQuestion, exemplars: list[MMLUQuestion]) -> str:
    """lm-eval's mmlu prompt: description, k exemplars (first_n from dev) each with ' <letter>', then the question."""
    desc = f"The following are multiple choice questions (with answers) about {q.subject.replace('_', ' ')}.\n\n"
    shots = "".join(f"{doc_to_text(e)} {LETTERS[e.answer]}\n\n" for e in exemplars)
    return desc + shots + doc_to_text(q)


def select_questions(questions: list[MMLUQuestion], limit: int | None, seed: int) -> list[MMLUQuestion]:
    """At most `limit` questions per subject, sampled with a seed (stratified)."""
    by_subject: dict[str, list[MMLUQuestion]] = {}
    for q in questions:
        by_subject.setdefault(q.subject, []).append(q)
    rng = random.Random(seed)
    out = []
    for subject in sorted(by_subject):
        qs = by_subject[subject]
        out.extend(qs if not limit or limit >= len(qs) else rng.sample(qs, limit))
    return out


def letter_token_ids(tokenizer) -> list[int]:
    ids = []
    for letter in LETTERS:
        toks = tokenizer.encode(f" {letter}", add_special_tokens=False)
        if len(toks) != 1:
            raise UserError(f"the tokenizer splits ' {letter}' into {len(toks)} tokens: MMLU letter scoring needs one")
        ids.append(toks[0])
    return ids


@torch.no_grad()
def score_prompts(model, tokenizer, prompts: list[str], batch_size: int, progress: bool = True) -> torch.Tensor:
    """Next-token logits over ' A'..' D' at the end of each prompt: (n, 4). Batches of similar length,
    left-padded with explicit position ids so padding does not change any logit."""
    letters = torch.tensor(letter_token_ids(tokenizer))
    encoded = [tokenizer.encode(p) for p in prompts]
    order = sorted(range(len(prompts)), key=lambda i: -len(encoded[i]))
    out = torch.empty(len(prompts), 4)
    device = model_device(model)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    for start in tqdm(range(0, len(order), batch_size), desc="mmlu", disable=not progress, leave=False):
        idx = order[start:start + batch_size]
        width = max(len(encoded[i]) for i in idx)
        ids = torch.full((len(idx), width), pad, dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for row, i in enumerate(idx):
            ids[row, width - len(encoded[i]):] = torch.tensor(encoded[i])
            mask[row, width - len(encoded[i]):] = 1
        pos = (mask.cumsum(1) - 1).clamp_min(0)
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=pos.to(device),
                       logits_to_keep=1, use_cache=False).logits[:, -1].float().cpu()
        out[idx] = logits[:, letters]
    return out


@dataclass(frozen=True)
class MMLUSettings:
    # 0-shot, one question per subject: the 15-minute default run (5-shot over all questions is the standard)
    shots: int = 0
    limit: int | None = 1  # questions per subject (0 or None: all)
    seed: int = 0
    batch_size: int = 8
    source: str = "embedded"

    def __post_init__(self):
        if self.limit == 0:  # "0 = all", one spelling in the cell key
            object.__setattr__(self, "limit", None)

    def minimums(self):
        return {"batch_size": (self.batch_size, 1)}


class MMLU(Task):
    name = "mmlu"
    description = "MMLU, 57 subjects, k-shot (lm-eval prompt), letter-logit argmax; micro and macro accuracy"
    higher_is_better = {"acc": True, "acc_macro": True}
    primary_metric = "acc"
    Settings = MMLUSettings
    label, order = "MMLU acc", 0
    shortcuts = (Shortcut("--mmlu-limit", "limit", "MMLU questions per subject (0 = all; default 1)"),
                 Shortcut("--mmlu-shots", "shots", "MMLU exemplars (default 0 for the 15-minute run; 5 is standard)"),
                 Shortcut("--mmlu-source", "source", "embedded, hub, or a folder with dev/ and test/ CSVs"),
                 Shortcut("--limit", "limit", "MMLU questions per subject and LAMA probes per relation"))

    @classmethod
    def run_settings(cls, shared: RunShared) -> dict:
        return {"seed": shared.seed, "batch_size": shared.batch_size}

    def size_note(self) -> str:
        return f"MMLU {self.settings.shots}-shot, {self.settings.limit or 'all'}/subject"

    def check(self, tokenizer) -> None:
        from collections import Counter

        test, dev = load_mmlu(self.settings.source)
        check_limit(self.settings.limit, Counter(q.subject for q in test).values(), "--mmlu-limit", "subject")
        most = max((len(v) for v in dev.values()), default=0)
        bare = sorted({q.subject for q in test} - {k for k, v in dev.items() if v})
        if self.settings.shots and bare:  # it would be scored 0-shot under a header that says otherwise
            raise UserError(f"--mmlu-shots {self.settings.shots}: {len(bare)} subject(s) have no dev exemplars "
                            f"({', '.join(bare[:3])}{', ...' if len(bare) > 3 else ''}): add their dev files, or "
                            "pass --mmlu-shots 0")
        if self.settings.shots > most:
            raise UserError(f"--mmlu-shots {self.settings.shots}: the dev set holds at most {most} exemplars per "
                            f"subject: pass 0 to {most} (setting mmlu.shots)")
        letter_token_ids(tokenizer)

    def evaluate(self, model, tokenizer, progress=True) -> TaskResult:
        s = self.settings
        test, dev = load_mmlu(s.source)
        qs = select_questions(test, s.limit, s.seed)
        prompts = [build_prompt(q, dev.get(q.subject, [])[: s.shots]) for q in qs]
        scores = score_prompts(model, tokenizer, prompts, s.batch_size, progress)
        preds = scores.argmax(1).tolist()
        correct = [float(p == q.answer) for p, q in zip(preds, qs)]
        acc, acc_se = mean_stderr(correct)
        per_subject: dict[str, list[float]] = {}
        for q, c in zip(qs, correct):
            per_subject.setdefault(q.subject, []).append(c)
        subj_acc = {k: sum(v) / len(v) for k, v in per_subject.items()}
        macro = sum(subj_acc.values()) / len(subj_acc)
        # stderr of a mean of independent subject means
        macro_se = math.sqrt(sum(mean_stderr(v)[1] ** 2 if len(v) > 1 else 0.0 for v in per_subject.values())) / len(
            per_subject)
        shots_used = {k: min(s.shots, len(dev.get(k, []))) for k in per_subject}
        return TaskResult(
            metrics={"acc": acc, "acc_macro": macro},
            stderr={"acc": acc_se, "acc_macro": macro_se},
            details={"acc_per_subject": subj_acc, "n_per_subject": {k: len(v) for k, v in per_subject.items()},
                     "shots_used": {k: v for k, v in shots_used.items() if v != s.shots}},
            records=[{"subject": q.subject, "pred": LETTERS[p], "gold": LETTERS[q.answer], "correct": int(p == q.answer),
                      "chance": 0.25} for q, p in zip(qs, preds)],
            config={"n_questions": len(qs), **s.__dict__},
        )
