"""Rankers: one score per stored fragment, higher meaning more relevant to the question.

`density` is MemDefrag's (the prompt's attention at a tracer layer, one forward over the memory); `bm25`
(lexical, `bm25s`) and `dense` (cosine of sentence embeddings) read only the fragments' text and the
question, with no forward of the model; `oracle` puts first what the task marks as holding the answer
(the ceiling of any selector); `recency` (newest first) and `random` are floors.
"""

from __future__ import annotations

from enum import StrEnum
from functools import cached_property

import torch

from methods.attention.tracing import densities
from methods.base import Question
from methods.errors import ConfigError
from methods.sources import MINILM, minilm_folder, unavailable


class Ranker:
    """phase: the name of its time in a record's seconds; needs_latent: it reads the latent memory;
    needs_targets: it reads the fragments the task marks; indexes: it works on each fragment as it is stored."""

    phase, needs_latent, needs_targets, indexes = "rank", False, False, False

    def check(self, num_layers: int) -> None:
        """Refuse (ValueError) settings the model cannot honour, before any weights load."""

    def stored(self, fragment) -> None:
        """A fragment has joined the memory (a ranker that indexes does it here, once)."""

    def scores(self, memory, prompt_ids: torch.Tensor, backend, question: Question) -> torch.Tensor:
        raise NotImplementedError


class Density(Ranker):
    """The prompt's mean attention to each fragment at `tracer_layer` (paper Eq. 2)."""

    phase, needs_latent = "trace", True

    def __init__(self, tracer_layer: int | None, query_mode: str | None):
        self.tracer_layer, self.query_mode = tracer_layer, query_mode

    def check(self, num_layers: int) -> None:
        if self.tracer_layer is None or self.query_mode is None:
            raise ValueError("method.tracer_layer and method.query_mode must be set: no tracer layer is recorded "
                             "for this model; run `memdefrag tracer-sweep model=...` for it (conf/tracers.yaml), "
                             "or set model.tracer_layer and model.query_mode")
        if isinstance(self.tracer_layer, bool) or not isinstance(self.tracer_layer, int) \
                or not 0 <= self.tracer_layer < num_layers:
            raise ValueError(f"method.tracer_layer={self.tracer_layer!r} is out of range: this model has "
                             f"{num_layers} decoder layers, allowed the integers 0..{num_layers - 1}")

    def scores(self, memory, prompt_ids, backend, question):
        rows = backend.attention_rows(memory, prompt_ids, [self.tracer_layer])[self.tracer_layer]
        return densities(rows, memory.spans(self.tracer_layer), self.query_mode)


class BM25(Ranker):
    """Okapi BM25 (`bm25s`, its defaults, English stopwords) of the question over the fragments' text."""

    def scores(self, memory, prompt_ids, backend, question):
        import bm25s

        corpus = [fragment.text for fragment in memory.fragments]
        index = bm25s.BM25()
        index.index(bm25s.tokenize(corpus, stopwords="en", show_progress=False), show_progress=False)
        words = bm25s.tokenize([question.text], stopwords="en", return_ids=False, show_progress=False)[0]
        return torch.tensor(index.get_scores(words) if words else [0.0] * len(corpus), dtype=torch.float32,
                            device="cpu")


class Dense(Ranker):
    """Cosine similarity of sentence embeddings (a sentence-transformers model: `minilm`, the shipped
    all-MiniLM-L6-v2, or a local folder or hub id); a text is embedded once, when it is first stored."""

    indexes = True

    def __init__(self, embedder: str = MINILM):
        self.embedder = embedder
        self.embeddings: dict[str, torch.Tensor] = {}

    def check(self, num_layers: int) -> None:
        if self.embedder == MINILM:
            minilm_folder("method.embedder")
        elif why := unavailable(self.embedder):
            raise ConfigError(f"method.embedder={self.embedder!r} {why}")

    @cached_property
    def model(self):
        from sentence_transformers import SentenceTransformer

        source = str(minilm_folder("method.embedder")) if self.embedder == MINILM else self.embedder
        return SentenceTransformer(source, device="cpu")

    def _encode(self, text: str) -> torch.Tensor:
        return self.model.encode([text], convert_to_tensor=True, normalize_embeddings=True,
                                 show_progress_bar=False)[0].float().cpu()

    def stored(self, fragment) -> None:
        if fragment.text not in self.embeddings:
            self.embeddings[fragment.text] = self._encode(fragment.text)

    def scores(self, memory, prompt_ids, backend, question):
        for fragment in memory.fragments:           # stored before this ranker saw them (a memory loaded)
            self.stored(fragment)
        asked = self._encode(question.text)
        return torch.stack([self.embeddings[fragment.text] @ asked for fragment in memory.fragments])


class Oracle(Ranker):
    """1 for each fragment the task marks as holding the answer, 0 for the rest (stored order among equals)."""

    needs_targets = True

    def scores(self, memory, prompt_ids, backend, question):
        return torch.tensor([float(fragment.fid in question.targets) for fragment in memory.fragments], device="cpu")


class Recency(Ranker):
    """The newest stored fragment first (by when it was stored, not where it now stands)."""

    def scores(self, memory, prompt_ids, backend, question):
        return torch.tensor([float(fragment.fid) for fragment in memory.fragments], device="cpu")


class Random(Ranker):
    """Uniform random scores from the group's own generator."""

    def __init__(self, generator: torch.Generator):
        self.generator = generator

    def scores(self, memory, prompt_ids, backend, question):
        return torch.rand(len(memory), generator=self.generator)


RankerName = StrEnum("RankerName", ["density", "bm25", "dense", "oracle", "recency", "random"])
