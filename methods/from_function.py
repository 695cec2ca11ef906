"""A method in one function. `@low_rank_method` turns a function that returns one group's basis into a projection
method; `@sparsity_method` turns a function that returns one group's per-channel score factors into a per-token
top-k (or N:M) activation-sparsity method. The function declares what it reads (`needs`, its settings) in the
decorator and takes, by name, any of `stats` (the group's GroupStats), `weights` ({site: W}, d_out x d_in), `k`
(low-rank: the group's rank), `pattern` (sparsity: the SparsitySpec) and `settings`. Everything else is the family's
base class: registration (the decorated name is a Compressor subclass, found where it is defined or through an entry
point), the settings' checks, the plan-time cost and the run-time summary (both read from the one result type the
function's answer is put in: GroupCompression or SparseActivation), the deployment and the method contract that
`bench check-method` runs."""

from __future__ import annotations

import inspect
from typing import NamedTuple

import torch

from acbench.core.linalg import check_finite
from acbench.core.registry import NoSettings

from .base import Compressor, SparseActivation, SparsityMethod, projection_factors, projection_ops

LOW_RANK_ARGUMENTS = ("stats", "weights", "k", "settings")
SPARSITY_ARGUMENTS = ("stats", "weights", "pattern", "settings")
ORTHONORMAL_TOL = 1e-6  # |U^T U - I| allowed where a basis comes without its left inverse


class Basis(NamedTuple):
    """A low-rank function's answer, where it is more than the basis: U (d_in x k), the left inverse B (k x d_in) the
    projection P = U B uses (default U^T, for orthonormal columns), and the numeric fallbacks it took."""

    U: torch.Tensor
    B: torch.Tensor | None = None
    fallbacks: list = []


def _arguments(fn, allowed: tuple[str, ...]) -> tuple[str, ...]:
    """The names `fn` takes, each one of `allowed` (TypeError naming the others at decoration, not at a run)."""
    params = inspect.signature(fn).parameters
    odd = [p for p in params if p not in allowed]
    if odd:
        raise TypeError(f"{fn.__name__} takes {', '.join(odd)}: a method function takes any of {', '.join(allowed)}, "
                        "by name")
    return tuple(params)


def _class(fn, base: type, name: str, attributes: dict) -> type:
    """The Compressor subclass named after `fn`, defined (for the registry and the code digest) in fn's module."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"{fn.__name__}: the decorator's first argument is the method's name, e.g. \"my-pca\"")
    doc = inspect.getdoc(fn) or ""
    attributes = {"name": name, "__doc__": doc, "__module__": fn.__module__, "function": staticmethod(fn),
                  "description": attributes.pop("description") or doc.partition("\n")[0], **attributes}
    cls = type(fn.__name__, (base,), attributes)
    cls.__qualname__ = fn.__qualname__
    return cls


def _call(fn, args: tuple[str, ...], method, stats, **given):
    """fn on what it asked for, after the statistics its method reads are checked finite (one line naming them)."""
    check_finite(method.name, **{n: getattr(stats, n, None) for n in sorted(method.required_stats())
                                 if isinstance(getattr(stats, n, None), torch.Tensor)})
    given = {"stats": stats, "settings": method.settings, **given}
    return fn(**{a: given[a] for a in args})


def _common(needs, settings, version, authors_calibration) -> dict:
    return {"needs": frozenset(needs), "Settings": settings or NoSettings, "version": version,
            "authors_calibration": authors_calibration}


def low_rank_method(name: str, *, needs=(), description: str = "", settings: type | None = None, version: int = 1,
                    control: bool = False, authors_calibration=None, solve_ops=None):
    """Decorate `fn(stats, k, ...) -> U or Basis(U, B, fallbacks)`: the group input is projected on span(U)
    (x -> U B x, B = U^T by default) and every site deploys A_i = W_i U, the shared B. `solve_ops(d_in, d_outs, k)`:
    what the basis costs, for `bench plan` (the deployment's product is added)."""

    def decorate(fn):
        args = _arguments(fn, LOW_RANK_ARGUMENTS)

        def solve(self, weights, stats, k):
            d_in = next(iter(weights.values())).shape[1]
            U, B, fallbacks = _basis(self.name, _call(fn, args, self, stats, weights=weights, k=k), d_in, k)
            return projection_factors(weights, U, B), True, list(fallbacks), {}

        def ops(self, d_in, d_outs, k, pair_tokens):
            own = solve_ops(d_in, d_outs, k) if solve_ops else None
            return None if own is None else [*own, *projection_ops(d_in, d_outs, k)]

        return _class(fn, Compressor, name, {**_common(needs, settings, version, authors_calibration),
                                             "description": description, "control": control, "solve": solve,
                                             "solve_ops": ops})

    return decorate


def _basis(method: str, got, d_in: int, k: int):
    """(U, B, fallbacks) from a low-rank function's answer, checked: U is d_in x k, B is k x d_in, both finite; U
    alone must have orthonormal columns (its transpose is then its left inverse)."""
    U, B, fallbacks = got if isinstance(got, Basis) else Basis(got)
    if not isinstance(U, torch.Tensor) or U.ndim != 2 or tuple(U.shape) != (d_in, k):
        shape = tuple(U.shape) if isinstance(U, torch.Tensor) else type(U).__name__
        raise ValueError(f"method {method} returned a basis of {shape}, not ({d_in}, {k}): d_in x k columns")
    if not torch.isfinite(U).all():  # before the orthonormality check, which a NaN would fail with "nan"
        raise ValueError(f"method {method} returned a basis with NaN or inf entries")
    if B is None:
        gap = (U.T @ U - torch.eye(k, dtype=U.dtype, device=U.device)).abs().max().item() if k else 0.0
        if not gap <= ORTHONORMAL_TOL * max(1, k):
            raise ValueError(f"method {method} returned a basis whose columns are not orthonormal (|U^T U - I| = "
                             f"{gap:.2g}): orthonormalise it, or return Basis(U, B) with B its left inverse")
        B = U.T
    if not isinstance(B, torch.Tensor) or tuple(B.shape) != (k, d_in):
        raise ValueError(f"method {method} returned B of {tuple(getattr(B, 'shape', ()))}, not ({k}, {d_in})")
    if not (torch.isfinite(U).all() and torch.isfinite(B).all()):
        raise ValueError(f"method {method} returned a basis with NaN or inf entries")
    return U, B, fallbacks


def sparsity_method(name: str, *, needs=(), description: str = "", settings: type | None = None, version: int = 1,
                    authors_calibration=None):
    """Decorate `fn(stats, weights, ...) -> factors or None`: per token, the group keeps the channels with the
    largest |x_j| * factors_j (None: |x_j| alone) at the run's pattern, and every site reads the one sparse x."""

    def decorate(fn):
        args = _arguments(fn, SPARSITY_ARGUMENTS)

        def solve(self, weights, stats, pattern):
            got = _call(fn, args, self, stats, weights=weights, pattern=pattern)
            scale = _factors(self.name, got, next(iter(weights.values())).shape[1])
            return SparseActivation(pattern=pattern, scale=scale)

        return _class(fn, SparsityMethod, name, {**_common(needs, settings, version, authors_calibration),
                                                 "description": description, "takes_group_density": True,
                                                 "solve": solve})

    return decorate


def _factors(method: str, got, d_in: int) -> torch.Tensor | None:
    """A sparsity function's per-channel factors, checked: None, or d_in finite numbers >= 0 (as float32)."""
    if got is None:
        return None
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != (d_in,):
        shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        raise ValueError(f"method {method} returned score factors of {shape}, not ({d_in},): one per input channel")
    if not torch.isfinite(got).all() or (got < 0).any():
        raise ValueError(f"method {method} returned score factors that are negative, NaN or inf: return d_in "
                         "finite factors >= 0")
    return got.float()
