"""LLMLingua (v1) iterative token-level compression, native: a fragment is read in segments of
`segment_tokens`; each segment's tokens are scored by a causal LM given the compressed text kept so
far (not the original text: what earlier segments dropped no longer explains what follows), and the
segment keeps its share of the tokens it finds least predictable, in order.

Why native: the `llmlingua` package's v1 path unpacks the key/value cache as tuples, which transformers
5 no longer returns (it fails on any fragment longer than its window), and within one window it only
thresholds the last tokens, so a fragment shorter than its 200-token window is barely compressed.
The scoring LM is the run's own model unless `model` names another local causal LM; then the kept text
is re-read with the run's tokenizer.
"""

from __future__ import annotations

from functools import cached_property

from methods.compression.compressor import Compressor, kept_count
from methods.compression.self_information import self_information
from methods.sources import unavailable, without_weights


def segment_quotas(tokens: int, kept: int, segment_tokens: int) -> list[int]:
    """How many of each segment's tokens to keep: `kept` in all, spread in proportion to length."""
    ends = list(range(segment_tokens, tokens, segment_tokens)) + [tokens]
    targets = [round(kept * end / tokens) for end in ends]
    return [b - a for a, b in zip([0, *targets], targets)]


class LLMLingua(Compressor):
    """model: None for the run's own model, or a local causal LM (folder or cached hub id);
    segment_tokens: the iteration window, in the scoring model's tokens."""

    label = "llmlingua"

    def __init__(self, rate: float = 0.5, model: str | None = None, segment_tokens: int = 50):
        super().__init__(rate)
        if isinstance(segment_tokens, bool) or not isinstance(segment_tokens, int) or segment_tokens < 1:
            raise ValueError(f"compression.segment_tokens={segment_tokens!r} must be a whole number >= 1")
        self.model, self.segment_tokens = model, segment_tokens

    def check(self) -> None:
        if self.model is None:
            return
        why = unavailable(self.model) or without_weights(self.model)
        if why:
            raise ValueError(f"compression.model={self.model!r} {why} (a causal LM; null for the run's own model)")

    def describe(self) -> dict:
        return {**super().describe(), "model": self.model or "the run's model", "segment_tokens": self.segment_tokens}

    @cached_property
    def scorer(self):
        """(model, tokenizer) of the separate scoring LM."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        return AutoModelForCausalLM.from_pretrained(self.model).eval(), AutoTokenizer.from_pretrained(self.model)

    def positions(self, ids: list[int], model, tokenizer) -> list[int]:
        """The positions of `ids` kept, ascending."""
        kept: list[int] = []
        start = 0
        for quota in segment_quotas(len(ids), kept_count(len(ids), self.rate), self.segment_tokens):
            segment = range(start, min(start + self.segment_tokens, len(ids)))
            if quota == len(segment):
                kept += segment
            elif quota:
                context = [ids[p] for p in kept]
                info = self_information(model, tokenizer, context + [ids[p] for p in segment])[len(context):]
                kept += sorted(segment[i] for i in (-info).sort(stable=True).indices[:quota].tolist())
            start = segment.stop
        return kept

    def compress(self, text, model, tokenizer):
        if self.model is None:
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            return [ids[p] for p in self.positions(ids, model, tokenizer)]
        scorer, scorer_tokenizer = self.scorer
        ids = scorer_tokenizer(text, add_special_tokens=False)["input_ids"]
        kept = scorer_tokenizer.decode([ids[p] for p in self.positions(ids, scorer, scorer_tokenizer)])
        return tokenizer(kept, add_special_tokens=False)["input_ids"]
