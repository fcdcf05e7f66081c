"""Greedy decoding from a prefilled cache, shared by every backend and method."""

from __future__ import annotations

import time

import torch

from methods.attention.decoder import cache_keyword


def clock(device: torch.device) -> float:
    """perf_counter once the device has finished its queued work (a GPU runs ahead of Python)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def stop_ids(model, tokenizer) -> set[int]:
    """Every id that ends a turn: the tokenizer's eos and the generation config's."""
    ids = {tokenizer.eos_token_id}
    configured = getattr(model.generation_config, "eos_token_id", None)
    ids.update(configured if isinstance(configured, (list, tuple)) else [configured])
    return {int(i) for i in ids if i is not None}


@torch.no_grad()
def greedy(model, logits: torch.Tensor, cache, position: int, max_new_tokens: int, stop: set[int]) -> list[int]:
    """Continue greedily from the last row of `logits` [p, vocab] until a stop id or the budget."""
    out: list[int] = []
    next_id = int(logits[-1].argmax())
    while len(out) < max_new_tokens and next_id not in stop:
        out.append(next_id)
        if len(out) == max_new_tokens:
            break
        step = model(input_ids=torch.tensor([[next_id]], device=model.device), **{cache_keyword(model): cache},
                     position_ids=torch.tensor([[position]], device=model.device), use_cache=True)
        position += 1
        next_id = int(step.logits[0, -1].argmax())
    return out
