"""Rotary positions, given at query time to keys stored without them.

Stored keys are position-free (taken before RoPE at formation), so a fragment
can sit at any offset of the memory without being pushed through the network again.
"""

from __future__ import annotations

import torch


def decoder_of(model):
    """The stack of decoder layers, rotary embedding and embeddings of a causal LM."""
    return model.get_decoder()


def rotary_tables(model, positions: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of the model's own rotary embedding: each [S, head_dim]."""
    cos, sin = decoder_of(model).rotary_emb(like, positions.view(1, -1))
    return cos[0].to(like.dtype), sin[0].to(like.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Give positions to x [..., S, head_dim]; cos/sin [S, head_dim]."""
    return x * cos + _rotate_half(x) * sin

