"""What a method decides: which memory a question is answered with."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field

import torch

from methods.attention.parallel import parallel_attention
from methods.errors import ConfigError, returned
from methods.memory import LatentMemory


@dataclass(frozen=True)
class Question:
    """What a method may know of a question besides its prompt ids: its text (for a ranker that reads text),
    and the stored fragments the task marks as holding its answer (for an oracle; none where a task marks
    none)."""

    text: str = ""
    targets: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Reading:
    """How a backend reads a latent memory: by default its stored keys and values, the fragments at contiguous
    positions, the model's own attention.

    recompute: memory positions [m] (ascending; after the sink's) recomputed at every layer with causal attention
    over everything before them (EPIC's first tokens of each fragment, CacheBlend's chosen tokens);
    recompute_through: every memory position is also recomputed through this layer (CacheBlend's check
    layer; -1: none); parallel: every fragment at the positions after the sink and the prompt after the
    longest, read with APE's merged attention (temperature, scale)."""

    recompute: torch.Tensor | None = None
    recompute_through: int = -1
    parallel: bool = False
    temperature: float = 1.0
    scale: float = 1.0

    @property
    def recomputes(self) -> bool:
        """Whether any memory position is recomputed."""
        return self.recompute_through >= 0 or (self.recompute is not None and len(self.recompute) > 0)

    def attention(self, model, memory: LatentMemory | None):
        """What the prompt and the answer's tokens are read under: APE's merged attention where parallel (the
        model's own otherwise, also with no latent memory)."""
        if not self.parallel:
            return nullcontext()
        first = memory.sink_length
        return parallel_attention(model, (first, first + memory.n_tokens), self.temperature, self.scale)

    def recomputed(self, n_tokens: int, num_layers: int) -> float:
        """Memory positions recomputed, averaged over the layers (a full prefill: n_tokens)."""
        chosen = 0 if self.recompute is None else int((self.recompute > 0).sum())
        through = min(self.recompute_through + 1, num_layers)
        return (through * n_tokens + (num_layers - through) * chosen) / num_layers


@dataclass
class Plan:
    """How one question is answered.

    latent: the memory to use as a per-layer prefix (None: no latent prefix).
    text_ids: plain tokens placed before the prompt instead (text memory), or None.
    densities: the score of every stored fragment, in memory order, where the method ranks them (attention
    density for MemDefrag's ranker; a record's target_rank is the target's rank under it).
    seconds: time per phase of planning (e.g. trace, select), where a method has phases.
    read: the ids of the stored fragments the answer reads, where the method chooses some (a selection).
    scored_by: what gave `densities` (a ranker's name: attention density unless a retriever scored them).
    reading: how the backend reads `latent` (recomputed positions, parallel positions).
    """

    latent: LatentMemory | None = None
    text_ids: torch.Tensor | None = None
    densities: torch.Tensor | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    read: list[int] | None = None
    scored_by: str = "density"
    reading: Reading = field(default_factory=Reading)


A_PLAN = "a Plan (methods.base), e.g. Plan(latent=memory) to read the whole memory"


def taken(plan, method, memory: LatentMemory) -> Plan:
    """A method's plan as the session reads it: a Plan whose `read` names fragment ids of `memory` (memory.ids()),
    those its latent view holds where it has one; otherwise one line naming the method. Indices into the memory
    read as other fragments' ids, so a record would say the wrong fragments were read."""
    where = f"method {type(method).__name__}.plan"
    returned(plan, Plan, where, A_PLAN)
    view = plan.latent
    if isinstance(view, LatentMemory) and view is not memory and isinstance(memory, LatentMemory):
        if view.sink is not memory.sink or not set(view.ids()) <= set(memory.ids()):      # a fragment may be cut
            raise ConfigError(f"{where} returned a latent view that is not of the memory it was given: build it "
                              f"from that memory at each question (memory.arranged(order), or the memory itself)")
    if plan.read is None:
        return plan
    held = memory.ids() if plan.latent is None else plan.latent.ids()
    if sorted(plan.read) != sorted(held) if plan.latent is not None else not set(plan.read) <= set(held):
        raise ConfigError(f"{where} returned Plan(read={list(plan.read)}) for a "
                          f"{'latent view of fragments' if plan.latent is not None else 'memory of fragments'} "
                          f"{held}; `read` takes the ids of the fragments read (memory.ids()), not their indices")
    return plan


class Method:
    """A method turns (memory, prompt) into a Plan; the session does the rest.

    needs_latent: whether stored fragments must be formed into latent states.
    needs_targets: it reads the fragments a task marks as holding the answer (an oracle): only tasks that
    mark them (`marks_targets`) can run it.
    backends: the backends that can read the memory it plans over.
    keeps_own_memory: its model keeps a memory of its own (MemoryLLM), written by `writer`, not by the
    session's formation and forgetting.
    recomputes: it recomputes memory tokens from their ids (EPIC, CacheBlend), which must then be the same at
    every layer.
    parallel: it reads every fragment at the same positions after the sink (APE): an answer's read takes the
    longest fragment's positions, not the memory's (a record's `used_tokens` counts the memory's).
    traces: it plans with a forward of the prompt over the whole memory (attention density), a read of every
    memory position besides the answer's.
    reads_memory: it reads the memory at all (False: the no-memory borderline, whose stored memory no read
    counts against the model's window).
    """

    needs_latent = True
    reads_memory = True
    needs_targets = False
    backends = ("fast", "hidden_prefix")
    keeps_own_memory = False
    recomputes = False
    parallel = False
    traces = False

    def plan(self, memory: LatentMemory, prompt_ids: torch.Tensor, backend, question: Question = Question()) -> Plan:
        raise NotImplementedError

    def stored(self, fragment) -> dict[str, float]:
        """A fragment has joined the memory; the seconds of any work the method does on it then, per phase."""
        return {}

    def check(self, num_layers: int) -> None:
        """Raise ValueError for settings the model cannot honour (before any work)."""

    def check_model(self, model_config) -> None:
        """Raise ValueError for a model the method cannot run on (before its weights load)."""

    def with_tokenizer(self, tokenizer) -> None:
        """The session's tokenizer, for a method that cuts text by its tokens (the text baseline's window)."""

    def for_group(self, index: int) -> "Method":
        """The method for one group: a copy whose random draws depend only on the group, where it draws."""
        return self

    def writer(self, model, tokenizer):
        """Where `keeps_own_memory`: what stores texts in the model's memory, with `memory` (the store
        questions read), `next_fragment` (what a text writes) and `admit` (how it joins the store)."""
        raise NotImplementedError
