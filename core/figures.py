"""Matplotlib without a display, and one way to write a figure (the leaderboard's and the analyses' alike)."""

from __future__ import annotations

from pathlib import Path


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path
