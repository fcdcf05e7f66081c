"""LLMLingua-2, the paper's compressor, native: a token classifier gives each of its tokens a probability of
being kept, a word's probability is the mean over its tokens (the `llmlingua` package's default), and the
most probable words are kept, in their original order, until exactly `rate` of the fragment's tokens
remain.

Why native: the package thresholds at an integer percentile of its words' probabilities per 512-token
chunk and counts tokens in GPT's cl100k encoding, so it lands several tokens off the asked share of the
memory's own tokens (7 off on 120-token fragments), and it fetches that encoding from the network when it
starts. Here the budget is counted in the run model's tokens (what fills the memory): words are taken by
probability while they fit; a word too long for what remains is passed over for the next that fits; if
no whole word fits, the first tokens of the most probable word left fill it. The classifier is the same
(`microsoft/llmlingua-2-xlm-roberta-large-meetingbank` or any local token classifier with a fast
tokenizer), read in windows of its own length.
"""

from __future__ import annotations

from functools import cached_property

import torch

from methods.compression.compressor import Compressor, kept_count
from methods.sources import unavailable, without_weights

PAPER_MODEL = "microsoft/llmlingua-2-xlm-roberta-large-meetingbank"


def select_words(costs: list[int], probs: list[float], budget: int) -> dict[int, int]:
    """word -> how many of its leading tokens to keep, `budget` in all (when the words hold that many):
    whole words by probability (ties: the earlier word) while they fit, then part of the best word left."""
    order = sorted(range(len(costs)), key=lambda w: -probs[w])
    kept: dict[int, int] = {}
    for w in order:
        if costs[w] <= budget:
            kept[w], budget = costs[w], budget - costs[w]
    for w in order:
        if budget and w not in kept:
            kept[w], budget = budget, 0
    return kept


def owners(token_spans: list[tuple[int, int]], word_spans: list[tuple[int, int]], length: int) -> list[int]:
    """The word each token belongs to: the one it overlaps most (the earlier on a tie); a token that overlaps
    none (white space) goes with the next word, or the last one at the end."""
    word_of_char = [-1] * length
    for w, (start, end) in reversed(list(enumerate(word_spans))):
        word_of_char[start:end] = [w] * (end - start)
    result = []
    for start, end in token_spans:
        inside = [w for w in word_of_char[start:end] if w >= 0]
        if inside:
            result.append(max(sorted(set(inside)), key=inside.count))
        else:
            later = [w for w, (word_start, _) in enumerate(word_spans) if word_start >= start]
            result.append(later[0] if later else len(word_spans) - 1)
    return result


class LLMLingua2(Compressor):
    """model: the token classifier, a hub id or a local folder; device: where it runs."""

    label = "llmlingua2"

    def __init__(self, rate: float = 0.5, model: str | None = PAPER_MODEL, device: str = "cpu"):
        super().__init__(rate)
        self.model, self.device = model or PAPER_MODEL, device

    def check(self) -> None:
        why = unavailable(self.model) or without_weights(self.model)
        if why:
            raise ValueError(f"compression.model={self.model!r} {why} (a token classifier)")

    def describe(self) -> dict:
        return {**super().describe(), "model": self.model}

    @cached_property
    def classifier(self):
        """(model, tokenizer) of the token classifier."""
        from transformers import AutoModelForTokenClassification, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(self.model)
        if not tokenizer.is_fast:
            raise ValueError(f"compression.model={self.model!r}: its tokenizer must be a fast one (word offsets)")
        return AutoModelForTokenClassification.from_pretrained(self.model).eval().to(self.device), tokenizer

    @torch.no_grad()
    def words(self, text: str) -> tuple[list[tuple[int, int]], list[float]]:
        """The classifier's words in `text`: their character spans and keep probabilities."""
        model, tokenizer = self.classifier
        encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, word_ids = encoding["input_ids"], encoding.word_ids()
        window = min(tokenizer.model_max_length, model.config.max_position_embeddings, 512) - 2
        first, last = tokenizer.cls_token_id, tokenizer.sep_token_id
        keep = []
        for start in range(0, len(ids), window):
            inputs = torch.tensor([[first, *ids[start:start + window], last]], device=self.device)
            keep.append(model(input_ids=inputs).logits[0, 1:-1].softmax(-1)[:, 1].cpu())
        keep = torch.cat(keep).tolist() if keep else []
        spans: dict[int, list[int]] = {}
        for (start, end), word, p in zip(encoding["offset_mapping"], word_ids, keep):
            entry = spans.setdefault(word, [start, end, 0.0, 0])
            entry[1], entry[2], entry[3] = end, entry[2] + p, entry[3] + 1
        return [(s, e) for s, e, _, _ in spans.values()], [total / n for _, _, total, n in spans.values()]

    def compress(self, text, model, tokenizer):
        encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = encoding["input_ids"]
        word_spans, probs = self.words(text)
        if not word_spans:
            return ids
        owner = owners(encoding["offset_mapping"], word_spans, len(text))
        costs = [owner.count(w) for w in range(len(word_spans))]
        kept = select_words(costs, probs, kept_count(len(ids), self.rate))
        result = []
        for token, w in zip(ids, owner):
            if kept.get(w, 0):
                result.append(token)
                kept[w] -= 1
        return result
