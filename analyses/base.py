"""The analysis interface: what a sweep computes from calibration statistics and compressions (through the context it is handed),
stored as a cell of its own (kind "analysis", method "<name>-analysis") beside the task cells, and rendered into
the leaderboard by its own `report_section`."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from acbench.core.registry import Plugin
from acbench.tasks.base import TaskResult


class Analysis(Plugin):
    kind = "analysis"
    needs: ClassVar[frozenset[str]] = frozenset()  # calibration statistics it reads (acbench.core.stats names)
    # run-sized tasks it evaluates through `ctx.task`: their settings enter the cell key
    uses_tasks: ClassVar[tuple[str, ...]] = ()
    primary_metric: ClassVar[str] = ""
    higher_is_better: ClassVar[dict[str, bool | None]] = {}

    def run(self, ctx, rank) -> TaskResult:
        """ctx: the harness's AnalysisContext (model, tokenizer, stats, groups, seed, progress, compressed(), task())."""
        raise NotImplementedError

    @classmethod
    def report_section(cls, cell, plot_dir: Path, stem: str, title: str) -> tuple[list[str], list[Path]] | None:
        """The leaderboard's section for one stored cell of this analysis (below its heading): markdown lines and
        the figures written under `plot_dir` (named from `stem`). None: the leaderboard's table of its metrics."""
        return None

    def summary_line(self, result: TaskResult) -> str:
        v = result.metrics.get(self.primary_metric)
        return f"{self.primary_metric}={v:.4g}" if isinstance(v, float) else ""
