"""CacheBlend (Yao et al., "CacheBlend: Fast Large Language Model Serving for RAG with Cached Knowledge
Fusion", EuroSys 2025): every memory token is recomputed through a check layer; the tokens whose values there
deviate most from the stored ones (a `ratio` of them) are the ones whose cross-attention was missing, and only
they are recomputed in the later layers."""

from __future__ import annotations

import torch

from methods.attention.tracing import QueryMode
from methods.base import Reading
from methods.errors import ConfigError, number_in, whole_number
from methods.memory import LatentMemory
from methods.peers.peer import Peer


def most_deviating(deviations: torch.Tensor, ratio: float, first: int = 1) -> torch.Tensor:
    """The memory positions (ascending; `deviations` [N] are of positions first..first+N-1) of the
    int(ratio * N) largest, ties to the earlier position (the authors' count: int(N * ratio))."""
    count = int(ratio * len(deviations))
    return torch.sort(torch.argsort(deviations, descending=True, stable=True)[:count]).values + first


class CacheBlend(Peer):
    """ratio: the share of memory tokens recomputed after the check layer; check_layer: 0-based, every token is
    recomputed through it."""

    phase = "check"
    recomputes = True

    def __init__(self, ratio: float = 0.16, check_layer: int = 1, select: int | None = None,
                 tracer_layer: int | None = 0, query_mode: QueryMode | None = "last"):
        number_in("method.ratio", ratio, 0, 1, why="the share of memory tokens recomputed after the check layer")
        whole_number("method.check_layer", check_layer, least=0)
        super().__init__(select, tracer_layer, query_mode)
        self.ratio, self.check_layer = float(ratio), check_layer

    def check(self, num_layers: int) -> None:
        super().check(num_layers)
        if self.check_layer >= num_layers:
            raise ConfigError(f"method.check_layer={self.check_layer} is not a layer of this model: it has "
                              f"{num_layers} (0..{num_layers - 1})")

    def reading(self, view: LatentMemory, backend) -> Reading:
        room = int(self.ratio * view.n_tokens) + 512          # the chosen tokens, a prompt and its answer
        chosen = most_deviating(backend.deviations(view, self.check_layer, room), self.ratio, view.sink_length)
        return Reading(recompute=chosen, recompute_through=self.check_layer)
