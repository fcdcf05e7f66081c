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

from methods.memory import LatentMemory
from methods.positions import decoder_of
from methods.tracing import StopForward, until_stopped


@contextmanager
def stored_prefix(model, states: torch.Tensor):
    """Replace positions [0, M) of every decoder layer's input with states [L, M, hidden]."""
    prefix_len = states.shape[1]

    def make_hook(layer_states):
        def hook(module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            if hidden.shape[1] < prefix_len:
                return None
            hidden = hidden.clone()
            hidden[:, :prefix_len] = layer_states.to(hidden.device, hidden.dtype)
            if args:
                return (hidden, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": hidden}
        return hook

    layers = decoder_of(model).layers
    handles = [layer.register_forward_pre_hook(make_hook(states[i]), with_kwargs=True)
               for i, layer in enumerate(layers)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@contextmanager
def eager_attention(model):
    """Switch the model to eager attention so it returns attention weights."""
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        yield
    finally:
        model.set_attn_implementation(previous)


class HiddenPrefixBackend:
    """Runs prompts with the memory injected as hidden states at every layer."""

    name = "hidden_prefix"
    keep_kv, keep_states = False, True

    def __init__(self, model):
        self.model = model

    @staticmethod
    def check(model_config) -> None:
        """Any decoder with a stack of layers: nothing to refuse before its weights load."""

    def _run(self, memory: LatentMemory, prompt_ids: torch.Tensor, **kwargs):
        states = memory.stacked("states", dim=1)                       # [L, 1+N, hidden]
        embed = decoder_of(self.model).embed_tokens
        prompt = embed(prompt_ids.view(1, -1).to(self.model.device))
        dummy = prompt.new_zeros(1, states.shape[1], prompt.shape[-1])
        inputs = torch.cat([dummy, prompt], dim=1)
        positions = torch.arange(inputs.shape[1], device=self.model.device).view(1, -1)
        with stored_prefix(self.model, states):
            return self.model(inputs_embeds=inputs, position_ids=positions, **kwargs), states.shape[1]

    @torch.no_grad()
    def prefill(self, memory: LatentMemory, prompt_ids: torch.Tensor, room: int = 64):
        """Prompt logits [p, vocab], the cache to decode with, and the next position."""
        out, prefix_len = self._run(memory, prompt_ids, past_key_values=DynamicCache(), use_cache=True)
        return out.logits[0, prefix_len:], out.past_key_values, prefix_len + len(prompt_ids)

    @torch.no_grad()
    def attention_rows(self, memory: LatentMemory, prompt_ids: torch.Tensor, layers: list[int]):
        """Head-averaged prompt rows [p, S] of `layers`, read off eager attention weights [heads, S, S]."""
        p, rows, last = len(prompt_ids), {}, max(layers)

        def make_hook(index):
            def hook(module, args, output):
                rows[index] = output[1][0, :, -p:].float().mean(dim=0)
                if index == last:
                    raise StopForward
            return hook

        attention = [decoder_of(self.model).layers[l].self_attn for l in layers]
        handles = [a.register_forward_hook(make_hook(l)) for a, l in zip(attention, layers)]
        try:
            with eager_attention(self.model):
                until_stopped(self._run, memory, prompt_ids, use_cache=False)
        finally:
            for h in handles:
                h.remove()
        return rows
