"""A sweep's calibration statistics: read from the cache, or calibrated (in as many passes as memory allows) and
cached, one safetensors file per group, under a folder keyed by everything that determines them."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from typing import NamedTuple
from pathlib import Path

import torch

from acbench.core.errors import UserError
from acbench.core.log import say
from acbench.core.io import atomic_write_json, folder_bytes, stats_cache_dir, stats_cache_limit
from acbench.core.units import human
from acbench.core.stats import GroupStats

from acbench.core.version import __version__
from acbench.calibration.engine import STATS_VERSION, CalibSpec, calibrate
from acbench.calibration.memory import calibration_chunks, stat_bytes
from acbench.calibration.group_files import (StatsStore, default_stats_memory, from_stored, group_file, group_problem, to_stored,
                          write_group)
from acbench.results.store import claim_cell, release_cell, settings_hash

class Calibration(NamedTuple):
    """What the calibration stage hands on: the statistics (read lazily from their files, or held in memory) and
    the record a cell's `calibration` field stores about them (the text spec, the statistics, the cache folder,
    and how they were computed: tokens, seconds, passes, or read from the cache). A named pair: `stats, record =
    load_or_calibrate(...)` unpacks it."""

    stats: Mapping[str, GroupStats]
    record: dict

    @property
    def cached(self) -> bool:
        return self.record.get("cached") is True

    @property
    def seconds(self) -> float | None:
        return self.record.get("seconds")

    @property
    def passes(self) -> int:
        return self.record.get("passes", 1)

    @property
    def stage(self) -> str:
        """The stage's name in a run's timing table."""
        if self.cached:
            return "calibration (from the cache)"
        return "calibration" + (f" ({self.passes} passes)" if self.passes > 1 else "")


CLAIM = "calibration"  # the claim file (.calibration.lock) in a statistics folder
CLAIM_POLL_S = 2.0


def stats_folder(fingerprint: dict, cspec: CalibSpec, needed: frozenset[str]) -> Path:
    key = settings_hash(fingerprint, cspec.as_dict(), sorted(needed), __version__, STATS_VERSION)
    return stats_cache_dir() / key


def stats_base(fingerprint: dict, cspec: CalibSpec) -> str:
    """The part of a statistics folder's key that is not the statistics collected: two folders with the same base
    hold the same tokens' statistics of the same model, so one whose statistics include another's serves it."""
    return settings_hash(fingerprint, cspec.as_dict(), __version__, STATS_VERSION)


def held_stats(folder: Path, group: str) -> frozenset[str]:
    """The statistics a group's cache file holds, read from its tensors (not from info.json's list)."""
    from safetensors import safe_open

    from acbench.calibration.group_files import STATS, missing_stats

    try:
        with safe_open(str(group_file(folder, group)), framework="pt") as f:
            keys = set(f.keys())
    except Exception:  # unreadable: it holds nothing usable
        return frozenset()
    held = STATS - set(missing_stats(keys, STATS))
    return held - {"tokens"} if "pairs" in held else held  # the pairs' x serve a token sample: not listed twice


def superset_folder(base: str, needed: frozenset[str], groups) -> Path | None:
    """A complete cached calibration of the same base whose statistics include `needed` (a sweep's C, F and pairs
    serve a later `bench compress` that needs C alone), or None. Its files are only read, never moved. Each group
    file is checked by content: the calibration it names under its digest and the tensors it holds; what the
    folder's info.json says it holds is never believed."""
    for folder in sorted(p for p in stats_cache_dir().glob("*") if p.is_dir()):
        if all(group_problem(folder, g.name, g.d_in, base, needed) is None for g in groups):
            return folder
    return None


def calibration_windows(tokenizer, cspec: CalibSpec) -> torch.Tensor:
    from acbench.tasks.data.text_data import load_text, sample_text_windows as windows

    return windows(tokenizer, load_text(cspec.source, "calib"), cspec.samples, cspec.seq_len, cspec.seed, cspec.bos)


def _pending(folder: Path, groups, base: str | None = None, needed: frozenset[str] | None = None) -> list:
    """The groups whose cache file is absent or fails its checks; a failing file is moved aside (into
    rejected/, for a look), never re-read, and its group recomputed with one line saying why."""
    pending = []
    for g in groups:
        problem = group_problem(folder, g.name, g.d_in, base, needed)
        if problem is None:
            continue
        if problem != "missing":
            path = group_file(folder, g.name)
            aside = folder / "rejected" / f"{path.stem}.{int(time.time() * 1000)}.safetensors"
            aside.parent.mkdir(exist_ok=True)
            path.replace(aside)
            say(f"recomputing calibration statistics of {g.name}: cache file {path} {problem} (moved to "
                       f"{aside.relative_to(folder)})")
        pending.append(g)
    return pending


# what a cached calibration's info.json may add to a cell's record: its timing, each field checked by content
_SAVED_COUNTS = {"n_tokens": 0, "passes": 1, "groups_calibrated": 0}


def _saved_info(folder: Path) -> dict:
    """How the cached calibration was computed (its time, passes, tokens), from its info.json: a field of the wrong
    type or sign is said and left out, and what the statistics are (model, tokens, which statistics) is never
    taken from it."""
    saved = folder / "info.json"
    if not saved.exists():
        return {}
    try:
        info = json.loads(saved.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        info = None
    if not isinstance(info, dict):
        say(f"calibration info {saved} is unreadable: the statistics are used, their timing is not recorded")
        return {}
    out, bad = {}, []
    for key, v in info.items():  # in the file's order, so a cell's calibration block reads as it always did
        if key in _SAVED_COUNTS:
            ok = isinstance(v, int) and not isinstance(v, bool) and v >= _SAVED_COUNTS[key]
        elif key == "seconds":
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
        elif key == "cached":
            ok = isinstance(v, bool)
        else:
            continue  # what the statistics are is known from their files
        if ok:
            out[key] = v
        else:
            bad.append(key)
    if bad:
        say(f"calibration info {saved}: {', '.join(bad)} not a valid count or time, left out of the record")
    return out


def check_cache_room(groups, needed: frozenset[str], pair_tokens: int, limit: int | None = None) -> None:
    """Say how much calibrating `groups` adds to the statistics cache, before anything is written; refuse it in one
    line where the cache would grow past `limit` (else $ACBENCH_STATS_CACHE_LIMIT; no bound where neither is set)."""
    adding = sum(sum(stat_bytes(g, needed, pair_tokens, width=4).values()) for g in groups)
    root = stats_cache_dir()
    holds = folder_bytes(root)
    limit = stats_cache_limit() if limit is None else limit
    if limit is not None and holds + adding > limit:
        raise UserError(f"the statistics cache {root} holds {human(holds)} and this calibration adds about "
                        f"{human(adding)}, past its bound of {human(limit)}: clear it (acbench.statistics_cache("
                        f"clear=True), or delete the folder), raise the bound, or calibrate without the cache")
    bound = f", bound {human(limit)}" if limit is not None else ""
    say(f"calibration statistics: about {human(adding)} to the cache {root} (it holds {human(holds)}{bound})")


def load_or_calibrate(lm, groups, cspec: CalibSpec, needed: frozenset[str], stats_memory: int | None = None,
                      batch_size: int = 4, progress: bool = True,
                      windows: torch.Tensor | None = None, limit: int | None = None) -> Calibration:
    """Statistics from the cache, calibrating (in as many passes as `stats_memory` asks) the groups it lacks, after
    check_cache_room (`limit`: the cache's bound in bytes, else $ACBENCH_STATS_CACHE_LIMIT's)."""
    folder = stats_folder(lm.fingerprint, cspec, needed)
    budget = stats_memory or default_stats_memory()
    base = stats_base(lm.fingerprint, cspec)
    info = {"spec": cspec.as_dict(), "stats": sorted(needed), "cache": folder.name, "base": base}
    if any(group_problem(folder, g.name, g.d_in, base, needed) is not None for g in groups):
        wider = superset_folder(base, needed, groups)
        if wider is not None:
            holds = sorted(frozenset.intersection(*(held_stats(wider, g.name) for g in groups)))
            say(f"calibration statistics from cache ({wider.name}, which holds {', '.join(holds)})")
            return Calibration(StatsStore(wider, [g.name for g in groups], budget), {
                "spec": cspec.as_dict(), "stats": holds, "cache": wider.name, "base": base, **_saved_info(wider),
                "cached": True, "needed": sorted(needed)})
    pending = _claimed_pending(folder, groups, base, needed)
    if not pending:
        say(f"calibration statistics from cache ({folder.name})")
        return Calibration(StatsStore(folder, [g.name for g in groups], budget),
                           {**info, **_saved_info(folder), "cached": True})
    try:
        check_cache_room(pending, needed, cspec.pair_tokens, limit)
        return _calibrate_pending(lm, groups, pending, folder, cspec, needed, budget, batch_size, progress, windows,
                                  info)
    finally:
        release_cell(folder / CLAIM)


def _claimed_pending(folder: Path, groups, base: str, needed: frozenset[str]) -> list:
    """The groups to calibrate, claimed (as cells are) so that runs started together on one cache compute them
    once: a run that finds the claim held waits for it, then takes what is still missing. Nothing pending: no
    claim is held."""
    waited = False
    while True:
        pending = _pending(folder, groups, base, needed)
        if not pending:
            return []
        if claim_cell(folder / CLAIM):
            pending = _pending(folder, groups, base, needed)  # another run may have finished them meanwhile
            if not pending:
                release_cell(folder / CLAIM)
            return pending
        if not waited:
            say(f"waiting for another run calibrating the same statistics ({folder.name})")
            waited = True
        time.sleep(CLAIM_POLL_S)


def _calibrate_pending(lm, groups, pending, folder, cspec, needed, budget, batch_size, progress, windows,
                       info) -> Calibration:
    if windows is None:
        windows = calibration_windows(lm.tokenizer, cspec)
    chunks = calibration_chunks(pending, needed, cspec.pair_tokens, budget)
    base = stats_base(lm.fingerprint, cspec)  # under each file's digest: whose statistics these are
    t0 = time.perf_counter()
    held: dict[str, GroupStats] = {}
    for chunk, stats in calibrated_passes(lm.model, chunks, windows, needed, cspec, batch_size, progress):
        width = {g.name: g.d_in for g in chunk}
        for name in list(stats):
            write_group(folder, name, stats[name], width[name], base)
            st = stats.pop(name)
            if len(chunks) == 1:  # it all fits: keep the (cache-rounded) values, as a later run would read them
                held[name] = from_stored(to_stored(st))
            del st
    info.update(n_tokens=int(windows.numel()), seconds=time.perf_counter() - t0, cached=False, passes=len(chunks),
                groups_calibrated=len(pending))
    atomic_write_json(folder / "info.json", info)
    return Calibration(StatsStore(folder, [g.name for g in groups], budget, preloaded=held), info)


def calibrated_passes(model, chunks: list[list], windows: torch.Tensor, needed: frozenset[str], cspec: CalibSpec,
                      batch_size: int, progress: bool):
    """(groups, their statistics) of each pass, checked finite: one calibration per chunk of groups, at half the
    run's batch (the backward's activations are kept)."""
    for i, chunk in enumerate(chunks):
        stats = calibrate(model, chunk, windows, needed, cspec, batch_size=max(1, batch_size // 2),
                          progress=progress, desc=f"calibrate pass {i + 1}/{len(chunks)}")
        check_statistics_finite(stats)
        yield chunk, stats


def check_statistics_finite(stats: dict[str, GroupStats]) -> None:
    for name, s in stats.items():
        for f in ("C", "F", "abs_mean", "mean", "abs_hist", "act_hist", "xs", "gs"):
            t = getattr(s, f)
            if t is not None and not torch.isfinite(t).all():
                raise UserError(f"calibration produced non-finite {f} statistics in group {name}: "
                                "run with --dtype float32 and check the model's outputs on the calibration text")
