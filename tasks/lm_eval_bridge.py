"""Run lm-eval on an in-memory (compressed) model: HFLM(pretrained=<model object>), response cache off."""

from __future__ import annotations

import os
from dataclasses import dataclass

from acbench.core.errors import UserError

from .base import Task, TaskResult


def make_lm(model, tokenizer, batch_size: int = 1, max_length: int | None = None):
    from lm_eval.models.huggingface import HFLM

    # A response cache keyed by model name would mix compressed variants of one model: none is used here.
    return HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, max_length=max_length)


def _instances(kind: str, args_list):
    from lm_eval.api.instance import Instance

    return [Instance(request_type=kind, doc={}, arguments=args, idx=i) for i, args in enumerate(args_list)]


def loglikelihoods(lm, pairs: list[tuple[str, str]]) -> list[float]:
    """lm-eval's loglikelihood(context, continuation) for each pair."""
    return [ll for ll, _ in lm.loglikelihood(_instances("loglikelihood", pairs), disable_tqdm=True)]


def rolling_loglikelihood(lm, docs: list[str]) -> list[float]:
    return list(lm.loglikelihood_rolling(_instances("loglikelihood_rolling", [(d,) for d in docs]), disable_tqdm=True))


def multiple_choice_predictions(lm, contexts: list[str], choices=(" A", " B", " C", " D")) -> list[int]:
    """lm-eval's multiple_choice scoring: argmax over the summed log-likelihood of each choice."""
    pairs = [(c, ch) for c in contexts for ch in choices]
    lls = loglikelihoods(lm, pairs)
    n = len(choices)
    return [max(range(n), key=lambda j: lls[i * n + j]) for i in range(len(contexts))]


@dataclass(frozen=True)
class LMEvalSettings:
    tasks: str = ""  # comma-separated lm-eval task names, or paths to task YAML files
    limit: int | None = None
    num_fewshot: int | None = None
    batch_size: int = 1
    max_length: int | None = 1024


class LMEvalTask(Task):
    name = "lm-eval"
    description = "any lm-eval task (built-in when the hub is reachable, or a local task YAML) via HFLM(model)"
    higher_is_better = {}
    Settings = LMEvalSettings

    def evaluate(self, model, tokenizer, progress=True) -> TaskResult:
        import lm_eval
        from lm_eval.tasks import TaskManager

        s = self.settings
        if not s.tasks:
            raise UserError("task lm-eval needs its tasks setting: --task-option lm-eval.tasks=<name or yaml>")
        names, include = [], []
        for t in s.tasks.split(","):
            if t.endswith((".yaml", ".yml")):
                include.append(os.path.dirname(os.path.abspath(t)))
                names.append(os.path.splitext(os.path.basename(t))[0])
            else:
                names.append(t)
        tm = TaskManager(include_path=include or None)
        lm = make_lm(model, tokenizer, s.batch_size, s.max_length)
        import lm_eval.evaluator as evaluator

        # lm-eval asks git for the working folder's commit, and git prints "fatal: not a git repository" outside
        # one; the cell records acbench's own commit, so the question is not asked
        asked, evaluator.get_git_commit_hash = evaluator.get_git_commit_hash, lambda: None
        try:
            out = lm_eval.simple_evaluate(model=lm, tasks=names, task_manager=tm, limit=s.limit,
                                          num_fewshot=s.num_fewshot, use_cache=None, cache_requests=False,
                                          log_samples=True)
        except Exception as e:
            raise UserError(f"lm-eval could not run {names}: {str(e).splitlines()[0][:160]}") from None
        finally:
            evaluator.get_git_commit_hash = asked
        metrics, stderr = {}, {}
        for task, res in out["results"].items():
            for key, value in res.items():
                if not isinstance(value, (int, float)) or key in ("alias", "sample_len"):
                    continue
                metric, _, filt = key.partition(",")
                if metric.endswith("_stderr"):
                    stderr[f"{task}/{metric[:-7]}"] = float(value)
                else:
                    metrics[f"{task}/{metric}"] = float(value)
        if not metrics:
            raise UserError(f"lm-eval returned no numeric metric for {names}: check the task's metric_list")
        directions = {f"{task}/{m}": bool(v) for task, per in (out.get("higher_is_better") or {}).items()
                      for m, v in per.items() if isinstance(v, bool)}
        primary = next((m for m in metrics if m in directions), next(iter(metrics)))  # a scored metric first
        return TaskResult(metrics=metrics, stderr=stderr, config=dict(s.__dict__), primary_metric=primary,
                          higher_is_better=directions, records=sample_records(out, primary))


def sample_records(out: dict, primary: str) -> list[dict]:
    """Per-document records of the primary metric's task ("correct" when that metric is 0/1 per document), so the
    leaderboard pairs two variants item by item as it does for the native tasks."""
    task, _, metric = primary.partition("/")
    samples = (out.get("samples") or {}).get(task) or []
    values = [smp.get(metric) for smp in samples]
    if not samples or not all(isinstance(v, (int, float, bool)) and float(v) in (0.0, 1.0) for v in values):
        return []
    return [{"id": f"{task}/{smp.get('doc_id', i)}", "correct": int(v)}
            for i, (smp, v) in enumerate(zip(samples, values))]
