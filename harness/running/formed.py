"""Fragments formed once in a process and served again (the distractors every group of a probe stores, in every
job of a sequential sweep): kept on the host, so that they never hold device memory between jobs, and bounded."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import replace

import torch

from methods.memory import Fragment, Layered

STORED = ("keys", "values", "states")


def tensors(fragment: Fragment) -> list[torch.Tensor]:
    """The stored tensors of a fragment (keys, values, states; a Layered's parts)."""
    found = []
    for name in STORED:
        t = getattr(fragment, name)
        found += [] if t is None else list(t.parts) if isinstance(t, Layered) else [t]
    return found


def moved(fragment: Fragment, move) -> Fragment:
    """The fragment with `move` applied to each stored tensor."""
    def each(t):
        return None if t is None else replace(t, parts=tuple(map(move, t.parts))) if isinstance(t, Layered) \
            else move(t)
    return replace(fragment, **{name: each(getattr(fragment, name)) for name in STORED})


def host_copy(t: torch.Tensor) -> torch.Tensor:
    """A compact host copy of t: its own bytes only, never the larger tensor a slice of it views; pinned where t
    was (memory_on=host) or CUDA is available, so that reusing a fragment formed on the GPU is no blocking copy."""
    return torch.empty(t.shape, dtype=t.dtype, pin_memory=t.is_pinned() or torch.cuda.is_available()).copy_(t)


class FormedFragments(Mapping):
    """Former's `reuse`: key -> Fragment. A fragment put in is copied to the host; one taken out is copied back
    to the device it was formed on (a host one is served as kept, shared as before). Beyond `budget` bytes the
    least recently used fragment is dropped (formed again when it recurs: formation is deterministic)."""

    def __init__(self, budget: int):
        self.budget, self.nbytes = budget, 0
        self._held: OrderedDict = OrderedDict()          # key -> (host fragment, device formed on, bytes)

    def __setitem__(self, key, fragment: Fragment) -> None:
        stored = tensors(fragment)
        device = stored[0].device if stored else torch.device("cpu")
        host = moved(fragment, host_copy)
        size = sum(t.nbytes for t in tensors(host))
        if key in self._held:
            self.nbytes -= self._held.pop(key)[2]
        self._held[key] = (host, device, size)
        self.nbytes += size
        while self.nbytes > self.budget and self._held:
            self.nbytes -= self._held.popitem(last=False)[1][2]

    def __getitem__(self, key) -> Fragment:
        host, device, _ = self._held[key]
        self._held.move_to_end(key)
        return host if device.type == "cpu" else moved(host, lambda t: t.to(device))

    def __contains__(self, key) -> bool:
        return key in self._held

    def __iter__(self) -> Iterator:
        return iter(list(self._held))

    def __len__(self) -> int:
        return len(self._held)


class Unkept(Mapping):
    """Former's `reuse` in a timed study (reuse_formed=false): holds nothing, so every group forms, and is charged,
    every fragment it reads, whatever ran before it in the process."""

    def __setitem__(self, key, fragment: Fragment) -> None:
        pass

    def __getitem__(self, key) -> Fragment:
        raise KeyError(key)

    def __iter__(self) -> Iterator:
        return iter(())

    def __len__(self) -> int:
        return 0
