"""Type and range checks for the small frozen settings dataclasses (methods, tasks) and the run spec.

Values arrive from YAML, `--method-option k=v` and config files, so `seq_len: abc` or `max_swaps: [1` must be
refused by name before any model loads, not fail deep inside a task.
"""

from __future__ import annotations

import dataclasses
import math
import re

_SCALARS = {"int": int, "float": float, "str": str, "bool": bool, "None": type(None), "dict": dict, "list": list}


def _matches(value, annotation: str) -> bool:
    for alt in (a.strip() for a in annotation.split("|")):
        m = re.fullmatch(r"(list|tuple)\[(\w+)\]", alt)
        if m:
            if isinstance(value, (list, tuple)) and all(_matches(v, m.group(2)) for v in value):
                return True
            continue
        if alt.startswith("dict"):
            if isinstance(value, dict):
                return True
            continue
        t = _SCALARS.get(alt)
        if t is None:
            return True  # an annotation this checker does not know: leave it to the owner's own checks
        if t is bool:
            if isinstance(value, bool):
                return True
        elif t is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return True
        elif t is float:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return True
        elif isinstance(value, t):
            return True
    return False


def type_problems(obj) -> list[str]:
    """'name must be <annotation>, got <value>' for every dataclass field whose value has the wrong type."""
    out = []
    for f in dataclasses.fields(obj):
        ann = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        value = getattr(obj, f.name)
        if not _matches(value, ann.replace("typing.", "")):
            out.append(f"{f.name} must be {ann}, got {value!r}")
    return out


def check_settings(obj, owner: str) -> None:
    """Types first (TypeError), then the dataclass's own `ranges()` (ValueError), each naming the setting and
    its owner (e.g. "task 'ppl-token'"). Negative integers are refused everywhere except in seeds."""
    problems = type_problems(obj)
    if problems:
        raise TypeError(f"{owner}: setting {problems[0]}")
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if isinstance(v, int) and not isinstance(v, bool) and v < 0 and "seed" not in f.name:
            raise ValueError(f"{owner}: setting {f.name} must be >= 0, got {v}")
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"{owner}: setting {f.name} must be a finite number, got {v}")
    for name, (value, low) in getattr(obj, "minimums", lambda: {})().items():
        if value is not None and value < low:
            raise ValueError(f"{owner}: setting {name} must be >= {low}, got {value}")
