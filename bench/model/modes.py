"""A model's training flags, module by module: taken before acbench puts a model in eval mode (calibration, a
deployment, a checkpoint's check) and put back after, so a caller's own mix (frozen parts in eval mode, others
training) is as it was."""

from __future__ import annotations


def training_modes(model) -> dict:
    """{module: its training flag} for every module of `model`."""
    return {m: m.training for m in model.modules()}


def restore_modes(modes: dict) -> None:
    for module, training in modes.items():
        module.training = training
