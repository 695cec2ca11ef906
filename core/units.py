"""Byte sizes as people write them ('16GB', '2GiB') and as logs print them."""

from __future__ import annotations

import re

from .errors import UserError

_UNITS = {"": 1, "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30,
          "TIB": 2**40}


def parse_bytes(text: str, flag: str = "--stats-memory") -> int:
    """'16GB' (decimal), '2GiB' (binary) or a plain number of bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?I?B?)\s*", str(text).upper())
    if not m or m.group(2) not in _UNITS or float(m.group(1)) <= 0:
        raise UserError(f"{flag} {text!r} is not a size: pass e.g. 16GB, 2GiB or 500MB")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def human(n: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"
