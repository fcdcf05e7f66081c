"""Text memory (plain tokens before the prompt) served from a cache of its own keys and values.

Plain-token memory has no positional distortion, but a naive run pushes the whole text
through the model for every question and every trace. Causality makes the keys and
values of a token depend only on the tokens before it, so the cache of the last text
held stays valid up to its longest common prefix with the next one: a memory that
grows by appending (the distortion study) or that keeps a shared head (the probe's
target moving right) only runs the tokens after that prefix. The prompt (and any
decoding) writes past the held text in the cache buffers and is forgotten at the next hold.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache

from methods.backends.kv_prefix import PrefixLayer, common_prefix, rows_after, run_after


class TextPrefix:
    def __init__(self, model):
        self.model = model
        self.layers = [PrefixLayer() for _ in range(model.config.get_text_config().num_hidden_layers)]
        self.ids = torch.empty(0, dtype=torch.long, device="cpu")

    def forget(self) -> None:
        """Hold nothing: the next text is run in full (its buffers are kept)."""
        self.ids = torch.empty(0, dtype=torch.long, device="cpu")

    @torch.no_grad()
    def hold(self, ids: torch.Tensor) -> Cache:
        """A cache holding exactly `ids` [N] at positions 0..N-1, running only the tokens after
        the longest common prefix with the ids held before."""
        shared = common_prefix(self.ids, ids)
        for layer in self.layers:
            layer.fill_to(shared)
        if shared < len(ids):
            run_after(self.model, Cache(layers=self.layers), ids[shared:], shared, logits_to_keep=1)
        self.ids = ids.clone()
        return Cache(layers=self.layers)

    @torch.no_grad()
    def attention_rows(self, text_ids: torch.Tensor, prompt_ids: torch.Tensor, layers: list[int]):
        """Head-averaged prompt rows [p, N+p] of `layers` over the text `text_ids` [N]."""
        return rows_after(self.model, self.hold(text_ids), prompt_ids, len(text_ids), layers)

    @torch.no_grad()
    def prefill(self, text_ids: torch.Tensor, prompt_ids: torch.Tensor):
        """Logits of the prompt's last token [1, vocab], the cache to decode with, the next position."""
        cache = self.hold(text_ids)
        out = run_after(self.model, cache, prompt_ids, len(text_ids), logits_to_keep=1)
        return out.logits[0], cache, len(text_ids) + len(prompt_ids)
