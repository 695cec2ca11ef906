"""Calibration statistics on disk, one safetensors file per input group, read back lazily within a memory budget.

Calibration writes each group's statistics as soon as its pass ends and frees them, so a model whose statistics
exceed memory (131 GB of float64 C and F for Llama-3-8B) calibrates in several passes, and a run killed between
passes resumes from the groups already written. Compression asks for one group at a time; `StatsStore` keeps as
many groups in memory as the budget allows (all of them for the default model) and re-reads the others.
safetensors holds tensors and a JSON header only: loading a cache file can run no code, unlike a pickle.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path

import torch

from acbench.core.io import atomic_write_via
from acbench.core.stats import HIST_BINS, GroupStats

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

    # the memo and the solve precision belong to the solves, not to the statistics
    return {f: to32(v) for f, v in vars(stats).items() if f not in ("memo", "solve_dtype") and v is not None}


def for_solver(field: str, value):
    """Moments back to float64 for the solvers; the (x, g) token sample stays float32."""
    if field in ("xs", "gs"):
        return value
    if isinstance(value, torch.Tensor):
        return value.double()
    return {k: x.double() for k, x in value.items()} if isinstance(value, dict) else value


def from_stored(fields: dict) -> GroupStats:
    return GroupStats(**{f: for_solver(f, v) for f, v in fields.items()})


# Every file says what it holds, and a reader believes none of it until the bytes agree: the tensor list, each
# tensor's dtype and shape, the group and its width, and a digest of the bytes are all checked (`group_problem`).
# 3: the digest covers the scalars too (an edited n_tokens went unnoticed)
# 4: each file names the calibration it belongs to (model fingerprint, tokens, versions: the folder's base), under
#    the digest, so a folder is served to another model or another calibration on no label's word
FORMAT = "acbench-stats-4"
_SAFETENSORS_DTYPES = {torch.float32: "F32", torch.float64: "F64", torch.float16: "F16", torch.bfloat16: "BF16"}
_STORED_DTYPES = {"xs": "F32", "gs": "F32"}  # the token sample; every moment is stored as float32 too
_SQUARE, _VECTOR, _SAMPLE = ("C", "F"), ("abs_mean", "mean"), ("xs", "gs")
_HISTOGRAM = ("abs_hist", "act_hist")  # HIST_BINS long whatever the width
SCALAR_FIELDS = ("n_tokens",)


def _hash_tensor(h, key: str, t: torch.Tensor) -> None:
    """One tensor into a group's digest: its name, dtype, shape and bytes (tensors go in by sorted name)."""
    t = t.contiguous()
    h.update(f"{key}|{_SAFETENSORS_DTYPES.get(t.dtype, str(t.dtype))}|{list(t.shape)}|".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())


def _new_digest(scalars_text: str, base: str):
    """A group's digest begins with its scalars, as the header stores them (the token count the debiased rho and
    the solvers read), and the calibration it belongs to, then takes each tensor."""
    h = hashlib.sha256()
    h.update(f"scalars|{scalars_text}|base|{base}|".encode())
    return h


def _digest(tensors: dict[str, torch.Tensor], scalars_text: str, base: str) -> str:
    h = _new_digest(scalars_text, base)
    for key in sorted(tensors):
        _hash_tensor(h, key, tensors[key])
    return h.hexdigest()


def write_group(folder: Path, group: str, stats: GroupStats, d_in: int, base: str = "") -> None:
    """Atomically (temp file + rename), streamed from the tensors: no in-memory copy of the serialised file. `base`
    names the calibration (model and tokens) the statistics come from (`acbench.calibration.cache.stats_base`)."""
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
    manifest = {k: [_SAFETENSORS_DTYPES[t.dtype], list(t.shape)] for k, t in tensors.items()}
    scalars_text = json.dumps(scalars, sort_keys=True)
    metadata = {"format": FORMAT, "group": group, "d_in": str(d_in), "scalars": scalars_text, "base": base,
                "tensors": json.dumps(manifest, sort_keys=True), "digest": _digest(tensors, scalars_text, base)}
    atomic_write_via(group_file(folder, group), lambda tmp: save_file(tensors, str(tmp), metadata=metadata))


def _shape_problem(key: str, shape: list[int], d_in: int) -> str | None:
    name, _, site = key.partition(_SEP)
    if name == "row_fisher":
        ok = bool(site) and len(shape) == 1 and shape[0] >= 1
    elif site:
        ok = False
    elif name in _SQUARE:
        ok = shape == [d_in, d_in]
    elif name in _VECTOR:
        ok = shape == [d_in]
    elif name in _SAMPLE:
        ok = len(shape) == 2 and shape[0] >= 1 and shape[1] == d_in
    elif name in _HISTOGRAM:
        ok = shape == [HIST_BINS]
    else:
        return f"it holds an unknown tensor {key!r}"
    return None if ok else f"tensor {key} has shape {shape}, not one of a group of width {d_in}"


# the tensors that hold each statistic a method can need ("row_fisher" is one tensor per site: `_sites_hold`)
STAT_TENSORS = {"C": ("C",), "F": ("F",), "abs_mean": ("abs_mean",), "mean": ("mean",), "abs_hist": ("abs_hist",),
                "act_hist": ("act_hist",), "pairs": ("xs", "gs"), "tokens": ("xs",)}


STATS = frozenset(STAT_TENSORS) | {"row_fisher"}  # every statistic a group file can hold


def missing_stats(keys, needed) -> list[str]:
    """The statistics of `needed` that a group file's tensors (`keys`) do not hold: what a file holds is read from
    its tensors, never from a list written beside them."""
    names = {k.partition(_SEP)[0] for k in keys}
    return sorted(s for s in needed
                  if not (s in names if s == "row_fisher" else all(t in names for t in STAT_TENSORS.get(s, (s,)))))


def _header_problem(meta: dict, group: str, d_in: int, keys: set, base: str | None = None) -> str | None:
    if meta.get("format") != FORMAT:
        return f"its format is {meta.get('format')!r}, not {FORMAT}"
    if base is not None and meta.get("base") != base:
        return "it holds statistics of another model or calibration"
    if meta.get("group") != group:
        return f"it holds group {meta.get('group')!r}"
    if meta.get("d_in") != str(d_in):
        return f"it is for width {meta.get('d_in')}, the model's group has {d_in}"
    try:
        manifest, scalars = json.loads(meta["tensors"]), json.loads(meta["scalars"])
    except (KeyError, TypeError, ValueError):
        return "its header's tensor list or scalars do not parse"
    if not isinstance(manifest, dict) or set(manifest) != keys:
        return "its tensors are not the ones its header lists"
    if not isinstance(scalars, dict) or set(scalars) - set(SCALAR_FIELDS) or \
            any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in scalars.values()):
        return "its scalars are not the statistics' token count"
    return None


def group_problem(folder: Path, group: str, d_in: int, base: str | None = None,
                  needed: frozenset[str] | None = None) -> str | None:
    """Why a group's cache file cannot be used ("missing" when there is none), or None: every header field is
    checked against the tensors themselves and the model's group, the bytes against their digest (which covers the
    calibration `base` it names), the values for finiteness; with `needed`, the tensors must hold those statistics."""
    from safetensors import safe_open

    path = group_file(folder, group)
    if not path.is_file():
        return "missing"
    try:
        with safe_open(str(path), framework="pt") as f:
            meta, keys = f.metadata() or {}, set(f.keys())
            problem = _header_problem(meta, group, d_in, keys, base)
            if problem:
                return problem
            lacking = missing_stats(keys, needed or ())
            if lacking:
                return f"it lacks the {', '.join(lacking)} statistics"
            manifest = json.loads(meta["tensors"])
            h = _new_digest(meta["scalars"], str(meta.get("base", "")))
            for key in sorted(keys):  # one tensor in memory at a time
                sl = f.get_slice(key)
                dtype, shape = sl.get_dtype(), list(sl.get_shape())
                if [dtype, shape] != manifest[key]:
                    return f"tensor {key} is {dtype} {shape} in the file, its header says {manifest[key]}"
                if dtype != _STORED_DTYPES.get(key.partition(_SEP)[0], "F32"):
                    return f"tensor {key} is {dtype}; the cache stores F32"
                problem = _shape_problem(key, shape, d_in)
                if problem:
                    return problem
                t = f.get_tensor(key)
                if not torch.isfinite(t).all():
                    return f"tensor {key} holds non-finite values"
                _hash_tensor(h, key, t)
                del t
            if h.hexdigest() != meta.get("digest"):
                return "its bytes do not match the digest written with them"
    except Exception as e:  # a truncated or foreign file: any reader error is a reason to recompute it
        return f"it cannot be read ({type(e).__name__})"
    return None


def read_group(folder: Path, group: str) -> GroupStats:
    """A group's statistics (checked by `group_problem` when the run began; the digest is checked again here, so
    a file changed since is an error naming it, never a silently different number)."""
    from safetensors import safe_open

    from acbench.core.errors import DataError

    path = group_file(folder, group)
    fields: dict = {}
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        h = _new_digest(meta.get("scalars", ""), meta.get("base", ""))
        if meta.get("group") != group:
            raise DataError(f"statistics cache file {path} holds group {meta.get('group')!r}, not {group!r}: "
                            "delete it and rerun")
        for key in sorted(f.keys()):
            name, _, site = key.partition(_SEP)
            stored = f.get_tensor(key)
            _hash_tensor(h, key, stored)
            t = for_solver(name, stored)  # one at a time, so float32 copies never pile up
            del stored
            if site:
                fields.setdefault(name, {})[site] = t
            else:
                fields[name] = t
        if h.hexdigest() != meta.get("digest"):
            raise DataError(f"statistics cache file {path} changed while this run used it (its bytes no longer match "
                            "their digest): rerun, and it is recomputed")
        fields.update(json.loads(meta["scalars"]))
    return GroupStats(**fields)


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
    from acbench.core.io import available_bytes

    return available_bytes() // 2


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
