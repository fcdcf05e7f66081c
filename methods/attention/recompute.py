"""Recomputing chosen memory positions over a cache of the placed memory (EPIC, CacheBlend, a full prefill).

A position recomputed at a layer attends, with causal attention by position, to everything before it: the
stored keys and values of the positions not recomputed and the recomputed ones of those that are. The chosen
tokens run in one forward through the model, after the placed memory in the cache: their keys and values are
written after it and every layer's attention is given a mask by position in place of the model's own (the
placed entries of the chosen positions hidden, the appended ones seen causally, a layer's sliding window
kept), so the model's own attention function computes it; their keys and values then replace the placed
ones. Exact by construction: recomputing every position is prefilling the memory's tokens as one sequence.
"""

from __future__ import annotations

import torch

from methods.attention.decoder import cache_keyword, hooked, layers
from methods.attention.tracing import StopForward, attention_calls, until_stopped


def sliding_window(module, kwargs: dict) -> int | None:
    """The layer's sliding window (keys within `window` positions of the query), None for global attention:
    what the family passes its attention function, or the config's window for a layer typed as sliding."""
    if kwargs.get("sliding_window"):
        return int(kwargs["sliding_window"])
    config = module.config
    types = getattr(config, "layer_types", None)
    if types and types[module.layer_idx] == "sliding_attention" and getattr(config, "sliding_window", None):
        return int(config.sliding_window)
    return None


def visible(query_positions: torch.Tensor, key_positions: torch.Tensor, hidden: torch.Tensor,
            window: int | None) -> torch.Tensor:
    """[q, kv] True where a query sees a key: not hidden, not after it, within the window (as transformers'
    sliding overlay: kv > q - window)."""
    seen = (key_positions[None, :] <= query_positions[:, None]) & ~hidden[None, :]
    if window:
        seen &= key_positions[None, :] > query_positions[:, None] - window
    return seen


def as_mask(seen: torch.Tensor, given: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """A [1, 1, q, kv] mask in the form the model built its own (`given`): boolean, or additive of its dtype."""
    if given is None or given.dtype == torch.bool:
        return seen[None, None]
    blocked = torch.finfo(given.dtype if given.is_floating_point() else dtype).min
    return torch.zeros(seen.shape, dtype=given.dtype, device=seen.device).masked_fill(~seen, blocked)[None, None]


@torch.no_grad()
def recompute(model, cache, token_ids: torch.Tensor, positions: torch.Tensor) -> None:
    """Recompute memory `positions` [m] (ascending, within the cache's filled part) of `cache` at every layer:
    `token_ids` [S] are the memory's ids by position. The cache keeps its length."""
    if len(positions) == 0:
        return
    device = model.device
    held = cache.layers[0].filled
    positions = positions.to(device)
    key_positions = torch.cat([torch.arange(held, device=device), positions])
    hidden = torch.zeros(held + len(positions), dtype=torch.bool, device=device)
    hidden[positions] = True
    masks: dict = {}

    def masked(inner, module, query, key, value, attention_mask, **kwargs):
        window = sliding_window(module, kwargs)
        if window not in masks:
            masks[window] = as_mask(visible(positions, key_positions, hidden, window), attention_mask, query.dtype)
        return inner(module, query, key, value, masks[window], **kwargs)

    with attention_calls(model, masked):
        decoder = model.get_decoder()
        decoder(input_ids=token_ids[positions.cpu()].view(1, -1).to(device), **{cache_keyword(decoder): cache},
                position_ids=positions.view(1, -1), use_cache=True)
    for layer in cache.layers:
        layer.move(held, positions)
        layer.fill_to(held)


@torch.no_grad()
def recompute_through(model, cache, token_ids: torch.Tensor, last_layer: int, sink_length: int = 1) -> None:
    """Recompute every memory position after the sink's `sink_length` through layers 0..`last_layer` of `cache`
    (a prefill of the memory's tokens as one sequence, stopped there); later layers keep the placed memory."""
    held = cache.layers[0].filled
    for layer in cache.layers:
        layer.fill_to(sink_length)

    def stop(index):
        def hook(module, args, output):
            raise StopForward
        return hook

    with hooked(layers(model), stop, before=False, only=[last_layer]):
        until_stopped(model.get_decoder(), input_ids=token_ids[sink_length:held].view(1, -1).to(model.device),
                      **{cache_keyword(model.get_decoder()): cache},
                      position_ids=torch.arange(sink_length, held, device=model.device).view(1, -1),
                      use_cache=True)
    for layer in cache.layers:
        layer.fill_to(held)
