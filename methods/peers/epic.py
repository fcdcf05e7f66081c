"""EPIC (Hu et al., "EPIC: Efficient Position-Independent Caching for Serving Large Language Models",
ICML 2025), its LegoLink: a fragment prefilled alone turns its first tokens into attention sinks; recomputing
the first k tokens of every fragment, with everything before them, takes those sinks away. Every other token
keeps its stored keys and values."""

from __future__ import annotations

import torch

from methods.attention.tracing import QueryMode
from methods.base import Reading
from methods.errors import whole_number
from methods.memory import LatentMemory
from methods.peers.peer import Peer


class EPIC(Peer):
    """k: tokens recomputed at the start of every fragment (0: vanilla)."""

    backends = ("fast", "hidden_prefix")
    recomputes = True

    def __init__(self, k: int = 32, select: int | None = None, tracer_layer: int | None = 0,
                 query_mode: QueryMode | None = "last"):
        whole_number("method.k", k, least=0)
        super().__init__(select, tracer_layer, query_mode)
        self.k = k

    def reading(self, view: LatentMemory, backend) -> Reading:
        firsts = [torch.arange(start, min(start + self.k, end), device="cpu") for start, end in view.spans()]
        return Reading(recompute=torch.cat(firsts) if firsts else torch.empty(0, dtype=torch.long, device="cpu"))
