"""MMLU in two forms. letter (the default): lm-eval's `mmlu` prompt, prediction = argmax over the four answer-letter
logits, one forward pass each. cloze: lm-eval's `mmlu_continuation` prompt ("Question: ...\nAnswer:"), each
choice's own text scored by its summed log-likelihood after it (the prompt runs once, the four continuations over its
cached keys and values), argmax raw (acc) or per character (acc_norm, OLMES's choice for MMLU): the form models under
about 1B parameters can answer."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from acbench.core.errors import UserError

from .base import RunShared, Shortcut, Task, TaskResult, check_limit, mean_stderr, model_device, stratified_order
from .data.mmlu_data import LETTERS, MMLUQuestion, load_mmlu


def doc_to_text(q: MMLUQuestion) -> str:
    return (f"{q.question.strip()}\nA. {q.choices[0]}\nB. {q.choices[1]}\nC. {q.choices[2]}\nD. {q.choices[3]}"
            "\nAnswer:")


def build_prompt(q: MMLUQuestion, exemplars: list[MMLUQuestion]) -> str:
    """lm-eval's mmlu prompt: description, k exemplars (first_n from dev) each with ' <letter>', then the question."""
    desc = f"The following are multiple choice questions (with answers) about {q.subject.replace('_', ' ')}.\n\n"
    shots = "".join(f"{doc_to_text(e)} {LETTERS[e.answer]}\n\n" for e in exemplars)
    return desc + shots + doc_to_text(q)


def cloze_text(q: MMLUQuestion) -> str:
    return f"Question: {q.question.strip()}\nAnswer:"


def build_cloze_prompt(q: MMLUQuestion, exemplars: list[MMLUQuestion]) -> str:
    """lm-eval's mmlu_continuation prompt: description, k exemplars (first_n from dev) each followed by ' ' and its
    answer's text, then the question."""
    desc = f"The following are questions (with answers) about {q.subject.replace('_', ' ')}.\n\n"
    shots = "".join(f"{cloze_text(e)} {e.choices[e.answer]}\n\n" for e in exemplars)
    return desc + shots + cloze_text(q)


def continuation_ids(tokenizer, context: str, continuation: str) -> list[int]:
    """The continuation's tokens as lm-eval cuts them: trailing spaces of the context move to the continuation, then
    the tokens of context + continuation after those of the context alone (no special tokens either way)."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = tokenizer.encode(context + continuation, add_special_tokens=False)
    return whole[len(tokenizer.encode(context, add_special_tokens=False)):]


def cloze_loglikelihoods(model, tokenizer, qs: list[MMLUQuestion], prompts: list[str], batch_size: int,
                         progress: bool = True) -> list[list[float]]:
    """Summed log P(' ' + choice | prompt) for each question's four choices."""
    from .lama import score_probes

    out: list[list[float]] = []
    for start in tqdm(range(0, len(prompts), batch_size), desc="mmlu (cloze)", disable=not progress, leave=False):
        block = range(start, min(start + batch_size, len(prompts)))
        cands = []
        for i in block:
            ids = [continuation_ids(tokenizer, prompts[i], " " + c) for c in qs[i].choices]
            if not all(ids):
                raise UserError(f"MMLU question {i} ({qs[i].subject}): a choice tokenizes to nothing after its prompt; "
                                "cloze scoring needs every choice to have a token")
            cands.append(ids)
        out += [row.tolist() for row in score_probes(model, tokenizer, [prompts[i] for i in block], cands)]
    return out


def cloze_predictions(lls: list[float], choices: tuple[str, ...] | list[str]) -> tuple[int, int]:
    """(argmax of the summed log-likelihoods, argmax per character of the choice's text), first index on ties."""
    raw = max(range(len(lls)), key=lambda j: (lls[j], -j))
    norm = max(range(len(lls)), key=lambda j: (lls[j] / max(1, len(choices[j])), -j))
    return raw, norm


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
    # letter: lm-eval's mmlu (answer letters); cloze: lm-eval's mmlu_continuation (each answer's text)
    format: str = "letter"
    # the accuracy the cell shows and its records pair on: acc (argmax log-likelihood) or, in cloze form only,
    # acc_norm (per character of the answer's text; OLMES's choice for MMLU, so cloze's default)
    metric: str = ""

    def __post_init__(self):
        if self.limit == 0:  # "0 = all", one spelling in the cell key
            object.__setattr__(self, "limit", None)
        if not self.metric:
            object.__setattr__(self, "metric", "acc_norm" if self.format == "cloze" else "acc")

    def minimums(self):
        if self.format not in FORMATS:
            raise ValueError(f"task 'mmlu': format '{self.format}' is unknown: use {' or '.join(FORMATS)}")
        if self.metric not in FORMATS[self.format]:
            raise ValueError(f"task 'mmlu': metric '{self.metric}' does not score the {self.format} form: use "
                             f"{' or '.join(FORMATS[self.format])}")
        return {"batch_size": (self.batch_size, 1)}


FORMATS = {"letter": ("acc",), "cloze": ("acc_norm", "acc")}  # each form's accuracies, its default first
# The cloze form's questions per subject unless a limit is given: 285 questions, enough to tell SmolLM2-135M's
# 0.32 from chance (0.25; one-sided p = 0.003), which the letter form's default of one per subject (57) cannot
CLOZE_LIMIT = 5


class MMLU(Task):
    name = "mmlu"
    description = "MMLU, 57 subjects, k-shot (lm-eval prompt), letter-logit argmax; micro and macro accuracy"
    higher_is_better = {"acc": True, "acc_macro": True, "acc_norm": True}
    primary_metric = "acc"
    Settings = MMLUSettings
    label, order = "MMLU acc", 0
    margin = 0.02  # two points of accuracy
    shortcuts = (Shortcut("--mmlu-limit", "limit", "MMLU questions per subject (0 = all; default 1, in cloze form 5)"),
                 Shortcut("--mmlu-shots", "shots", "MMLU exemplars (default 0 for the 15-minute run; 5 is standard)"),
                 Shortcut("--mmlu-source", "source", "embedded, hub, or a folder with dev/ and test/ CSVs"),
                 Shortcut("--mmlu-format", "format", "letter (answer letters, lm-eval's mmlu; default) or cloze "
                          "(each answer's text, lm-eval's mmlu_continuation: the form small models can answer)"),
                 Shortcut("--limit", "limit", "MMLU questions per subject and LAMA probes per relation"))

    @classmethod
    def run_settings(cls, shared: RunShared) -> dict:
        return {"seed": shared.seed, "batch_size": shared.batch_size}

    @classmethod
    def from_options(cls, options: dict | None = None):
        options = dict(options or {})
        given = options.get("limit") is not None
        if options.get("format") == "cloze" and not given:
            options["limit"] = CLOZE_LIMIT
        task = super().from_options(options)
        task.limit_given = given  # a default limit (1, or 5 in cloze form) caps any source; a given one is a demand
        return task

    def size_note(self) -> str:
        s = self.settings
        form = f", cloze ({s.metric})" if s.format == "cloze" else ""
        return f"MMLU {s.shots}-shot, {s.limit or 'all'}/subject{form}"

    def settings_dict(self) -> dict:
        out = super().settings_dict()
        if out["format"] == "letter":  # the form added later enters the key only when not the default
            del out["format"], out["metric"]
        return out

    def check(self, tokenizer) -> None:
        from collections import Counter

        test, dev = load_mmlu(self.settings.source)
        if getattr(self, "limit_given", True):
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
        if self.settings.format == "letter":
            letter_token_ids(tokenizer)

    def evaluate(self, model, tokenizer, progress=True) -> TaskResult:
        s = self.settings
        test, dev = load_mmlu(s.source)
        qs = select_questions(test, s.limit, s.seed)
        return self._result(qs, self._score(model, tokenizer, qs, dev, progress), dev)

    def item_pool(self, tokenizer) -> list | None:
        """The questions --mmlu-limit allows (all 14,042 by default under --until-decided), each subject's in a
        seeded order, merged so that every prefix holds the subjects in proportion to their sizes."""
        s = self.settings
        test, self._pool_dev = load_mmlu(s.source)
        self._pool = stratified_order(select_questions(test, s.limit, s.seed), lambda q: q.subject, s.seed)
        return list(self._pool)

    def score_items(self, model, tokenizer, items: list, progress: bool = True) -> list[dict]:
        return self._score(model, tokenizer, items, self._pool_dev, progress)

    def item_identity(self, item) -> dict:
        return {"subject": item.subject, "gold": LETTERS[item.answer]}

    def result_of(self, records: list[dict]) -> TaskResult:
        return self._result(self._pool[:len(records)], records, self._pool_dev)  # scored in pool order

    def _score(self, model, tokenizer, qs, dev, progress) -> list[dict]:
        """One record per question: its prediction, gold and "correct" (cloze: under each normalisation too)."""
        s = self.settings
        if s.format != "cloze":
            prompts = [build_prompt(q, dev.get(q.subject, [])[: s.shots]) for q in qs]
            preds = score_prompts(model, tokenizer, prompts, s.batch_size, progress).argmax(1).tolist()
            return [{"subject": q.subject, "pred": LETTERS[p], "gold": LETTERS[q.answer], "correct": int(p == q.answer),
                     "chance": 0.25} for q, p in zip(qs, preds)]
        prompts = [build_cloze_prompt(q, dev.get(q.subject, [])[: s.shots]) for q in qs]
        lls = cloze_loglikelihoods(model, tokenizer, qs, prompts, s.batch_size, progress)
        preds = [cloze_predictions(ll, q.choices) for ll, q in zip(lls, qs)]
        shown = 1 if s.metric == "acc_norm" else 0
        # "correct" follows the accuracy shown, which the paired tests and recovery read; both kept
        return [{"subject": q.subject, "pred": LETTERS[p[shown]], "gold": LETTERS[q.answer],
                 "correct": int(p[shown] == q.answer), "correct_acc": int(p[0] == q.answer),
                 "correct_acc_norm": int(p[1] == q.answer), "loglikelihoods": [round(v, 6) for v in ll],
                 "chance": 0.25} for q, p, ll in zip(qs, preds, lls)]

    def _result(self, qs, records: list[dict], dev) -> TaskResult:
        s = self.settings
        if s.format != "cloze":
            metrics, stderr, details = self._aggregate(qs, [float(r["correct"]) for r in records], dev)
            return TaskResult(metrics=metrics, stderr=stderr, details=details, records=records,
                              config={"n_questions": len(qs), **s.__dict__})
        right = {"acc": [float(r["correct_acc"]) for r in records],
                 "acc_norm": [float(r["correct_acc_norm"]) for r in records]}
        metrics, stderr, details = self._aggregate(qs, right[s.metric], dev)  # its "acc" is the shown accuracy's
        metrics, stderr = {s.metric: metrics.pop("acc"), **metrics}, {s.metric: stderr.pop("acc"), **stderr}
        other = "acc" if s.metric == "acc_norm" else "acc_norm"
        metrics[other], stderr[other] = mean_stderr(right[other])
        return TaskResult(metrics=metrics, stderr=stderr, details=details, records=records,
                          config={"n_questions": len(qs), **s.__dict__}, primary_metric=s.metric)

    def _aggregate(self, qs, correct: list[float], dev) -> tuple[dict, dict, dict]:
        """(metrics, stderr, details) of per-question 0/1 scores: micro accuracy ("acc"), macro over subjects."""
        s = self.settings
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
        return ({"acc": acc, "acc_macro": macro}, {"acc": acc_se, "acc_macro": macro_se},
                {"acc_per_subject": subj_acc, "n_per_subject": {k: len(v) for k, v in per_subject.items()},
                 "shots_used": {k: v for k, v in shots_used.items() if v != s.shots}})
