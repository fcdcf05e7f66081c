"""The fast backend: stored keys/values as a per-layer prefix, positions given at query time.

Mathematically the paper's hidden-prefix formulation: at layer l the prompt
only ever sees the memory through the keys and values that layer computes from
the stored states, and those do not depend on anything after them. So the
prefix is never pushed through the network again: its position-free keys are
rotated to the contiguous positions of the current order and only the prompt runs.
"""

from __future__ import annotations

import weakref

import torch
from transformers import MODEL_FOR_CAUSAL_LM_MAPPING
from transformers.cache_utils import Cache, DynamicLayer

from methods.base import Reading
from methods.memory import Fragment, LatentMemory, parts
from methods.attention import decoder
from methods.attention.grouped import in_chunks
from methods.attention.positions import (Rotary, RotaryError, has_rotary_function, length_dependent_rotary,
                                        no_rotary_function)
from methods.attention.recompute import recompute, recompute_through
from methods.attention.tracing import recording_attention, until_stopped
from methods.window import rope_type


class PrefixLayer(DynamicLayer):
    """A cache layer preloaded with the memory (or empty, shaped by what it first receives) and with room
    to grow in place.

    buffer: [1, kv_heads, capacity, head_dim]; keys/values are views of the filled part.
    """

    def __init__(self, keys: torch.Tensor | None = None, values: torch.Tensor | None = None, filled: int = 0):
        super().__init__()
        self._k = self._v = None
        if keys is not None:
            self._hold(keys, values, filled)

    def _hold(self, keys: torch.Tensor, values: torch.Tensor, filled: int) -> None:
        self._k, self._v, self.filled = keys, values, filled
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
        self._expose()

    def _expose(self):
        self.keys, self.values = self._k[:, :, : self.filled], self._v[:, :, : self.filled]

    def update(self, key_states, value_states, *args, **kwargs):
        if self._k is None:
            self._hold(key_states[:, :, :0], value_states[:, :, :0], 0)
        end = self.filled + key_states.shape[-2]
        if end > self._k.shape[2]:
            grow = max(end - self._k.shape[2], self._k.shape[2] // 2)
            self._k = torch.cat([self._k, self._k.new_empty(*self._k.shape[:2], grow, self._k.shape[3])], dim=2)
            self._v = torch.cat([self._v, self._v.new_empty(*self._v.shape[:2], grow, self._v.shape[3])], dim=2)
        self._k[:, :, self.filled:end] = key_states
        self._v[:, :, self.filled:end] = value_states
        self.filled = end
        self._expose()
        return self.keys, self.values

    def fill_to(self, length: int) -> None:
        """Expose the first `length` positions of the buffers; what was written after them is overwritten
        later."""
        self.filled = length
        if self._k is not None:
            self._expose()

    def move(self, start: int, positions: torch.Tensor) -> None:
        """Write the entries at start..start+len(positions)-1 over those at `positions` (recomputed ones over
        the placed)."""
        end = start + len(positions)
        self._k[:, :, positions] = self._k[:, :, start:end].clone()
        self._v[:, :, positions] = self._v[:, :, start:end].clone()


class Placed:
    """The memory's keys (rotated to their positions) and values for the first `n_layers` layers, in
    buffers that outlive a cache built on them: a later cache of a memory whose leading fragments are the
    same objects (fragments are never changed in place) keeps their placed keys and places only the
    rest. A trace's cache is dropped when its rows are read, so the trace keeps one of these between
    questions; a cache that is decoded with gets buffers of its own.

    What a forward on the cache writes after the memory (a trace's prompt) also stays in the buffers:
    `held` says how many of those positions a cache of the unchanged memory may keep. Buffers are allocated
    with `spare` times the room asked after the memory: the trace's live until the next store
    (KVPrefixBackend.forget_trace), and questions between two stores differ in their prompts' lengths alone. There
    is one buffer per group of layers that share a shape (one for most models; Gemma-4's wider global layers have
    their own)."""

    def __init__(self, model, n_layers: int, spare: int = 1):
        self.model, self.n_layers, self.spare = model, n_layers, spare
        self.fragments: list = []                   # sink and fragments placed in the buffers, in order, held
                                                    # weakly: an evicted fragment's storage goes with its eviction
        self.parallel = False                       # whether they were placed in parallel
        self.rotary = Rotary.of(model)
        self.groups = [[i for i in g if i < n_layers] for g in self.rotary.groups]   # layers of each buffer
        self.rows = sorted((layer, g, row) for g, layers in enumerate(self.groups)       # (layer, its buffer,
                           for row, layer in enumerate(layers))                           # its row), by layer
        self.keys = self.values = None              # per group: [its layers, kv_heads, capacity, head_dim]

    def cache(self, memory: LatentMemory, room: int, held: int = 0, parallel: bool = False) -> Cache:
        """A cache of the memory with `room` positions after it; its first `held` of them are kept from
        the last forward on these buffers when the memory is the one placed then (0 otherwise: see
        `unchanged`). parallel: every fragment at the positions after the sink (APE), not one after another."""
        frags = [memory.sink, *memory.fragments]
        total = sum(len(f) for f in frags)
        grows = self.keys is None or self.keys[0].shape[2] < total + room
        kept = 0
        while not grows and parallel == self.parallel and kept < min(len(frags), len(self.fragments)) and \
                frags[kept] is self.fragments[kept]():
            kept += 1
        self.unchanged = kept == len(frags) == len(self.fragments)
        held = held if self.unchanged else 0
        start = sum(len(f) for f in frags[:kept])
        if grows:
            self._allocate(frags[0], total + room * self.spare)
        tables = self.rotary.tables(total, self.keys[0]) if kept < len(frags) else None
        for f in frags[kept:]:
            end = start + len(f)
            position = min(start, len(frags[0])) if parallel else start
            for slot, (buffers, stored) in enumerate(((self.keys, f.keys), (self.values, f.values))):
                for layers, buffer, part in zip(self.groups, buffers, parts(stored)):
                    if layers:
                        self.rotary.place(buffer[:, :, start:end], part[: len(layers)].to(buffer.device, non_blocking=True), slot,
                                          tables, position, layers)
            start = end
        self.fragments, self.parallel = [weakref.ref(f) for f in frags], parallel
        return Cache(layers=[PrefixLayer(self.keys[g][row:row + 1], self.values[g][row:row + 1], total + held)
                             for _, g, row in self.rows])

    def _allocate(self, like: Fragment, size: int) -> None:
        """Buffers of `size` positions (keys and values may differ in heads and width: multi-head latent attention
        caches a latent and a rotated part), the old ones dropped first: every fragment is placed again rather
        than copied over, so that the trace's buffers are never held twice (at N_max on the 8B shape, 0.74 GB:
        docs/gpu.md, Peak memory)."""
        self.keys = self.values = None
        size = in_chunks(size, self.model.device)           # a decoding step splits them without a copy
        self.keys, self.values = [[t.new_empty(len(layers), t.shape[1], size, t.shape[3], device=self.model.device)
                                   for layers, t in zip(self.groups, parts(stored))]
                                  for stored in (like.keys, like.values)]


class KVPrefixBackend:
    """Runs prompts against a memory given as rotated keys/values."""

    name = "fast"
    keep_kv, keep_states = True, False

    def __init__(self, model):
        self.model = model
        self.forget_trace()                    # no trace yet
        self.checked: tuple | None = None      # CacheBlend's check: (sink and fragments, layer, recomputed cache)

    def forget_trace(self) -> None:
        """Before a fragment is formed: the last trace's placed memory and rows go (0.74 GB on the 8B shape at
        N_max, docs/gpu.md), so that they never sit beside a formation's forward. The next trace places the whole
        memory again: after an update that evicts (every fragment is cut then) it had to anyway; after one that
        evicts nothing it placed only the new fragment. Questions asked between two stores share one placement."""
        self.traced: Placed | None = None     # the last trace's placed memory, kept for the next question
        self.last_prompt = torch.empty(0, dtype=torch.long, device="cpu")  # and its prompt, whose keys/values follow it,
        self.last_rows: dict[int, torch.Tensor] = {}            # and rows

    @staticmethod
    def check(model_config) -> None:
        """Before any weights load: what the store and the re-placing cannot hold (RotaryError): positions
        applied other than by a rotary function, rotary frequencies that change with a forward's length, layers
        reading another layer's keys and values."""
        kind = model_config.model_type
        model_class = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(model_config), None)
        if model_class is not None and not has_rotary_function(model_class):
            raise RotaryError(no_rotary_function(model_config, model_class.__module__))
        varying = length_dependent_rotary(model_config)
        if varying is not None:
            switch = varying.get("original_max_position_embeddings",
                                 model_config.get_text_config().max_position_embeddings)
            raise RotaryError(f"places stored keys by one rotary table; model type {kind!r} uses rope_type "
                              f"{rope_type(varying)!r}, whose frequencies transformers "
                              f"chooses per forward by its longest position (switching past {switch}), so a memory "
                              f"placed for one read and a prompt read after it could rotate differently")
        shared = decoder.shared_layers(model_config)
        if shared:
            raise RotaryError(f"stores each layer's own keys and values; model type {kind!r} shares them across "
                              f"layers (layers {shared} read another layer's)")

    def cache(self, memory: LatentMemory, room: int, layers: int | None = None, parallel: bool = False) -> Cache:
        """A cache holding the memory of `layers` first layers at positions 0..N (or in parallel), with `room`
        to grow."""
        return Placed(self.model, layers or decoder.num_layers(self.model.config)).cache(memory, room,
                                                                                        parallel=parallel)

    @torch.no_grad()
    def prefill(self, memory: LatentMemory, prompt_ids: torch.Tensor, room: int = 64, logits_to_keep: int = 0,
                reading: Reading = Reading()):
        """The last `logits_to_keep` (0: all p) prompt logits [., vocab], the cache to decode with, and the
        next position; the memory read as `reading` says (recomputed positions, parallel positions)."""
        room += len(prompt_ids) + (0 if reading.recompute is None else len(reading.recompute))
        if reading.recompute_through >= 0:
            cache = self._checked(memory, reading.recompute_through, room)
        else:
            cache = self.cache(memory, room=room, parallel=reading.parallel)
        if reading.recompute is not None:
            recompute(self.model, cache, memory.text_ids(), reading.recompute)
        longest = max((len(f) for f in memory.fragments), default=0)
        start = memory.sink_length + (longest if reading.parallel else memory.n_tokens)
        out = run_after(self.model, cache, prompt_ids, start, logits_to_keep=logits_to_keep)
        return out.logits[0], cache, start + len(prompt_ids)

    @torch.no_grad()
    def deviations(self, memory: LatentMemory, layer: int, room: int = 256) -> torch.Tensor:
        """CacheBlend's check: every memory position recomputed through `layer`; per position after the sink, the
        squared distance of its recomputed values at `layer` from the stored ones (summed over heads and width). The
        recomputed cache (`room` positions to grow: the tokens recomputed next, the prompt, the answer) is kept
        for a prefill of the same memory that recomputes through `layer`."""
        cache = self.cache(memory, room=room)
        stored = cache.layers[layer].values.clone()
        recompute_through(self.model, cache, memory.text_ids(), layer, memory.sink_length)
        self.checked = ([memory.sink, *memory.fragments], layer, cache)
        return ((cache.layers[layer].values - stored).float() ** 2).sum(dim=(0, 1, 3))[memory.sink_length:].cpu()

    def _checked(self, memory: LatentMemory, layer: int, room: int) -> Cache:
        """The cache `deviations` recomputed through `layer` for this memory (used once), or, for another
        memory, one recomputed now with `room` positions to grow."""
        frags, checked, self.checked = [memory.sink, *memory.fragments], self.checked, None
        if checked is None or checked[1] != layer or len(checked[0]) != len(frags) or \
                any(a is not b for a, b in zip(checked[0], frags)):
            self.deviations(memory, layer, room)
            checked, self.checked = self.checked, None
        return checked[2]

    @torch.no_grad()
    def attention_rows(self, memory: LatentMemory, prompt_ids: torch.Tensor, layers: list[int]):
        """Head-averaged prompt rows [p, 1+N+p] of `layers`; stops after the last of them.

        Over the memory of the last trace, the leading prompt tokens the last prompt had too (a chat
        template's system turn) keep their keys, values and rows: only the tokens after them run."""
        upto = max(layers) + 1
        if self.traced is None or self.traced.n_layers != upto:
            self.traced, self.last_rows = Placed(self.model, upto, spare=2), {}
        shared = 0
        if all(layer in self.last_rows for layer in layers):
            shared = min(common_prefix(self.last_prompt, prompt_ids), len(prompt_ids) - 1)
        cache = self.traced.cache(memory, room=len(prompt_ids), held=shared)
        shared = shared if self.traced.unchanged else 0
        start = memory.prefix_length
        rows = rows_after(self.model, cache, prompt_ids[shared:], start + shared, layers)
        if shared:
            width = start + len(prompt_ids)
            rows = {layer: torch.cat([pad(self.last_rows[layer][:shared, : start + shared], width), rows[layer]])
                    for layer in layers}
        self.last_prompt, self.last_rows = prompt_ids.clone(), rows
        return rows


def common_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many leading ids `a` and `b` share."""
    n = min(len(a), len(b))
    differs = (a[:n] != b[:n]).nonzero()
    return int(differs[0]) if len(differs) else n


def pad(rows: torch.Tensor, width: int) -> torch.Tensor:
    """Rows [q, w] widened to `width` columns with zeros: the attention of earlier rows to later keys."""
    return torch.nn.functional.pad(rows, (0, width - rows.shape[1]))


def run_after(model, cache: Cache, ids: torch.Tensor, start: int, **kwargs):
    """Run `ids` [T] at positions start..start+T-1, after the `start` positions `cache` holds."""
    positions = torch.arange(start, start + len(ids), device=model.device).view(1, -1)
    return model(input_ids=ids.view(1, -1).to(model.device, non_blocking=True), **{decoder.cache_keyword(model): cache},
                 position_ids=positions, use_cache=True, **kwargs)


def rows_after(model, cache: Cache, prompt_ids: torch.Tensor, start: int, layers: list[int]):
    """Head-averaged prompt rows [p, start+p] of `layers` from the prompt run after `cache`;
    the forward stops after the last of them."""
    with recording_attention(model, layers, len(prompt_ids)) as rows:
        until_stopped(run_after, model, cache, prompt_ids, start)
    return rows
