"""What a method decides: which memory a question is answered with."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from methods.memory import LatentMemory


@dataclass
class Plan:
    """How one question is answered.

    latent: the memory to use as a per-layer prefix (None: no latent prefix).
    text_ids: plain tokens placed before the prompt instead (text memory), or None.
    densities: attention density of every stored fragment, in memory order, where traced.
    seconds: time per phase of planning (e.g. trace, defragment), where a method has phases.
    """

    latent: LatentMemory | None = None
    text_ids: torch.Tensor | None = None
    densities: torch.Tensor | None = None
    seconds: dict[str, float] = field(default_factory=dict)


class Method:
    """A method turns (memory, prompt) into a Plan; the session does the rest.

    needs_latent: whether stored fragments must be formed into latent states.
    """

    needs_latent = True

    def plan(self, memory: LatentMemory, prompt_ids: torch.Tensor, backend) -> Plan:
        raise NotImplementedError

    def check(self, num_layers: int) -> None:
        """Raise ValueError for settings the model cannot honour (before any work)."""
