"""Calibration statistics on disk, one safetensors file per input group, read back lazily within a memory budget.

Calibration writes each group's statistics as soon as its pass ends and frees them, so a model whose statistics
exceed memory (131 GB of float64 C and F for Llama-3-8B) calibrates in several passes, and a run killed between
passes resumes from the groups already written. Compression asks for one group at a time; `StatsStore` keeps as
many groups in memory as the budget allows (all of them for the default model) and re-reads the others.
safetensors holds tensors and a JSON header only: loading a cache file can run no code, unlike a pickle.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path

import torch

from core.io import atomic_write_via
from core.stats import GroupStats

_SEP = "::"


def group_file(folder: Path, group: str) -> Path:
    return Path(folder) / f"{group}.safetensors"


def to_stored(stats: GroupStats) -> dict:
    """float32 for the cache (half the disk); every run, fresh or resumed, reads the same rounded values back, so a
    resumed sweep and an uninterrupted one compute bit-identical results."""
    def to32(v):
        if isinstance(v, torch.Tensor):
            return v.float() if v.dtype == torch.float64 else v
        return {k: to32(x) for k, x in v.items()} if isinstance(v, dict) else v

    return {f: to32(v) for f, v in vars(stats).items() if f != "memo" and v is not None}


def for_solver(field: str, value):
    """Moments back to float64 for the solvers; the (x, g) token sample stays float32."""
    if field in ("xs", "gs"):
        return value
    if isinstance(value, torch.Tensor):
        return value.double()
    return {k: x.double() for k, x in value.items()} if isinstance(value, dict) else value


def from_stored(fields: dict) -> GroupStats:
    return GroupStats(**{f: for_solver(f, v) for f, v in fields.items()})


def write_group(folder: Path, group: str, stats: GroupStats) -> None:
    """Atomically (temp file + rename), streamed from the tensors: no in-memory copy of the serialised file."""
    from safetensors.torch import save_file

    tensors, scalars = {}, {}
    for f, v in to_stored(stats).items():
        if isinstance(v, torch.Tensor):
            tensors[f] = v.contiguous()
        elif isinstance(v, dict):
            for site, t in v.items():
                tensors[f"{f}{_SEP}{site}"] = t.contiguous()
        else:
            scalars[f] = v
    atomic_write_via(group_file(folder, group), lambda tmp: save_file(
        tensors, str(tmp), metadata={"scalars": json.dumps(scalars), "group": group}))


def read_group(folder: Path, group: str) -> GroupStats:
    from safetensors import safe_open

    fields: dict = {}
    with safe_open(str(group_file(folder, group)), framework="pt") as f:
        meta = f.metadata() or {}
        if meta.get("group") != group:
            raise ValueError(f"file holds group {meta.get('group')!r}, not {group!r}")
        for key in f.keys():
            name, _, site = key.partition(_SEP)
            t = for_solver(name, f.get_tensor(key))  # one at a time, so float32 copies never pile up
            if site:
                fields.setdefault(name, {})[site] = t
            else:
                fields[name] = t
        fields.update(json.loads(meta["scalars"]))
    return GroupStats(**fields)


def readable(folder: Path, group: str) -> bool:
    """A finished group's file: its header parses and names the group (a foreign or truncated file does not)."""
    from safetensors import safe_open

    path = group_file(folder, group)
    if not path.is_file():
        return False
    try:
        with safe_open(str(path), framework="pt") as f:
            return (f.metadata() or {}).get("group") == group
    except Exception:
        return False


def nbytes(obj) -> int:
    """Bytes of the tensors a GroupStats holds, the solves it memoises included (they outweigh the statistics:
    a whitening factor and a basis are d x d each)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, GroupStats):
        return sum(nbytes(v) for v in vars(obj).values())
    if isinstance(obj, dict):
        return sum(nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(nbytes(v) for v in obj)
    return 0


def default_stats_memory() -> int:
    """Half of the memory the system has free now (the statistics live in host memory whatever the device)."""
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
        return info.get("MemAvailable", info["MemFree"]) // 2
    except (OSError, KeyError, ValueError, IndexError):
        return (os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) // 4


class StatsStore(Mapping):
    """{group name: GroupStats}, read from the cache folder on demand. Groups stay in memory (with the solves
    they memoise) while the total is under `budget` bytes; beyond it the least recently used are dropped."""

    def __init__(self, folder: Path, groups: list[str], budget: int | None = None,
                 preloaded: dict[str, GroupStats] | None = None):
        self.folder, self.groups, self.budget = Path(folder), list(groups), budget
        self._held: OrderedDict[str, GroupStats] = OrderedDict()
        self.reads = 0
        for name, st in (preloaded or {}).items():
            self._hold(name, st)

    def _make_room(self, incoming: int, keep: int = 0) -> None:
        """Drop the least recently used groups until `incoming` more bytes fit the budget."""
        while self.budget is not None and len(self._held) > keep and \
                sum(nbytes(s) for s in self._held.values()) + incoming > self.budget:
            self._held.popitem(last=False)

    def _hold(self, name: str, st: GroupStats) -> None:
        self._held[name] = st
        self._held.move_to_end(name)
        self._make_room(0, keep=1)

    def __getitem__(self, name: str) -> GroupStats:
        if name not in self.groups:
            raise KeyError(name)
        if name in self._held:
            self._held.move_to_end(name)
            return self._held[name]
        # room first: the file holds float32 moments, read back as float64 (about twice its size)
        self._make_room(2 * group_file(self.folder, name).stat().st_size)
        st = read_group(self.folder, name)
        self.reads += 1
        self._hold(name, st)
        return st

    def __iter__(self):
        return iter(self.groups)

    def __len__(self) -> int:
        return len(self.groups)

    @property
    def held_bytes(self) -> int:
        return sum(nbytes(s) for s in self._held.values())
