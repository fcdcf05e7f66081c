"""What the peers share: each reads a view of the memory (the whole of it, or MemDefrag's Top-`select` view)
in its own way, a `Reading` the backend honours (recomputed positions, parallel positions)."""

from __future__ import annotations

from dataclasses import replace

from transformers import MODEL_FOR_CAUSAL_LM_MAPPING

from methods.attention.tracing import QueryMode, through_attention_functions
from methods.base import Method, Plan, Question, Reading
from methods.errors import ConfigError, whole_number
from methods.generation import clock
from methods.memdefrag import MemDefrag
from methods.memory import LatentMemory


class Peer(Method):
    """select: read MemDefrag's Top-`select` view (density at `tracer_layer`, `query_mode`) instead of the
    whole memory (None); phase: the name of the seconds the reading takes to decide, where it does work; the
    backends that can honour its reading (the fast one; EPIC's also on the hidden-prefix formulation)."""

    phase = "read"
    backends = ("fast",)

    def __init__(self, select: int | None = None, tracer_layer: int | None = 0,
                 query_mode: QueryMode | None = "last"):
        if select is not None:
            whole_number("method.select", select)
        self.selection = None if select is None else MemDefrag(select, tracer_layer, query_mode)
        self.traces = self.selection is not None

    def check(self, num_layers: int) -> None:
        if self.selection is not None:
            self.selection.check(num_layers)

    def check_model(self, model_config) -> None:
        """The reading goes through the family's attention functions: a family computing attention inline
        (Falcon) is refused before its weights load."""
        model_class = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(model_config), None)
        if model_class is not None and not through_attention_functions(model_class):
            raise ConfigError(f"method={type(self).__name__.lower()} reads the memory through transformers' "
                              f"attention functions; model type {model_config.model_type!r} computes attention "
                              f"inline ({model_class.__module__}), so it cannot be read this way")

    def reading(self, view: LatentMemory, backend) -> Reading:
        """How the backend reads `view`."""
        raise NotImplementedError

    def plan(self, memory, prompt_ids, backend, question: Question = Question()) -> Plan:
        chosen = Plan(latent=memory) if self.selection is None else \
            self.selection.plan(memory, prompt_ids, backend, question)
        if len(chosen.latent) == 0:
            return chosen
        start = clock(backend.model.device)
        reading = self.reading(chosen.latent, backend)
        return replace(chosen, reading=reading,
                       seconds={**chosen.seconds, self.phase: clock(backend.model.device) - start})
