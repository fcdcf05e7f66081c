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


CHECK_EVERY = 8          # on a GPU, tokens decoded between two looks for a stop id


class Look:
    """Whether a stop id was decoded, asked of the device without waiting for it: the device's answer is copied
    to the host asynchronously and read once a CUDA event says it has landed (at once elsewhere)."""

    def __init__(self, found: torch.Tensor):
        self.answer = found.to("cpu", non_blocking=True)
        self.landed = None
        if found.device.type == "cuda":
            self.landed = torch.cuda.Event()
            self.landed.record()

    def ready(self) -> bool:
        return self.landed is None or self.landed.query()


@torch.no_grad()
def greedy(model, logits: torch.Tensor, cache, position: int, max_new_tokens: int, stop: set[int],
           check_every: int | None = None) -> list[int]:
    """Continue greedily from the last row of `logits` [p, vocab] until a stop id or the budget; the ids before
    the first stop id.

    Each next id stays on the device and feeds the next step as it is: every `check_every` tokens the device is
    asked whether a stop id came (default: CHECK_EVERY on a GPU; every token on a CPU, where a look costs nothing
    and a step past the stop would), and its answer is read once it has reached the host (`Look`), so the host
    never waits for the device inside the loop. The steps decoded past a stop are dropped; the ids are those of a
    loop that stops at once. The ids are read to the host once, at the end."""
    device = model.device
    if max_new_tokens < 1:
        return []
    check_every = check_every or (1 if device.type == "cpu" else CHECK_EVERY)
    positions = torch.arange(position, position + max_new_tokens, device=device).view(1, -1)
    stops = torch.tensor(sorted(stop), dtype=torch.long, device=device)
    ids = [logits[-1].argmax().view(1, 1)]
    keyword = cache_keyword(model)
    looks: list[Look] = []                  # asked, not yet read
    while len(ids) < max_new_tokens:
        if len(ids) % check_every == 0:
            looks.append(Look(torch.isin(torch.cat(ids[-check_every:]), stops).any()))
            landed = [look for look in looks if look.ready()]
            if any(look.answer for look in landed):
                break
            looks = [look for look in looks if look not in landed]
        step = model(input_ids=ids[-1], **{keyword: cache}, position_ids=positions[:, len(ids) - 1:len(ids)],
                     use_cache=True)
        ids.append(step.logits[0, -1].argmax().view(1, 1))
    out = torch.cat(ids).view(-1).tolist()
    first_stop = next((i for i, token in enumerate(out) if token in stop), len(out))
    return out[:first_stop]
