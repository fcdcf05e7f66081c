"""MemDefrag (paper Sec. 4.1, Alg. 1): rank fragments by attention density at a tracer layer,
reorder them densest-nearest-the-prompt, keep the Top-K."""

from __future__ import annotations

import torch

from methods.base import Method, Plan
from methods.generation import clock
from methods.attention.tracing import QueryMode, densities
from methods.errors import one_of


def defragment(density: torch.Tensor, k: int | None) -> list[int]:
    """Fragment indices in ascending density, truncated from the front to the last k (None: all)."""
    ascending = torch.argsort(density, stable=True).tolist()
    return ascending if k is None else ascending[-k:]


class MemDefrag(Method):
    """k: an integer >= 1, or 'all' (reorder only); tracer_layer: 0-based decoder index;
    query_mode: 'last' or 'mean' prompt tokens (None for either: the model has none recorded)."""

    def __init__(self, k: int | str = 2, tracer_layer: int | None = 0, query_mode: QueryMode | None = "last"):
        if k != "all" and (not isinstance(k, int) or isinstance(k, bool) or k <= 0):
            raise ValueError(f"method.k={k!r} is not allowed: use an integer >= 1 or 'all'")
        if query_mode is not None:
            one_of("method.query_mode", query_mode, QueryMode)
        self.k = None if k == "all" else k
        self.tracer_layer, self.query_mode = tracer_layer, query_mode

    def check(self, num_layers: int) -> None:
        if self.tracer_layer is None or self.query_mode is None:
            raise ValueError("method.tracer_layer and method.query_mode must be set: no tracer layer is recorded "
                             "for this model; run `memdefrag tracer-sweep model=...` for it (conf/tracers.yaml), "
                             "or set model.tracer_layer and model.query_mode")
        if not 0 <= self.tracer_layer < num_layers:
            raise ValueError(f"method.tracer_layer={self.tracer_layer} is out of range: this model has "
                             f"{num_layers} decoder layers, allowed 0..{num_layers - 1}")

    def plan(self, memory, prompt_ids, backend) -> Plan:
        if len(memory) == 0:
            return Plan(latent=memory)
        device = backend.model.device
        start = clock(device)
        rows = backend.attention_rows(memory, prompt_ids, [self.tracer_layer])[self.tracer_layer]
        density = densities(rows, memory.spans(self.tracer_layer), self.query_mode)
        traced = clock(device)
        view = memory.arranged(defragment(density, self.k))
        return Plan(latent=view, densities=density,
                    seconds={"trace": traced - start, "defragment": clock(device) - traced})
