"""The task interface: a task takes a (possibly compressed) model and its tokenizer and returns metrics."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from core.errors import UserError
from core.registry import Plugin


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


class Task(Plugin):
    kind = "task"
    higher_is_better: ClassVar[dict[str, bool]] = {}
    primary_metric: ClassVar[str] = ""

    def check(self, tokenizer) -> None:
        """Open and check the task's data before any model weights load (bad data = one UserError line)."""

    def evaluate(self, model, tokenizer, progress: bool = True) -> TaskResult:
        raise NotImplementedError


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


def base_model(model):
    return model.get_decoder() if hasattr(model, "get_decoder") else model.model
