"""transformers' Conv1D (GPT-2, OpenAI GPT, and their descendants) seen as nn.Linear.

Conv1D is a linear layer whose weight is stored transposed ([in, out]). Rather than teach every method, the
calibration hooks and the deployment a second weight layout, each Conv1D site is swapped for a `Conv1DLinear`: an
nn.Linear whose weight is a transposed view of the same storage (no copy; the same addmm, so the same numbers) and
whose state dict keeps Conv1D's [in, out] layout, so a checkpoint saved from it loads in plain transformers.
"""

from __future__ import annotations

from torch import nn


class Conv1DLinear(nn.Linear):
    """An nn.Linear over a Conv1D's storage; reads and writes its state dict in Conv1D's transposed layout."""

    @classmethod
    def of(cls, conv: nn.Module) -> "Conv1DLinear":
        lin = cls.__new__(cls)
        nn.Module.__init__(lin)
        lin.in_features, lin.out_features = int(conv.weight.shape[0]), int(conv.weight.shape[1])
        lin.weight = nn.Parameter(conv.weight.detach().t(), requires_grad=conv.weight.requires_grad)
        lin.bias = conv.bias
        return lin

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        key = prefix + "weight"
        if key in destination:
            destination[key] = destination[key].t() if keep_vars else destination[key].t().contiguous()

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        key = prefix + "weight"
        if key in state_dict:  # stored as Conv1D stores it: [in, out]
            state_dict = {**state_dict, key: state_dict[key].t()}
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


def _conv1d_class():
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:  # a transformers without it has no model that uses it
        return None
    return Conv1D


def linearize_conv1d(model: nn.Module) -> int:
    """Swap every transformers Conv1D in the model for a Conv1DLinear over the same storage; the number swapped."""
    conv1d = _conv1d_class()
    if conv1d is None:
        return 0
    found = [(name, mod) for name, mod in model.named_modules() if isinstance(mod, conv1d)]
    for name, mod in found:
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, attr, Conv1DLinear.of(mod))
    return len(found)

