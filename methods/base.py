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
    backends: the backends that can read the memory it plans over.
    keeps_own_memory: its model keeps a memory of its own (MemoryLLM), written by `writer`, not by the
    session's formation and forgetting.
    """

    needs_latent = True
    backends = ("fast", "hidden_prefix")
    keeps_own_memory = False

    def plan(self, memory: LatentMemory, prompt_ids: torch.Tensor, backend) -> Plan:
        raise NotImplementedError

    def check(self, num_layers: int) -> None:
        """Raise ValueError for settings the model cannot honour (before any work)."""

    def check_model(self, model_config) -> None:
        """Raise ValueError for a model the method cannot run on (before its weights load)."""

    def for_group(self, index: int) -> "Method":
        """The method for one group: a copy whose random draws depend only on the group, where it draws."""
        return self

    def writer(self, model, tokenizer):
        """Where `keeps_own_memory`: what stores texts in the model's memory, with `memory` (the store
        questions read), `next_fragment` (what a text writes) and `admit` (how it joins the store)."""
        raise NotImplementedError
