"""Compression methods and their registry.

Built-in methods register here; third-party methods register through the `acbench.methods` entry-point group
(`name = "package.module:MyCompressor"`), without editing the harness.
"""

from __future__ import annotations

from importlib.metadata import entry_points

from .asvd import ASVD
from .base import Compressor, GroupCompression, GroupStats, RankSpec
from .espace_nl import EspaceNL
from .fasc import FASC, FASCKFAC
from .fwsvd import FWSVD
from .pca import PCA
from .random_subspace import RandomSubspace
from .svd import SVD
from .whitened_svd import WhitenedSVD

__all__ = ["Compressor", "GroupCompression", "GroupStats", "RankSpec", "REGISTRY", "get_method", "expand_methods"]

ENTRY_POINT_GROUP = "acbench.methods"
REGISTRY: dict[str, type[Compressor]] = {}


class UnknownMethod(KeyError):
    def __str__(self):
        return self.args[0]


def register(cls: type[Compressor]) -> type[Compressor]:
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    REGISTRY[cls.name] = cls
    return cls


for _cls in (SVD, PCA, WhitenedSVD, ASVD, FASC, FASCKFAC, RandomSubspace, FWSVD, EspaceNL):
    register(_cls)

_plugins_loaded = False


def load_plugins() -> None:
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        cls = ep.load()
        if not (isinstance(cls, type) and issubclass(cls, Compressor)):
            raise TypeError(f"entry point {ep.name} = {ep.value} is not a Compressor subclass")
        register(cls)


def known_methods() -> list[str]:
    load_plugins()
    return sorted(REGISTRY)


def get_method(name: str) -> type[Compressor]:
    load_plugins()
    if name not in REGISTRY:
        from core.errors import did_you_mean

        raise UnknownMethod(f"unknown method '{name}'.{did_you_mean(name, REGISTRY)}")
    return REGISTRY[name]


def expand_methods(spec: str | list[str]) -> list[str]:
    names = spec.split(",") if isinstance(spec, str) else list(spec)
    names = [n.strip() for n in names if n.strip()]
    if "all" in names:
        return known_methods()
    for n in names:
        get_method(n)
    return list(dict.fromkeys(names))
