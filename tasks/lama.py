"""LAMA-style factual probes: candidate objects ranked by the summed log-probability of their tokens.

Several probes' prompts run in one left-padded forward; single-token candidates are scored from the prompt's
last position, and only multi-token candidates run a continuation over the prompt's key-value cache, with the
vocabulary projection at the scored positions alone (Gemma's vocabulary is 262k).
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import random
from dataclasses import dataclass

import torch

from acbench.core.errors import UserError
from acbench.core.registry import added_setting
from tqdm.auto import tqdm

from .base import (RunShared, Shortcut, Task, TaskResult, base_model, check_limit, logits_from_hidden, mean_stderr,
                   model_device, stratified_order, target_logprobs)
from .data.lama_data import LamaSet, Probe, load_lama, sample_probes


def _cache_kwarg(body) -> str:
    """transformers 5 renamed `past_key_values` to `cache` in decoder forwards."""
    return "cache" if "cache" in inspect.signature(body.forward).parameters else "past_key_values"


def candidate_ids(tokenizer, objects) -> list[list[int]]:
    return [tokenizer.encode(" " + o, add_special_tokens=False) for o in objects]


def _prompts_forward(model, tokenizer, prompts: list[str], use_cache: bool = True):
    """One left-padded forward over the prompts (position ids counted from each prompt's first real token):
    the decoder's output and the attention mask."""
    device = model_device(model)
    enc = [tokenizer.encode(p) for p in prompts]
    n = max(len(e) for e in enc)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.full((len(enc), n), pad, dtype=torch.long)
    mask = torch.zeros(len(enc), n, dtype=torch.long)
    for r, e in enumerate(enc):
        ids[r, n - len(e):] = torch.tensor(e)
        mask[r, n - len(e):] = 1
    pos = (mask.cumsum(1) - 1).clamp_min(0)
    out = base_model(model)(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=pos.to(device),
                            use_cache=use_cache)
    return out, mask


@torch.no_grad()
def next_token_logprobs(model, tokenizer, prompts: list[str]) -> torch.Tensor:
    """log P(next token | prompt) over the whole vocabulary, one row per prompt: LAMA's vocabulary protocol."""
    out, _ = _prompts_forward(model, tokenizer, prompts, use_cache=False)
    return torch.log_softmax(logits_from_hidden(model, out.last_hidden_state[:, -1]), -1).cpu()


def vocab_rank(logp: torch.Tensor, gold: int, others: list[int]) -> int:
    """The 0-based rank of `gold` in one row of next-token scores, the subject's other true objects filtered out
    (Petroni et al.); tokens that tie with the gold do not rank above it."""
    scores = logp.clone()
    if others:
        scores[others] = float("-inf")
    return int((scores > scores[gold]).sum())


@torch.no_grad()
def score_probes(model, tokenizer, prompts: list[str], cands: list[list[list[int]]],
                         pair_chunk: int = 256) -> list[torch.Tensor]:
    """Summed log P(candidate tokens | prompt) for every candidate of every probe (one tensor per prompt): one
    left-padded forward over all prompts (position ids counted from each prompt's first real token); single-token
    candidates are read straight from the prompt's
    last-position log-probabilities; only multi-token candidates run a continuation, over the prompt's cached
    keys and values, with the vocabulary projection at their scored positions alone."""
    device = model_device(model)
    body = base_model(model)
    cache_kw = _cache_kwarg(body)
    out, mask = _prompts_forward(model, tokenizer, prompts)
    cache = out.cache if hasattr(out, "cache") else out.past_key_values
    firsts = torch.zeros(len(cands), max(1, max(len(cs) for cs in cands)), dtype=torch.long)
    for r, cs in enumerate(cands):
        firsts[r, :len(cs)] = torch.tensor([c[0] for c in cs], dtype=torch.long)
    first = target_logprobs(model, out.last_hidden_state[:, -1], firsts).cpu()  # padded columns are never read
    scores = [first[r, :len(cs)].clone() for r, cs in enumerate(cands)]
    # Longest first, so each chunk's continuation is padded to nearly its own width.
    pairs = sorted(((r, j) for r, cs in enumerate(cands) for j, c in enumerate(cs) if len(c) > 1),
                   key=lambda rj: -len(cands[rj[0]][rj[1]]))
    for start in range(0, len(pairs), pair_chunk):
        block = pairs[start:start + pair_chunk]
        rows = torch.tensor([r for r, _ in block])
        width = max(len(cands[r][j]) for r, j in block) - 1
        cont = torch.zeros(len(block), width, dtype=torch.long)
        cmask = torch.zeros(len(block), width, dtype=torch.long)
        for b, (r, j) in enumerate(block):
            c = cands[r][j]
            cont[b, : len(c) - 1] = torch.tensor(c[:-1])
            cmask[b, : len(c) - 1] = 1
        kv = copy.deepcopy(cache)
        kv.batch_select_indices(rows.to(device))
        full_mask = torch.cat([mask[rows], cmask], 1)
        cpos = mask[rows].sum(1, keepdim=True) + torch.arange(width)[None]
        hid = body(input_ids=cont.to(device), attention_mask=full_mask.to(device), position_ids=cpos.to(device),
                   use_cache=True, **{cache_kw: kv}).last_hidden_state
        at_b, at_i, targets = [], [], []
        for b, (r, j) in enumerate(block):
            c = cands[r][j]
            for i in range(len(c) - 1):  # position i of the continuation predicts token i + 1 of the candidate
                at_b.append(b), at_i.append(i), targets.append(c[i + 1])
        picked = target_logprobs(model, hid[at_b, at_i], torch.tensor(targets)[:, None])[:, 0].cpu()
        for (b, t), v in zip(zip(at_b, targets), picked.tolist()):
            r, j = block[b]
            scores[r][j] += v
    return scores


def probe_candidates(ls: LamaSet, probe: Probe, max_candidates: int | None, seed: int) -> tuple[str, ...]:
    """The candidates one probe is ranked against: its relation's objects, or, with `max_candidates`, the probe's
    gold objects plus distractors from the relation drawn with a seed of (seed, relation, subject), so every model
    sees the same set and the cost per probe is bounded whatever the number of probes."""
    objs = ls.candidates[probe.relation]
    if not max_candidates or len(objs) <= max_candidates:
        return objs
    gold = [o for o in objs if o in probe.objects]
    rest = [o for o in objs if o not in probe.objects]
    digest = hashlib.sha256(f"{seed}|{probe.relation}|{probe.subject}".encode()).digest()
    rng = random.Random(int.from_bytes(digest[:8], "little"))
    return tuple(sorted(gold + rng.sample(rest, max(0, min(len(rest), max_candidates - len(gold))))))


@dataclass(frozen=True)
class LamaSettings:
    source: str = "embedded"
    # 15 probes per relation (105 of the 1,354 embedded): about 115 ms per probe and variant at 25 candidates on
    # 2 CPU cores, so all probes for 10 variants would not fit the 15-minute default run (0 or None: all)
    per_relation: int | None = 15  # probes per relation (seeded sample)
    # per probe: its gold objects + seeded distractors of its relation (0 or None: every object of the relation)
    max_candidates: int | None = 25
    seed: int = 0
    batch_size: int = 64  # probes whose prompts share one forward (16: 178 ms/probe, 64: 113-137 on 2 cores)
    # candidates: each probe ranked against its candidate set (multi-token objects scored in full); vocab: LAMA as
    # Petroni et al. scored it, the whole vocabulary ranked at [Y], probes with a one-token object only
    protocol: str = added_setting("candidates")  # added later: in the key only when not the default

    def __post_init__(self):
        for name in ("per_relation", "max_candidates"):  # "0 = all", one spelling in the cell key
            if getattr(self, name) == 0:
                object.__setattr__(self, name, None)

    def minimums(self):
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"task 'lama': protocol '{self.protocol}' is unknown: use {' or '.join(PROTOCOLS)}")
        return {"batch_size": (self.batch_size, 1), "max_candidates": (self.max_candidates, 2)}


PROTOCOLS = ("candidates", "vocab")


class LAMA(Task):
    name = "lama"
    description = "LAMA-style cloze probes; candidates ranked by summed log-prob; P@1 (macro over relations), P@10, MRR"
    higher_is_better = {"p@1": True, "p@10": True, "mrr": True, "p@1_micro": True}
    primary_metric = "p@1"
    Settings = LamaSettings
    # 2: candidates scored from a running log-sum-exp over vocabulary slices in float64 (acbench.tasks.base.target_logprobs),
    # as ppl-token since its version 2; version 1's float32 log-softmax over 262k words was 2e-4 nats per token low
    version = 2
    label, order = "LAMA P@1", 1
    margin = 0.02  # two points of P@1
    shortcuts = (Shortcut("--lama-limit", "per_relation", "LAMA probes per relation (0 = all; default 15)"),
                 Shortcut("--lama-candidates", "max_candidates",
                          "LAMA candidates per probe: its gold + seeded distractors (0 = all; default 25)"),
                 Shortcut("--lama-source", "source", "embedded, lama:<dir>:<relations.jsonl>, qa_wikidata:<task.json>"),
                 Shortcut("--limit", "per_relation", "MMLU questions per subject and LAMA probes per relation"))

    @classmethod
    def run_settings(cls, shared: RunShared) -> dict:
        return {"seed": shared.seed}

    def size_note(self) -> str:
        s = self.settings
        if s.protocol == "vocab":
            return f"LAMA {s.per_relation or 'all'} probes/relation, whole vocabulary ranked (vocab protocol)"
        return f"LAMA {s.per_relation or 'all'} probes/relation, <= {s.max_candidates or 'all'} candidates"

    def check(self, tokenizer) -> None:
        from collections import Counter

        ls = load_lama(self.settings.source)
        import dataclasses

        default = next(f.default for f in dataclasses.fields(self.settings) if f.name == "per_relation")
        if self.settings.per_relation != default:  # the default is a cap on any source, not a demand
            check_limit(self.settings.per_relation, Counter(p.relation for p in ls.probes).values(), "--lama-limit",
                        "relation")
        if ls.absent:  # a subset of LAMA's relations is a usual choice: said, and kept in the cell's details
            import sys

            sys.stderr.write(f"LAMA: {len(ls.absent)} relation(s) listed in the relations file have no file in "
                             f"{ls.source} ({', '.join(ls.absent[:5])}{', ...' if len(ls.absent) > 5 else ''}): "
                             "scored without them\n")

    def evaluate(self, model, tokenizer, progress=True, lama_set: LamaSet | None = None) -> TaskResult:
        s = self.settings
        ls = lama_set or load_lama(s.source)
        probes = sample_probes(ls, s.per_relation, s.seed)
        if s.protocol == "vocab":
            return self._evaluate_vocab(model, tokenizer, ls, probes, progress)
        records, missing_gold = self._score_candidates(model, tokenizer, ls, probes, progress)
        return self._aggregate(records, missing_gold, ls, s)

    def item_pool(self, tokenizer) -> list | None:
        """The probes --lama-limit allows (all by default under --until-decided), each relation's in a seeded order,
        merged so that every prefix holds the relations in proportion to their sizes (the j-th of a relation of n
        probes at (j + 1/2) / n)."""
        s = self.settings
        if s.protocol == "vocab":  # records per object, not per probe: evaluated whole
            return None
        self._pool_set = ls = load_lama(s.source)
        return stratified_order(sample_probes(ls, s.per_relation, s.seed), lambda p: p.relation, s.seed)

    def score_items(self, model, tokenizer, items: list, progress: bool = True) -> list[dict]:
        return self._score_candidates(model, tokenizer, self._pool_set, items, progress)[0]

    def item_identity(self, item) -> dict:
        return {"subject": item.subject, "relation": item.relation, "gold": list(item.objects)}

    def result_of(self, records: list[dict]) -> TaskResult:
        missing = [{"subject": r["subject"], "relation": r["relation"], "objects": r["gold"]} for r in records
                   if r["rank"] is None]
        return self._aggregate(records, missing, self._pool_set, self.settings)

    def _score_candidates(self, model, tokenizer, ls: LamaSet, probes: list[Probe], progress: bool
                          ) -> tuple[list[dict], list[dict]]:
        """Each probe ranked against its candidates: (records, probes whose gold is among no candidates)."""
        s = self.settings
        token_ids: dict[str, list[int]] = {}
        records, missing_gold = [], []
        for start in tqdm(range(0, len(probes), s.batch_size), desc="lama", disable=not progress, leave=False):
            batch = probes[start:start + s.batch_size]
            objs = [probe_candidates(ls, p, s.max_candidates, s.seed) for p in batch]
            for os_ in objs:
                for o in os_:
                    if o not in token_ids:
                        token_ids[o] = candidate_ids(tokenizer, [o])[0]
            scores = score_probes(model, tokenizer, [p.prompt for p in batch],
                                  [[token_ids[o] for o in os_] for os_ in objs])
            for probe, os_, sc in zip(batch, objs, scores):
                ranking = sc.argsort(descending=True, stable=True).tolist()
                gold = [i for i, o in enumerate(os_) if o in probe.objects]
                if not gold:
                    missing_gold.append({"subject": probe.subject, "relation": probe.relation,
                                         "objects": probe.objects})
                rank = min((ranking.index(g) for g in gold), default=None)  # best-ranked gold object, 0-based
                records.append({"subject": probe.subject, "relation": probe.relation, "pred": os_[ranking[0]],
                                "gold": list(probe.objects), "rank": rank, "n_candidates": len(os_),
                                "correct": int(rank == 0), "chance": 1.0 / len(os_)})
        return records, missing_gold

    def _evaluate_vocab(self, model, tokenizer, ls: LamaSet, probes: list[Probe], progress: bool) -> TaskResult:
        """One record per (subject, relation, object) whose object is one token of the vocabulary."""
        s = self.settings
        one_token = {}
        for p in probes:
            for o in p.objects:
                if o not in one_token:
                    ids = candidate_ids(tokenizer, [o])[0]
                    one_token[o] = ids[0] if len(ids) == 1 else None
        kept = [p for p in probes if any(one_token[o] is not None for o in p.objects)]
        if not kept:
            raise UserError(f"LAMA vocab protocol: none of the {len(probes)} probes has an object that is one token "
                            "of this tokenizer: use --task-option lama.protocol=candidates")
        records = []
        for start in tqdm(range(0, len(kept), s.batch_size), desc="lama", disable=not progress, leave=False):
            batch = kept[start:start + s.batch_size]
            logp = next_token_logprobs(model, tokenizer, [p.prompt for p in batch])
            for row, probe in zip(logp, batch):
                golds = [(o, one_token[o]) for o in probe.objects if one_token[o] is not None]
                for o, t in golds:
                    others = [u for _, u in golds if u != t]
                    rank = vocab_rank(row, t, others)
                    n = row.numel() - len(others)
                    records.append({"subject": probe.subject, "relation": probe.relation, "gold": o,
                                    "pred": tokenizer.decode([int(row.argmax())]), "rank": rank, "n_candidates": n,
                                    "correct": int(rank == 0), "chance": 1.0 / n})
        result = self._aggregate(records, [], ls, s)
        result.details.update(protocol="vocab", n_probes_kept=len(kept), n_probes_dropped=len(probes) - len(kept))
        return result

    @staticmethod
    def _aggregate(records, missing_gold, ls, s) -> TaskResult:
        def hits(r, n):
            return float(r["rank"] is not None and r["rank"] < n)

        per_rel: dict[str, list[dict]] = {}
        for r in records:
            per_rel.setdefault(r["relation"], []).append(r)
        rel_p1 = {rel: mean_stderr([hits(r, 1) for r in rs])[0] for rel, rs in per_rel.items()}
        by_source: dict[str, list[float]] = {}
        for rel, v in rel_p1.items():
            by_source.setdefault(ls.relation_source.get(rel, ls.source.split(":")[0]), []).append(v)
        p1_per_source = {src: sum(v) / len(v) for src, v in by_source.items()}
        p1_micro, p1_se = mean_stderr([hits(r, 1) for r in records])
        p10, p10_se = mean_stderr([hits(r, 10) for r in records])
        mrr, mrr_se = mean_stderr([0.0 if r["rank"] is None else 1.0 / (r["rank"] + 1) for r in records])
        import math

        macro_se = math.sqrt(sum(mean_stderr([hits(r, 1) for r in rs])[1] ** 2 for rs in per_rel.values()
                                 if len(rs) > 1)) / max(len(per_rel), 1)
        if not any(len(rs) > 1 for rs in per_rel.values()):
            macro_se = None  # one probe per relation: no relation has a variance to estimate (not "± 0.000")
        return TaskResult(
            metrics={"p@1": sum(rel_p1.values()) / max(len(rel_p1), 1), "p@1_micro": p1_micro, "p@10": p10, "mrr": mrr},
            stderr={"p@1": macro_se, "p@1_micro": p1_se, "p@10": p10_se, "mrr": mrr_se},
            details={"p@1_per_relation": rel_p1, "p@1_per_source": p1_per_source, "n_per_relation": {k: len(v) for k, v in per_rel.items()},
                     "n_candidates": {k: max(r["n_candidates"] for r in rs) for k, rs in per_rel.items()},
                     "missing_gold": missing_gold, "source": ls.source,
                     **({"absent_relations": ls.absent} if getattr(ls, "absent", None) else {})},
            records=records,
            config={"n_probes": len(records), **s.__dict__},
        )
