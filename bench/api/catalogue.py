"""What acbench holds and where: the registered methods and tasks, the statistics cache and its bound, a model
opened as `bench run --model` opens it."""

from __future__ import annotations

from acbench.core.errors import UserError
from acbench.model.sources import DEFAULT_MODEL, LoadedModel, open_and_load_model
from acbench.api.caller_state import keeps_caller_state


DEFAULT_CACHE_LIMIT = "20GB"  # from Python, where $ACBENCH_STATS_CACHE_LIMIT is unset


def cache_bound(cache, cache_limit) -> int | None:
    """The statistics cache's bound in bytes for a call with `cache` (checked: a bool) and `cache_limit` (a size,
    else $ACBENCH_STATS_CACHE_LIMIT's, else DEFAULT_CACHE_LIMIT)."""
    from acbench.core.io import stats_cache_limit
    from acbench.core.units import parse_bytes

    if not isinstance(cache, bool):
        raise UserError(f"cache={cache!r}: pass True (keep the statistics on disk) or False (the default)")
    if cache_limit is not None and (isinstance(cache_limit, bool) or not isinstance(cache_limit, (str, int))):
        raise UserError(f"cache_limit={cache_limit!r}: pass a size such as \"50GB\"")
    if cache_limit is not None:
        return parse_bytes(str(cache_limit), "cache_limit=")
    from_env = stats_cache_limit()
    return from_env if from_env is not None else parse_bytes(DEFAULT_CACHE_LIMIT)


def statistics_cache(clear: bool = False) -> list[dict]:
    """The calibration statistics cache ($ACBENCH_STATS_CACHE, else the cache folder's stats/): one entry per
    folder, largest first, with its `key`, `bytes` on disk, the calibration it holds (`spec`, `stats`, `tokens`) and
    `path`. `clear=True` removes every folder no process is writing now (a claimed one is kept, and listed with
    `kept: "being written"`) and returns what it removed and kept."""
    import json
    import shutil

    from acbench.core.io import folder_bytes, stats_cache_dir

    if not isinstance(clear, bool):  # 'no', 0.0 or a path would be truthy: nothing is removed on a value not True
        raise UserError(f"statistics_cache(clear={clear!r}): pass clear=True to remove the cache's folders, or "
                        "clear=False (the default) to list them")
    root = stats_cache_dir()
    out = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        try:
            info = json.loads((folder / "info.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            info = {}
        info = info if isinstance(info, dict) else {}
        size = folder_bytes(folder)
        entry = {"key": folder.name, "bytes": size, "spec": info.get("spec"), "stats": info.get("stats"),
                 "tokens": info.get("n_tokens"), "path": str(folder)}
        if clear:
            if any(f.name.endswith(".lock") for f in folder.iterdir()):
                entry["kept"] = "being written"
            else:
                shutil.rmtree(folder, ignore_errors=True)
                entry["removed"] = True
        out.append(entry)
    return sorted(out, key=lambda e: -e["bytes"])


def list_methods() -> list[dict]:
    """What `bench ls methods` lists: per registered method its name, family, version, what it needs (data-free,
    activations, gradients), description, settings with their defaults, and its authors' calibration."""
    import dataclasses

    from acbench import methods as registry

    out = []
    for name in registry.known_methods():
        cls = registry.get_method(name)
        caps = cls().capabilities()
        own = cls.authors_calibration
        out.append({"name": name, "family": cls.family, "version": cls.version,
                    "needs": [k for k in ("activations", "gradients") if caps[k]], "description": cls.description,
                    "settings": dataclasses.asdict(cls.Settings()) if dataclasses.is_dataclass(
                        getattr(cls, "Settings", None)) else {},
                    "authors_calibration": dataclasses.asdict(own) if own is not None else None})
    return out


def list_tasks() -> list[dict]:
    """What `bench ls tasks` lists: per registered task its name, version, description, primary metric and its
    direction, the margin it is called equivalent within, and its settings with their defaults."""
    import dataclasses

    from acbench import tasks as registry

    out = []
    for name in registry.known_tasks():
        cls = registry.get_task(name)
        out.append({"name": name, "version": cls.version, "description": cls.description,
                    "primary_metric": cls.primary_metric,
                    "higher_is_better": cls.higher_is_better.get(cls.primary_metric), "margin": cls.margin,
                    "settings": dataclasses.asdict(cls.Settings()) if dataclasses.is_dataclass(
                        getattr(cls, "Settings", None)) else {}})
    return out


@keeps_caller_state
def load_model(model: str = DEFAULT_MODEL, dtype: str = "float32", device: str = "cpu",
               device_map: str | None = None, progress: bool = True) -> LoadedModel:
    """A model as `bench run --model` opens it (a built-in alias, a local checkpoint folder, a GGUF file or a hub
    id), with its tokenizer and the fingerprint of its weights: `compress` caches its statistics under it.
    `progress=False` silences transformers' bars for this load only (the caller's setting is put back)."""
    return open_and_load_model(model, dtype=dtype, device=device, progress=progress, device_map=device_map)
