"""What a method decides: which memory a question is answered with."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from methods.memory import LatentMemory


@dataclass(frozen=True)
class Question:
    """What a method may know of a question besides its prompt ids: its text (for a ranker that reads text),
    and the stored fragments the task marks as holding its answer (for an oracle; none where a task marks
    none)."""

    text: str = ""
    targets: frozenset[int] = frozenset()


@dataclass
class Plan:
    """How one question is answered.

    latent: the memory to use as a per-layer prefix (None: no latent prefix).
    text_ids: plain tokens placed before the prompt instead (text memory), or None.
    densities: the score of every stored fragment, in memory order, where the method ranks them (attention
    density for MemDefrag's ranker; a record's target_rank is the target's rank under it).
    seconds: time per phase of planning (e.g. trace, select), where a method has phases.
    read: the ids of the stored fragments the answer reads, where the method chooses some (a selection).
    """

    latent: LatentMemory | None = None
    text_ids: torch.Tensor | None = None
    densities: torch.Tensor | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    read: list[int] | None = None


class Method:
    """A method turns (memory, prompt) into a Plan; the session does the rest.

    needs_latent: whether stored fragments must be formed into latent states.
    needs_targets: it reads the fragments a task marks as holding the answer (an oracle): only tasks that
    mark them (`marks_targets`) can run it.
    backends: the backends that can read the memory it plans over.
    keeps_own_memory: its model keeps a memory of its own (MemoryLLM), written by `writer`, not by the
    session's formation and forgetting.
    """

    needs_latent = True
    needs_targets = False
    backends = ("fast", "hidden_prefix")
    keeps_own_memory = False

    def plan(self, memory: LatentMemory, prompt_ids: torch.Tensor, backend, question: Question = Question()) -> Plan:
        raise NotImplementedError

    def stored(self, fragment) -> dict[str, float]:
        """A fragment has joined the memory; the seconds of any work the method does on it then, per phase."""
        return {}

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
