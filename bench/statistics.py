"""A sweep's calibration statistics: read from the cache, or calibrated (in as many passes as memory allows) and
cached, one safetensors file per group, under a folder keyed by everything that determines them."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from core.errors import UserError
from core.io import atomic_write_json, cache_dir
from core.stats import GroupStats

from . import __version__
from .calibrate import STATS_VERSION, CalibSpec, calibrate
from .costs import calibration_chunks
from .stats_store import (StatsStore, default_stats_memory, from_stored, group_file, readable, to_stored,
                          write_group)
from .store import settings_hash


def stats_folder(fingerprint: dict, cspec: CalibSpec, needed: frozenset[str]) -> Path:
    key = settings_hash(fingerprint, cspec.as_dict(), sorted(needed), __version__, STATS_VERSION)
    return cache_dir() / "stats" / key


def calibration_windows(tokenizer, cspec: CalibSpec) -> torch.Tensor:
    from tasks.data.text_data import calibration_windows as windows, load_text

    return windows(tokenizer, load_text(cspec.source, "calib"), cspec.samples, cspec.seq_len, cspec.seed, cspec.bos)


def _pending(folder: Path, groups) -> list:
    """The groups whose cache file is absent or unreadable (a corrupt or foreign file is recomputed, never
    trusted)."""
    pending = []
    for g in groups:
        if not readable(folder, g.name):
            if group_file(folder, g.name).exists():
                tqdm.write(f"recomputing calibration statistics of {g.name}: its cache file is unreadable")
                group_file(folder, g.name).unlink()
            pending.append(g)
    return pending


def load_or_calibrate(lm, groups, cspec: CalibSpec, needed: frozenset[str], stats_memory: int | None = None,
                      batch_size: int = 4, progress: bool = True,
                      windows: torch.Tensor | None = None) -> tuple[StatsStore, dict]:
    """Statistics from the cache, calibrating (in as many passes as `stats_memory` asks) the groups it lacks."""
    folder = stats_folder(lm.fingerprint, cspec, needed)
    budget = stats_memory or default_stats_memory()
    info = {"spec": cspec.as_dict(), "stats": sorted(needed), "cache": folder.name}
    pending = _pending(folder, groups)
    if not pending:
        tqdm.write(f"calibration statistics from cache ({folder.name})")
        saved = folder / "info.json"
        return StatsStore(folder, [g.name for g in groups], budget), {
            **info, **(json.loads(saved.read_text()) if saved.exists() else {}), "cached": True}
    if windows is None:
        windows = calibration_windows(lm.tokenizer, cspec)
    chunks = calibration_chunks(pending, needed, cspec.pair_tokens, budget)
    t0 = time.perf_counter()
    held: dict[str, GroupStats] = {}
    for i, chunk in enumerate(chunks):
        stats = calibrate(lm.model, chunk, windows, needed, cspec, batch_size=max(1, batch_size // 2),
                          progress=progress, desc=f"calibrate pass {i + 1}/{len(chunks)}")
        check_finite(stats)
        for name in list(stats):
            write_group(folder, name, stats[name])
            st = stats.pop(name)
            if len(chunks) == 1:  # it all fits: keep the (cache-rounded) values, as a later run would read them
                held[name] = from_stored(to_stored(st))
            del st
    info.update(n_tokens=int(windows.numel()), seconds=time.perf_counter() - t0, cached=False, passes=len(chunks),
                groups_calibrated=len(pending))
    atomic_write_json(folder / "info.json", info)
    return StatsStore(folder, [g.name for g in groups], budget, preloaded=held), info


def check_finite(stats: dict[str, GroupStats]) -> None:
    for name, s in stats.items():
        for f in ("C", "F", "abs_mean", "mean", "xs", "gs"):
            t = getattr(s, f)
            if t is not None and not torch.isfinite(t).all():
                raise UserError(f"calibration produced non-finite {f} statistics in group {name}: "
                                "run with --dtype float32 and check the model's outputs on the calibration text")
