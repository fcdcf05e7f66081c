"""The reference backend: the paper's formulation taken literally.

At every decoder layer the first 1+N positions of the input are replaced by the
stored per-layer states (hooks), and the whole sequence [bos; memory; prompt]
is recomputed at positions 0..S-1. Slow on purpose; it is the yardstick the
fast backend is tested against, and its tracing reads eager attention weights.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from transformers import DynamicCache

from methods.base import Reading
from methods.memory import LatentMemory
from methods.attention.decoder import DecoderError, cache_keyword, embeddings, hooked, layers
from methods.attention.tracing import recording_attention, until_stopped


@contextmanager
def edited_layer_inputs(model, edit):
    """Every decoder layer `index` reads edit(index, a copy of its input) in place of its input
    (edit changes the copy in place; it returns False to leave the input as it is)."""
    def make_hook(index):
        def hook(module, args, kwargs):
            hidden = (args[0] if args else kwargs["hidden_states"]).clone()
            if edit(index, hidden) is False:
                return None
            return ((hidden, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": hidden})
        return hook

    with hooked(layers(model), make_hook):
        yield


def stored_prefix(model, states: torch.Tensor, reading: Reading = Reading()):
    """Replace positions [0, M) of every decoder layer's input with states [L, M, hidden], except where
    `reading` recomputes them: every position through its `recompute_through` layer, its `recompute` positions
    at every layer (layer 0's input, the embeddings, is always the stored one). The recomputed positions are a
    mask [M, 1] on the model's device, made once: a layer reads no index from the host."""
    prefix_len = states.shape[1]
    recomputed = None
    if reading.recompute is not None:
        recomputed = torch.zeros(prefix_len, 1, dtype=torch.bool, device=model.device)
        recomputed[reading.recompute.to(model.device, non_blocking=True)] = True

    def replace(index, hidden):
        if hidden.shape[1] < prefix_len or 0 < index <= reading.recompute_through:
            return False
        stored = states[index].to(hidden.device, hidden.dtype, non_blocking=True)
        if index > 0 and recomputed is not None:
            stored = torch.where(recomputed, hidden[0, :prefix_len], stored)
        hidden[0, :prefix_len] = stored

    return edited_layer_inputs(model, replace)


class HiddenPrefixBackend:
    """Runs prompts with the memory injected as hidden states at every layer."""

    name = "hidden_prefix"
    keep_kv, keep_states = False, True

    def __init__(self, model):
        self.model = model

    @staticmethod
    def check(model_config) -> None:
        """Before any weights load: a decoder whose layers pass several hidden streams per token (Gemma-3n's AltUp)
        has no one layer input per token to store (DecoderError); any other stack of layers runs."""
        streams = getattr(model_config.get_text_config(), "altup_num_inputs", None) or 1
        if streams > 1:
            raise DecoderError(f"stores one layer input per token; model type {model_config.model_type!r} passes "
                               f"{streams} hidden streams per token between its layers (altup_num_inputs={streams})")

    def forget_trace(self) -> None:
        """Nothing is kept between questions: every trace stacks the states again."""

    def _run(self, memory: LatentMemory, prompt_ids: torch.Tensor, reading: Reading = Reading(), **kwargs):
        if reading.parallel:
            raise ValueError("backend=hidden_prefix reads the fragments at contiguous positions; a parallel reading "
                             "(APE) needs backend=fast")
        if reading.recomputes and getattr(self.model.config.get_text_config(), "hidden_size_per_layer_input", None):
            raise ValueError(f"backend=hidden_prefix feeds placeholders at memory positions, and model type "
                             f"{self.model.config.model_type!r} reads per-layer embeddings of every input token: "
                             f"recomputing memory positions needs backend=fast")
        states = memory.stacked("states", dim=1)                       # [L, 1+N, hidden]
        embed = embeddings(self.model)
        prompt = embed(prompt_ids.view(1, -1).to(self.model.device, non_blocking=True))
        dummy = prompt.new_zeros(1, states.shape[1], prompt.shape[-1])
        inputs = torch.cat([dummy, prompt], dim=1)
        positions = torch.arange(inputs.shape[1], device=self.model.device).view(1, -1)
        with stored_prefix(self.model, states, reading):
            return self.model(inputs_embeds=inputs, position_ids=positions, **kwargs), states.shape[1]

    @torch.no_grad()
    def prefill(self, memory: LatentMemory, prompt_ids: torch.Tensor, room: int = 64, logits_to_keep: int = 0,
                reading: Reading = Reading()):
        """The last `logits_to_keep` (0: all p) prompt logits [., vocab], the cache to decode with, and the
        next position (the prefix's positions get no logits); `reading`'s positions recomputed."""
        cache = DynamicCache()
        out, prefix_len = self._run(memory, prompt_ids, reading, **{cache_keyword(self.model): cache}, use_cache=True,
                                    logits_to_keep=logits_to_keep or len(prompt_ids))
        return out.logits[0], cache, prefix_len + len(prompt_ids)

    @torch.no_grad()
    def attention_rows(self, memory: LatentMemory, prompt_ids: torch.Tensor, layers: list[int]):
        """Head-averaged prompt rows [p, S] of `layers`: only the prompt's queries against every key are scored
        (O(p x S) at a traced layer, never [heads, S, S]); the other layers run the model's own attention."""
        with recording_attention(self.model, layers, len(prompt_ids)) as rows:
            until_stopped(self._run, memory, prompt_ids, use_cache=False)
        return rows
