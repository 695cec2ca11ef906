"""The task interface: a task takes a (possibly compressed) model and its tokenizer and returns metrics."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from acbench.core.confidence_sequences import ALPHA as SEQUENCE_ALPHA
from acbench.core.errors import UserError
from acbench.core.registry import Plugin


@dataclass
class TaskResult:
    metrics: dict[str, float]
    stderr: dict[str, float] = field(default_factory=dict)
    details: dict = field(default_factory=dict)  # per subject / relation breakdowns
    records: list[dict] = field(default_factory=list)  # per item: "correct" (0/1) or "nll", optionally "chance"
    config: dict = field(default_factory=dict)
    # Declarations known only once the task ran (an lm-eval task's metrics); they override the class's.
    primary_metric: str = ""
    higher_is_better: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Shortcut:
    """A familiar `bench run` flag for one task setting: `--lama-limit 5` means `--task-option lama.per_relation=5`
    (an explicit --task-option wins). Several tasks may declare one flag (`--limit`: MMLU and LAMA)."""

    flag: str
    setting: str
    help: str = ""


@dataclass(frozen=True)
class RunShared:
    """The run-wide settings a task may take over (`Task.run_settings`): its seed, batch size and BOS protocol."""

    seed: int = 0
    batch_size: int = 4
    bos: str = "auto"


@dataclass(frozen=True)
class UntilDecided:
    """How a task is evaluated under `bench run --until-decided`: its items drawn in blocks in a seeded order, each
    comparison with `reference` tested after every block by a confidence sequence and stopped when decided (or at
    the budget). Part of the cell key: a cell evaluated this way is never taken for a fixed-size one."""

    reference: str
    looks: int = 20  # blocks the budget is cut into: a comparison is tested after each
    margin: float | None = None
    # the sequence's level: 0.05, or the share of a family's level a study gives each comparison (0.05 / m), so
    # that a stop is a decision after the family's correction too
    alpha: float = SEQUENCE_ALPHA

    def as_dict(self) -> dict:
        out = {"reference": self.reference, "looks": self.looks, "margin": self.margin}
        # added after cells were stored: in the key only when not the default (those cells keep theirs)
        return out if self.alpha == SEQUENCE_ALPHA else {**out, "alpha": self.alpha}


class Task(Plugin):
    kind = "task"
    higher_is_better: ClassVar[dict[str, bool]] = {}
    primary_metric: ClassVar[str] = ""
    # the leaderboard column: its label (default "<name> <primary metric>") and place (lower first, then by name)
    label: ClassVar[str] = ""
    order: ClassVar[int] = 100
    # the default equivalence margin of a paired difference in this task's comparison unit (points of accuracy as a
    # fraction, nats of mean NLL for perplexity): within it two methods are called equivalent; None: never
    margin: ClassVar[float | None] = None
    shortcuts: ClassVar[tuple[Shortcut, ...]] = ()
    until_decided: UntilDecided | None = None  # set by the run (--until-decided) on a task that has an item_pool

    def settings_dict(self) -> dict:
        out = super().settings_dict()
        if self.until_decided is not None:
            out["until_decided"] = self.until_decided.as_dict()
        return out

    # Sequential evaluation: a task that can score any subset of its items defines these three; evaluate() stays
    # what a fixed-size run calls.
    def item_pool(self, tokenizer) -> list | None:
        """Every item this task's settings allow (its budget), in the order a sequential evaluation draws them:
        seeded, and stratified so that each prefix keeps the strata in proportion. None: evaluated whole only."""
        return None

    def score_items(self, model, tokenizer, items: list, progress: bool = True) -> list[dict]:
        """One record per item, as evaluate() stores them ("correct" or "nll" per item)."""
        raise NotImplementedError

    def result_of(self, records: list[dict]) -> TaskResult:
        """The task's metrics from the records of the items scored so far."""
        raise NotImplementedError

    def item_identity(self, item) -> dict:
        """The fields that identify `item` in its record (what acbench.core.significance.record_keys reads), known before
        it is scored: how a resumed evaluation checks that the records it finds are this pool's."""
        raise NotImplementedError

    @classmethod
    def run_settings(cls, shared: RunShared) -> dict:
        """Settings this task takes from the run unless its own options say otherwise (default: none)."""
        return {}

    @classmethod
    def for_run(cls, options: dict | None, shared: RunShared) -> "Task":
        return cls.from_options({**cls.run_settings(shared), **{k: v for k, v in (options or {}).items()
                                                                 if v is not None}})

    def size_note(self) -> str:
        """How large this task is in a run, for the run's "sizes:" log line ("" = not worth a mention)."""
        return ""

    def check(self, tokenizer) -> None:
        """Open and check the task's data before any model weights load (bad data = one UserError line)."""

    def evaluate(self, model, tokenizer, progress: bool = True) -> TaskResult:
        raise NotImplementedError


def stratified_order(items, stratum, seed: int) -> list:
    """`items` in the order a sequential evaluation draws them: each stratum's in a seeded shuffle, merged so that
    every prefix holds the strata in proportion to their sizes (the j-th of a stratum of n at (j + 1/2) / n; ties
    in the strata's first-seen order)."""
    import random

    groups: dict = {}
    for item in items:
        groups.setdefault(stratum(item), []).append(item)
    keyed = []
    for k, (name, members) in enumerate(groups.items()):
        random.Random(f"{seed}|{name}").shuffle(members)
        keyed += [((j + 0.5) / len(members), k, item) for j, item in enumerate(members)]
    return [item for _, _, item in sorted(keyed, key=lambda t: (t[0], t[1]))]


def check_limit(limit: int | None, sizes, flag: str, unit: str) -> None:
    """A per-subject / per-relation limit above every group's size would silently mean "all": refuse it."""
    largest = max(sizes, default=0)
    if limit and limit > largest:
        raise UserError(f"{flag} {limit} exceeds the largest {unit} ({largest} items): pass 0 for all, "
                        f"or at most {largest}")


def mean_stderr(values) -> tuple[float, float]:
    """Mean and its standard error (sample standard deviation / sqrt(n)), as lm-eval reports."""
    n = len(values)
    if n == 0:
        return float("nan"), float("nan")
    m = sum(values) / n
    if n < 2:
        return m, float("nan")
    var = sum((v - m) ** 2 for v in values) / (n - 1)
    return m, math.sqrt(var / n)


def model_device(model) -> torch.device:
    return next(model.parameters()).device


def logits_from_hidden(model, hidden: torch.Tensor) -> torch.Tensor:
    """The LM head (and Gemma's final soft-capping) applied only where needed."""
    logits = model.get_output_embeddings()(hidden).float()
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


# Output rows per slice of the LM head. 2048 keeps a 512-token batch's slice of logits (4 MB) in cache for the
# max, exp and sum that read it: next_token_nll on 510 tokens of Gemma-3-270m took 1.34 s at 2048 words per slice
# against 1.58 s at 8192 and 1.43 s at 1024 (best of 6, 2 cores, float32).
VOCAB_CHUNK = 2048


def target_logprobs(model, hidden: torch.Tensor, targets: torch.Tensor, vocab_chunk: int = VOCAB_CHUNK) -> torch.Tensor:
    """log p(targets[n, j] | hidden state n), float64 (N, K), from final hidden states (N, h) and K target tokens
    per row (rows with fewer targets may pad with any valid id and ignore those columns).

    The LM head runs over the vocabulary in slices with a running log-sum-exp, so the (N, V) logits are never
    materialised (Gemma's 262k-word head: 270 MB per 256-token window) nor passed again through a log-softmax. It
    is also the more accurate sum: torch's float32 log-softmax over 262k words came out 2e-4 nats per token below
    a float64 reference on Gemma-3-270m; this agrees with it to 1e-6. A head that is not a plain Linear is applied
    whole, same formula."""
    head = model.get_output_embeddings()
    cap = getattr(model.config, "final_logit_softcapping", None)
    tgt = targets.to(hidden.device)
    if not isinstance(head, torch.nn.Linear):
        logits = logits_from_hidden(model, hidden)
        return (logits.gather(1, tgt) - torch.logsumexp(logits, -1, keepdim=True)).double()
    n = hidden.shape[0]
    top = torch.full((n,), -float("inf"), dtype=torch.float32, device=hidden.device)
    total = torch.zeros(n, dtype=torch.float64, device=hidden.device)
    picked = torch.zeros(tgt.shape, dtype=torch.float32, device=hidden.device)
    rows = torch.arange(n, device=hidden.device)[:, None].expand(tgt.shape)
    for start in range(0, head.weight.shape[0], vocab_chunk):
        stop = min(start + vocab_chunk, head.weight.shape[0])
        bias = None if head.bias is None else head.bias[start:stop]
        logits = torch.nn.functional.linear(hidden, head.weight[start:stop], bias).float()
        if cap:
            logits = torch.tanh(logits / cap) * cap
        new_top = torch.maximum(top, logits.max(1).values)
        total = total * torch.exp(top - new_top).double() + torch.exp(logits - new_top[:, None]).sum(1).double()
        top = new_top
        inside = (tgt >= start) & (tgt < stop)
        picked[inside] = logits[rows[inside], tgt[inside] - start]
    return picked.double() - (top.double() + total.log())[:, None]


def next_token_nll(model, hidden: torch.Tensor, targets: torch.Tensor, vocab_chunk: int = VOCAB_CHUNK) -> torch.Tensor:
    """-log p(target | prefix) per position, float64, from the final hidden states (B, T, h) and targets (B, T)
    (target_logprobs with one target per position)."""
    flat = hidden.reshape(-1, hidden.shape[-1])
    return -target_logprobs(model, flat, targets.reshape(-1, 1), vocab_chunk).reshape(targets.shape)


def base_model(model):
    """The decoder under the LM head (its output is the hidden states the head reads): get_decoder's answer where
    it is a model of its own, else the base model (Mllama's causal LM answers get_decoder with itself, ModernBERT's
    decoder with its head, a Linear named `decoder`)."""
    import torch

    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    if decoder is not None and decoder is not model and not isinstance(decoder, torch.nn.Linear):
        return decoder
    base = getattr(model, "base_model", None)
    return base if base is not None and base is not model else model.model
