"""Compression methods: one module per method, each a `Compressor` subclass, found by the registry.

A new module here is registered by being here; a method in another distribution registers through the
`acbench.methods` entry-point group (`name = "package.module:MyCompressor"`).
"""

from __future__ import annotations

from core.registry import Registry, UnknownName
from core.stats import GroupStats, RankSpec

from .base import Compressor, GroupCompression

__all__ = ["Compressor", "GroupCompression", "GroupStats", "RankSpec", "REGISTRY", "get_method", "expand_methods",
           "known_methods", "UnknownName"]

REGISTRY = Registry("method", __name__, Compressor, "acbench.methods")


known_methods = REGISTRY.names
get_method = REGISTRY.get


def expand_methods(spec: str | list[str]) -> list[str]:
    names = spec.split(",") if isinstance(spec, str) else list(spec)
    names = [n.strip() for n in names if n.strip()]
    if "all" in names:
        return known_methods()
    for n in names:
        get_method(n)
    return list(dict.fromkeys(names))
