"""The results store: one JSON file per (model, method, rank, task) cell, written atomically."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import time
from pathlib import Path

from .cache import atomic_write_json

SCHEMA_VERSION = 1
DENSE = "dense"


def settings_hash(*parts) -> str:
    blob = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


def rank_label(rank: float | None, budget: str) -> str:
    return "full" if rank is None else f"{budget}-{rank:g}"


def cell_path(root: Path, model: str, method: str, rank: float | None, budget: str, task: str, key: str) -> Path:
    slug = model.replace("/", "__")
    if method == DENSE:
        return Path(root) / slug / DENSE / f"{task}-{key}.json"
    return Path(root) / slug / method / rank_label(rank, budget) / f"{task}-{key}.json"


def write_cell(path: Path, record: dict) -> None:
    record = {"schema_version": SCHEMA_VERSION, **record}
    atomic_write_json(path, record)


def cell_exists(path: Path) -> bool:
    """A cell counts as done only if its file parses and carries the current schema version."""
    try:
        return json.loads(Path(path).read_text()).get("schema_version") == SCHEMA_VERSION
    except (OSError, ValueError):
        return False


_GIT = None


def git_commit() -> str | None:
    global _GIT
    if _GIT is None:
        try:
            _GIT = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True,
                                  text=True, timeout=5).stdout.strip() or ""
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                   cwd=Path(__file__).resolve().parent, capture_output=True, text=True, timeout=5).stdout
            if _GIT and dirty.strip():
                _GIT += "-dirty"
        except (OSError, subprocess.SubprocessError):
            _GIT = ""
    return _GIT or None


def environment(device: str) -> dict:
    import torch
    import transformers

    from . import __version__

    try:
        import lm_eval

        lm_eval_version = getattr(lm_eval, "__version__", None)
    except ImportError:
        lm_eval_version = None
    return {
        "acbench": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
        "lm_eval": lm_eval_version, "python": platform.python_version(), "git_commit": git_commit(),
        "device": device, "cpu_threads": torch.get_num_threads(), "host": platform.node(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def check_writable(root: Path) -> None:
    from .errors import UserError

    root = Path(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise UserError(f"output directory {root} is not writable ({e.strerror}): pass --output <writable dir>") from None
