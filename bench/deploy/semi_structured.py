"""Masked 2:4 weights (wanda, magnitude-prune) on sparse tensor cores: torch's semi-structured sparse tensors,
where they apply. Elsewhere the dense-shaped weight with zeros stays, and each cell's latency conditions record why
(acbench.measure.latency): no CPU kernel in torch exploits 2:4 weights, so there they run, and measure, as dense."""

from __future__ import annotations

import torch

MIN_CAPABILITY = (8, 0)  # sparse tensor cores: Ampere and later
SEMI_STRUCTURED = "semi-structured"
DENSE = "dense"


def backend():
    """The semi-structured class torch would use: cuSPARSELt where this build has it, else CUTLASS."""
    from torch.sparse import semi_structured as ss

    cusparselt = getattr(torch.backends, "cusparselt", None)
    if cusparselt is not None and cusparselt.is_available() and not ss.SparseSemiStructuredTensor._FORCE_CUTLASS:
        return ss.SparseSemiStructuredTensorCUSPARSELT
    return ss.SparseSemiStructuredTensorCUTLASS


def refusal(weight: torch.Tensor, n: int, m: int, capability: tuple[int, int] | None = None, cls=None) -> str | None:
    """None where the masked weight (d_out x d_in, `n` of every `m` consecutive inputs kept per row; m = 0:
    unstructured) can run as a semi-structured sparse tensor; else why not, in a few words. `capability` and
    `cls` (the backend class) are looked up on the weight's device unless given."""
    if (n, m) != (2, 4):
        return f"{'unstructured' if m == 0 else f'{n}:{m}'} weights: sparse tensor cores run 2:4 only"
    if weight.device.type != "cuda":
        return f"no {weight.device.type.upper()} kernel in torch exploits 2:4 weights"
    capability = capability or torch.cuda.get_device_capability(weight.device)
    if tuple(capability) < MIN_CAPABILITY:
        return (f"compute capability {capability[0]}.{capability[1]}: sparse tensor cores need "
                f"{MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or later")
    cls = cls or backend()
    limits = cls._DTYPE_SHAPE_CONSTRAINTS
    if weight.dtype not in limits:
        taken = ", ".join(str(d).removeprefix("torch.") for d in limits)
        return f"{cls.BACKEND} takes {taken}, not {str(weight.dtype).removeprefix('torch.')}"
    rows, cols = weight.shape
    need = limits[weight.dtype]
    if rows % need.sparse_min_rows or cols % need.sparse_min_cols:
        return (f"shape {rows}x{cols}: {cls.BACKEND} needs multiples of "
                f"{need.sparse_min_rows}x{need.sparse_min_cols}")
    return None


def deploy_semi_structured(weight: torch.Tensor, n: int, m: int, convert=None) -> torch.Tensor:
    """The weight a masked site runs: a semi-structured sparse tensor where one applies (`convert`, the backend's
    from_dense unless given), else the weight as it is."""
    if refusal(weight, n, m) is not None:
        return weight
    return (convert or backend().from_dense)(weight.contiguous())


def is_semi_structured(weight: torch.Tensor) -> bool:
    from torch.sparse import SparseSemiStructuredTensor

    return isinstance(weight, SparseSemiStructuredTensor)


def describe(weight: torch.Tensor, n: int, m: int) -> str:
    """What a masked site's product runs, for a cell's conditions: "semi-structured (<backend>)", or "dense:
    <why not>"."""
    if is_semi_structured(weight):
        return f"{SEMI_STRUCTURED} ({weight.BACKEND})"  # each backend's subclass names itself
    return f"{DENSE}: {refusal(weight, n, m) or 'not converted'}"
