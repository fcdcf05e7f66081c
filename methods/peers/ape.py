"""APE (Yang et al., "APE: Faster and Longer Context-Augmented Generation via Adaptive Parallel Encoding",
ICLR 2025): every fragment is encoded behind one shared prefix (here the shared sink of `formation=shared_sink`)
and read at the same positions, the prompt after the longest; the prompt's attention to the fragments is
sharpened by a temperature T and their block rescaled by S before it merges with the rest
(methods/attention/parallel.py)."""

from __future__ import annotations

from methods.attention.tracing import QueryMode
from methods.base import Reading
from methods.errors import number_in
from methods.memory import LatentMemory
from methods.peers.peer import Peer


class APE(Peer):
    """temperature: T > 0 (1: the model's own logits); scale: S > 0 (1: the block's own share); 0.9 each: the
    authors' defaults."""

    parallel = True

    def __init__(self, temperature: float = 0.9, scale: float = 0.9, select: int | None = None,
                 tracer_layer: int | None = 0, query_mode: QueryMode | None = "last"):
        number_in("method.temperature", temperature, 0, why="T divides the prompt's logits to the fragments")
        number_in("method.scale", scale, 0, why="S rescales the fragments' share of attention")
        super().__init__(select, tracer_layer, query_mode)
        self.temperature, self.scale = float(temperature), float(scale)

    def reading(self, view: LatentMemory, backend) -> Reading:
        return Reading(parallel=self.parallel, temperature=self.temperature, scale=self.scale)
