"""Bounded memory (paper Sec. 4.2, App. Alg. 1-2): who forgets how much, and which tokens go.

Before a fragment is appended to a memory of N tokens, N + |x| - N_max tokens
leave the stored fragments. Every strategy spreads that budget over fragments in
proportion to their retained lengths; they differ in which positions a fragment drops:
- ``informativeness``: its tokens of lowest self-information, the same at every layer;
- ``random``: random positions, the same at every layer (the paper's ablation);
- ``random_layerwise``: each layer its own random positions (MemoryLLM, M+).
  A fragment keeps the same length at every layer, so fragment boundaries, tracing
  and reordering are unchanged; but a memory position no longer holds the same
  token at every layer, so such a fragment has no text (token ids become per layer).
"""

from __future__ import annotations

from collections.abc import Sequence

import copy

import torch

from methods.memory import Fragment, LatentMemory


class CapacityError(ValueError):
    """A fragment that no amount of forgetting can make room for."""


def proportional_quotas(lengths: Sequence[int], total: int) -> list[int]:
    """Split `total` evictions over fragments of `lengths` in proportion (Alg. 2).

    Floors first, then one more to the largest fractional parts (earlier fragments
    win ties); integer arithmetic, so the quotas sum to `total` exactly.
    """
    size = sum(lengths)
    if any(n < 0 for n in lengths) or not 0 <= total <= size:
        raise ValueError(f"cannot evict {total} tokens from fragments of lengths {list(lengths)}")
    if total == 0:
        return [0] * len(lengths)
    quotas = [total * n // size for n in lengths]
    remainders = [total * n % size for n in lengths]
    left = total - sum(quotas)
    for i in sorted(range(len(lengths)), key=lambda i: (-remainders[i], i))[:left]:
        quotas[i] += 1
    return quotas


class Forgetting:
    """A capacity and a rule for which positions of a fragment survive its quota.

    capacity: N_max in memory tokens (the sink excluded).
    """

    layerwise = False
    needs_self_info = False

    def __init__(self, capacity: int | None, seed: int = 0):
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"forgetting.capacity={capacity!r} must be a positive integer "
                             "(N_max in memory tokens; model.memory_capacity sets it)")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"forgetting.seed={seed!r} must be an integer")
        self.capacity, self.seed = capacity, seed
        self.generator = torch.Generator().manual_seed(seed)

    def for_group(self, index: int) -> "Forgetting":
        """A copy whose random draws depend only on (seed, group): runs are order-independent."""
        fresh = copy.copy(self)
        fresh.generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        return fresh

    def admit(self, memory: LatentMemory, fragment: Fragment) -> int:
        """Make room for `fragment`, then append it; returns how many tokens were evicted."""
        if len(fragment) > self.capacity:
            raise CapacityError(f"a fragment of {len(fragment)} tokens exceeds forgetting.capacity="
                             f"{self.capacity}; raise the capacity or cut the fragment")
        excess = max(0, memory.n_tokens + len(fragment) - self.capacity)
        self.evict(memory, excess)
        memory.append(fragment)
        return excess

    def evict(self, memory: LatentMemory, total: int) -> None:
        """Remove `total` tokens from `memory`'s fragments; fragments left empty are forgotten."""
        if total == 0:
            return
        quotas = proportional_quotas([len(f) for f in memory.fragments], total)
        layers = memory.sink.num_layers
        for index, quota in enumerate(quotas):
            if quota:
                memory.keep(index, self.survivors(memory.fragments[index], quota, layers))
        memory.fragments = [f for f in memory.fragments if len(f)]

    def survivors(self, fragment: Fragment, quota: int, layers: int | None) -> torch.Tensor:
        """Sorted positions [T - quota] (or [layers, T - quota] when layerwise) that stay."""
        raise NotImplementedError


class NoForgetting:
    """Unbounded memory: nothing is ever evicted."""

    capacity, layerwise, needs_self_info = None, False, False

    def for_group(self, index: int) -> "NoForgetting":
        return self

    def admit(self, memory: LatentMemory, fragment: Fragment) -> int:
        memory.append(fragment)
        return 0


class Informativeness(Forgetting):
    """Drop the tokens of lowest self-information (ties: the earlier token goes first)."""

    needs_self_info = True

    def survivors(self, fragment, quota, layers):
        order = torch.sort(fragment.self_info, stable=True).indices
        return order[quota:].sort().values


class RandomForgetting(Forgetting):
    """Drop random positions, the same at every layer."""

    def survivors(self, fragment, quota, layers):
        return torch.randperm(len(fragment), generator=self.generator)[quota:].sort().values


class RandomLayerwise(Forgetting):
    """Drop random positions chosen independently at every layer."""

    layerwise = True

    def survivors(self, fragment, quota, layers):
        if layers is None:
            raise ValueError("forgetting=random_layerwise needs a latent memory (layers); "
                             "text memory has one sequence of tokens")
        draws = [torch.randperm(len(fragment), generator=self.generator)[quota:] for _ in range(layers)]
        return torch.stack(draws).sort(dim=1).values


def pairing_refusal(method, forgetting, method_name: str, forgetting_name: str) -> str | None:
    """Why `forgetting` cannot serve `method` (None where it can), naming them as given: the runner's and a
    library session's one check."""
    if method.keeps_own_memory and forgetting.capacity is not None:
        return (f"{forgetting_name}: {method_name} keeps a memory of its own that forgets by its own rule; "
                f"use forgetting=none")
    if forgetting.layerwise and not method.needs_latent:
        return (f"{forgetting_name} drops different tokens at every layer; {method_name} has no layers (use a "
                f"latent method or forgetting=random)")
    if forgetting.layerwise and method.recomputes:
        return (f"{forgetting_name} drops different tokens at every layer; {method_name} recomputes memory "
                f"tokens from their ids, which must be the same at every layer (use forgetting=random or "
                f"informativeness)")
    return None
