"""Compression methods: one module per method, each a `Compressor` subclass, found by the registry.

A new module here is registered by being here; a method in another distribution registers through the
`acbench.methods` entry-point group (`name = "package.module:MyCompressor"`).

A method may be named with settings, `act-sparse:score=fisher,mitigation=shift`: such a *variant* is a row of its
own (its settings are in its name), so one sweep compares several settings of one method.
"""

from __future__ import annotations

from acbench.core.registry import Registry, UnknownName
from acbench.core.stats import LOW_RANK_FAMILY, SPARSITY_FAMILY, GroupStats, RankSpec, SparsitySpec

from .base import Compressor, GroupCompression, MaskedWeights, SparseActivation, SparsityMethod

__all__ = ["Compressor", "SparsityMethod", "GroupCompression", "SparseActivation", "MaskedWeights", "GroupStats",
           "RankSpec", "SparsitySpec", "REGISTRY", "get_method", "expand_methods", "known_methods", "UnknownName",
           "parse_variant", "build", "family_of", "FAMILIES", "pattern_problem"]

REGISTRY = Registry("method", __name__, Compressor, "acbench.methods")
FAMILIES = (LOW_RANK_FAMILY, SPARSITY_FAMILY)

get_method = REGISTRY.get


def known_methods(family: str | None = None) -> list[str]:
    return [n for n in REGISTRY.names() if family is None or REGISTRY.get(n).family == family]


def parse_variant(variant: str) -> tuple[str, dict]:
    """'act-sparse:score=fisher,mitigation=shift' -> ('act-sparse', {'score': 'fisher', 'mitigation': 'shift'});
    values are YAML scalars (numbers, booleans, strings). ValueError on a malformed settings list."""
    import yaml

    name, colon, rest = variant.partition(":")
    opts: dict = {}
    if colon:
        for item in rest.split(","):
            key, eq, value = item.partition("=")
            if not key.strip() or not eq:
                raise ValueError(f"method '{variant}': settings are written name:setting=value,setting=value "
                                 f"('{item}' is not setting=value)")
            if key.strip() in opts:
                raise ValueError(f"method '{variant}': setting {key.strip()} is given twice: keep one")
            try:
                opts[key.strip()] = yaml.safe_load(value.strip())
            except yaml.YAMLError:
                raise ValueError(f"method '{variant}': the value of {key.strip()} does not parse") from None
    return name.strip(), opts


def canonical(name: str, opts: dict) -> str:
    """One spelling per variant (settings sorted by name), so the same settings make the same row and folder."""
    if not opts:
        return name
    return name + ":" + ",".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in sorted(opts.items()))


def pattern_problem(variant: str, pattern: SparsitySpec, options: dict | None = None) -> str | None:
    """Why the sparsity method of `variant` (with its settings and `options`) cannot keep `pattern` (one line naming
    the fix), or None: the method's rule for the pattern, then what its settings make of it (`budget_problem`)."""
    problem = get_method(base_name(variant)).pattern_problem(pattern)
    if problem:
        return problem
    try:
        comp = build(variant, options)
    except (KeyError, TypeError, ValueError):
        return None  # settings that do not build are refused by the run's method checks, in their own words
    return comp.budget_problem(pattern) if hasattr(comp, "budget_problem") else None


def base_name(variant: str) -> str:
    return variant.partition(":")[0].strip()


def build(variant: str, options: dict | None = None) -> Compressor:
    """The Compressor of a method or variant: `options` (--method-option values for its base name) under the
    variant's own settings."""
    name, opts = parse_variant(variant)
    return get_method(name).from_options({**(options or {}), **opts})


def family_of(variant: str) -> str:
    return get_method(base_name(variant)).family


def split_methods(items) -> list[str]:
    """'pca,act-sparse:score=fisher,mitigation=shift' -> ['pca', 'act-sparse:score=fisher,mitigation=shift']: a
    comma separates methods except inside a variant's settings (an item that is only setting=value belongs to the
    variant before it)."""
    out: list[str] = []
    for item in ([items] if isinstance(items, str) else list(items)):
        for part in str(item).split(","):
            part = part.strip()
            if not part:
                raise ValueError(f"--methods '{item}': an empty name or setting between commas: remove the "
                                 "extra comma")
            if "=" in part and ":" not in part and out and ":" in out[-1]:
                out[-1] += "," + part
            else:
                out.append(part)
    return out


def expand_methods(spec, families=None) -> list[str]:
    """Method names (or variants) in canonical spelling; 'all' means every method of `families` (default all)."""
    names = split_methods(spec)
    out = []
    for n in names:
        if n == "all":
            out += [m for f in (families or FAMILIES) for m in known_methods(f)]
            continue
        name, opts = parse_variant(n)
        get_method(name)
        out.append(canonical(name, opts))
    return list(dict.fromkeys(out))
