"""Selection as its own axis (method=select): a ranker scores the stored fragments, a size rule keeps the best
(Top-K, all, or adaptive K), an arrangement orders what is kept (the best next to the prompt, or the best
window of consecutive fragments rotated next to it), and a reading answers with them (as latent memory, or
as their text before the question: retrieval-augmented generation over the same fragments).

MemDefrag is density + Top-K + best last + latent (methods/memdefrag.py).
"""

from __future__ import annotations

import copy
from enum import StrEnum

import torch

from methods.attention.tracing import QueryMode
from methods.base import Method, Plan, Question
from methods.errors import number_in, one_of, whole_number
from methods.generation import clock
from methods.selection import rankers
from methods.selection.arrange import adaptive_k, defragment, rotated
from methods.selection.rankers import RankerName
from methods.sources import MINILM

Size = StrEnum("Size", ["topk", "all", "adaptive"])                 # how many of the best are kept
Arrangement = StrEnum("Arrangement", ["best_last", "rotate", "window"])
Reading = StrEnum("Reading", ["latent", "text"])


class Selection(Method):
    """ranker: density | bm25 | dense | oracle | recency | random; size: topk (keep k) | all (reorder only) |
    adaptive (K grows from 1 while the K-th best score is at most tau times the next, up to k_max);
    arrangement: best_last | rotate (the `window` consecutive fragments of largest summed score, wrapping
    around, rotated to end next to the prompt, the stored order kept) | window (only those); the size rule
    applies to best_last, the window to the other two, clipped to the memory; reading: latent | text;
    tracer_layer, query_mode: the density ranker's; seed: the random ranker's (per group); embedder: the
    dense ranker's sentence model."""

    def __init__(self, ranker: RankerName = "density", size: Size = "topk", k: int = 2, tau: float = 2.0,
                 k_max: int = 4, arrangement: Arrangement = "best_last", window: int = 2,
                 reading: Reading = "latent", tracer_layer: int | None = 0, query_mode: QueryMode | None = "last",
                 seed: int = 0, embedder: str = MINILM):
        for key, value, choices in (("ranker", ranker, RankerName), ("size", size, Size),
                                    ("arrangement", arrangement, Arrangement), ("reading", reading, Reading)):
            one_of(f"method.{key}", value, choices)
        if query_mode is not None:
            one_of("method.query_mode", query_mode, QueryMode)
        for key, value in (("k", k), ("k_max", k_max), ("window", window)):
            whole_number(f"method.{key}", value)
        number_in("method.tau", tau, 1, why="the score ratio that ends adaptive K")
        self.size, self.k, self.tau, self.k_max = size, k, float(tau), k_max
        self.arrangement, self.window, self.reading, self.seed = arrangement, window, reading, seed
        self.ranker_name = ranker
        self.ranker = {"density": lambda: rankers.Density(tracer_layer, query_mode), "bm25": rankers.BM25,
                       "dense": lambda: rankers.Dense(embedder), "oracle": rankers.Oracle,
                       "recency": rankers.Recency,
                       "random": lambda: rankers.Random(torch.Generator().manual_seed(seed))}[ranker]()
        self.needs_latent = reading == "latent" or self.ranker.needs_latent
        self.traces = self.ranker.needs_latent
        self.needs_targets = self.ranker.needs_targets

    def check(self, num_layers: int) -> None:
        self.ranker.check(num_layers)

    def for_group(self, index: int) -> "Selection":
        """The random ranker draws from the group's own generator; the others are shared."""
        if not isinstance(self.ranker, rankers.Random):
            return self
        fresh = copy.copy(self)
        fresh.ranker = rankers.Random(torch.Generator().manual_seed(self.seed * 1_000_003 + index))
        return fresh

    def stored(self, fragment) -> dict[str, float]:
        if not self.ranker.indexes:
            return {}
        start = clock(torch.device("cpu"))
        self.ranker.stored(fragment)
        return {"index": clock(torch.device("cpu")) - start}

    def order(self, scores: torch.Tensor) -> list[int]:
        """The kept fragments' indices, in reading order: host work on the scores, read to the host once."""
        scores = scores.cpu()
        if self.arrangement != "best_last":
            return rotated(scores, self.window, cut=self.arrangement == "window")
        keep = {"topk": self.k, "all": None, "adaptive": adaptive_k(scores, self.tau, self.k_max)}[self.size]
        return defragment(scores, keep)

    def plan(self, memory, prompt_ids, backend, question: Question = Question()) -> Plan:
        if len(memory) == 0:
            return Plan(latent=memory) if self.reading == "latent" else Plan()
        device = backend.model.device
        start = clock(device)
        scores = self.ranker.scores(memory, prompt_ids, backend, question)
        ranked = clock(device)
        view = memory.arranged(self.order(scores))
        seconds = {self.ranker.phase: ranked - start, "select": clock(device) - ranked}
        reading = {"text_ids": view.text_ids()} if self.reading == "text" else {"latent": view}
        return Plan(**reading, densities=scores, seconds=seconds, read=view.ids(), scored_by=self.ranker_name)
