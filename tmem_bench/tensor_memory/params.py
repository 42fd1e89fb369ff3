"""Baselines at the tensor model's parameter count: the MLP width that matches it.

The width is solved for, not typed in. A model built on the transformer skeleton
grows only in its MLPs with `config.mlp_ratio`, so its parameter count is affine in
the hidden width and two probe widths give the exact line.
"""
from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn as nn

from ..contracts.transformer import Transformer, TransformerConfig
from .layer import tensor

TOLERANCE = 0.05


def n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def matched_hidden(target: int, config: TransformerConfig, model_class: type[Transformer] = Transformer) -> int:
    """MLP hidden width at which `model_class(config)` has the parameter count closest to `target`.

    Any model built on the transformer skeleton qualifies: its MLPs are its only part
    whose size follows `config.mlp_ratio`, so its count is affine in the hidden width.
    """
    d = config.d_model

    def count(hidden: int) -> int:
        return n_params(model_class(replace(config, mlp_ratio=hidden / d)))

    with torch.device("meta"):
        lo, hi = count(d), count(2 * d)
    per_unit = (hi - lo) / d
    return max(1, round(d + (target - lo) / per_unit))


def tensor_params(d_model: int, n_layers: int, n_heads: int, **memory_options) -> int:
    """Parameters of the `tensor` backbone at these sizes, counted without initialising (or drawing) a weight."""
    with torch.device("meta"):
        return n_params(tensor(d_model=d_model, n_layers=n_layers, n_heads=n_heads, **memory_options))


def match_tensor(model_class: type[Transformer], config: TransformerConfig, **memory_options) -> TransformerConfig:
    """`config` with the MLP width at which `model_class` has the parameter count of `tensor`
    (same d_model, n_layers, n_heads, and `memory_options`); ValueError when no width comes within 5%."""
    target = tensor_params(config.d_model, config.n_layers, config.n_heads, **memory_options)
    hidden = matched_hidden(target, config, model_class)
    matched = replace(config, mlp_ratio=hidden / config.d_model)
    with torch.device("meta"):
        got = n_params(model_class(matched))
    if abs(got - target) > TOLERANCE * target:
        raise ValueError(
            f"{model_class.__name__} cannot match the tensor model's {target} parameters through its MLP width "
            f"(best: hidden {hidden}, {got} parameters)"
        )
    return matched


def build_matched(model_class: type[Transformer], d_model: int, n_layers: int, n_heads: int, **options) -> Transformer:
    """`model_class` built from its config with `options`; without `mlp_ratio` in them, at the MLP
    width that matches `tensor`'s parameter count (the factory of every baseline so matched)."""
    config = model_class.config_class(d_model=d_model, n_layers=n_layers, n_heads=n_heads, **options)
    if "mlp_ratio" not in options:
        config = match_tensor(model_class, config)
    return model_class(config)
