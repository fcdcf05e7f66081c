"""M+ (Wang et al., 2025) as a method, native: MemoryLLM with a long-term memory and a retriever, and MemDefrag on
its memory.

Writing is MemoryLLM's injection; then every layer drops its own `num_tokens` random slots of the pool (the
short-term memory). The dropped slots, with their retrieval keys (the layer's key projection of their normed
state) and ages, wait in a cache that joins the long-term memory every `update_ltm_frequency` injections:
then every entry's recall frequency falls by `decay_frequency` (a new one starts at
`initial_rf_when_moving_stm_to_ltm`) and entries at zero leave, as long as more than the retrieved number stay.
Reading: at every layer the prompt's input (normed, through the query projection) scores every long-term and
cached entry (the mean over the prompt of sigmoid(query . key)); the best `num_ltm_blocks x num_tokens` are
retrieved, oldest first, and the layer reads [bos; retrieved; pool; prompt]. A question's retrieval is the
method's plan (one forward over the prompt); the answer then reads what it retrieved. Equal ages keep their
order (a stable sort; the authors' numpy default sort leaves it to the kernel). Checked against the authors'
code on a tiny checkpoint (tests/test_memoryllm.py).

`defragment: true` ranks the pool's injections as MemoryLLM's are ranked; the retrieved long-term slots stay
first, unmoved (they are chosen per question and per layer).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from methods.base import Plan, Question
from methods.generation import clock
from methods.backends.hidden_prefix import edited_layer_inputs
from methods.memoryllm.memoryllm import MemoryLLM, PoolWriter
from methods.attention.decoder import embeddings, layers
from methods.memoryllm.slots import LEAD, SlotMemory
from methods.attention.tracing import StopForward, until_stopped


@dataclass
class LongTerm:
    """One layer's long-term entries (or the cache of dropped slots waiting to join them): states [N, hidden],
    retrieval keys [N, selector], recall frequencies and ages [N]."""

    states: torch.Tensor
    keys: torch.Tensor
    frequencies: np.ndarray
    ages: np.ndarray

    def joined(self, other: "LongTerm") -> "LongTerm":
        return LongTerm(torch.cat([self.states, other.states]), torch.cat([self.keys, other.keys]),
                        np.concatenate([self.frequencies, other.frequencies]), np.concatenate([self.ages, other.ages]))

    def taken(self, index: np.ndarray) -> "LongTerm":
        rows = torch.from_numpy(index)
        return LongTerm(self.states[rows], self.keys[rows], self.frequencies[index], self.ages[index])


@dataclass
class MPlusMemory(SlotMemory):
    """The pool (short-term memory) with its slots' ages [L, M] (a new slot's: its distance from its
    injection's end), each layer's long-term memory, the cache of dropped slots per layer (None when empty)
    and the slots written since the cache last joined."""

    ages: np.ndarray | None = None
    long_term: list[LongTerm] = field(default_factory=list)
    cached: list[LongTerm] | None = None
    since_merge: int = 0

    def taken(self, positions: torch.Tensor) -> dict:
        return {**super().taken(positions), "ages": np.take_along_axis(self.ages, positions.cpu().numpy(), 1)}

    def append(self, fid: int, states: torch.Tensor) -> None:
        super().append(fid, states)
        self.ages = np.concatenate([self.ages, np.tile(np.arange(states.shape[1])[::-1], (len(states), 1))], axis=1)


def host(values: torch.Tensor) -> np.ndarray:
    """A checkpoint's per-entry numbers (recall frequencies, ages) as float64 on the host, wherever the model is:
    the bookkeeping is numpy's, as the authors' code keeps it."""
    return values.detach().to("cpu", torch.float64).numpy()


class MPlusWriter(PoolWriter):
    """Stores texts in an M+ checkpoint's pool, long-term memory and cache, as the authors' code does."""

    memory_class = MPlusMemory

    def __init__(self, model, tokenizer, generator: torch.Generator):
        super().__init__(model, tokenizer, generator)
        self.memory.ages = np.zeros(tuple(self.memory.states.shape[:2]))
        self.memory.long_term = [
            LongTerm(states.detach(), keys.detach(), host(frequencies), host(ages.detach().int()))
            for states, keys, frequencies, ages in zip(model.ltm, model.ltm_keys, model.ltm_recall_frequencies,
                                                       model.ltm_ages)]

    @torch.no_grad()
    def admit(self, memory: MPlusMemory, fragment) -> int:
        config, blocks = self.model.config, layers(self.model)
        new, total = fragment.states, memory.n_tokens
        count = new.shape[1]
        draws = [torch.randperm(total, generator=self.generator) for _ in blocks]
        kept = torch.stack([d[: total - count].sort().values for d in draws])
        dropped = torch.stack([d[total - count:].sort().values for d in draws])
        leaving = memory.taken(dropped)
        states, ages = leaving["states"], leaving["ages"]
        memory.keep(kept)
        memory.append(fragment.fid, new)
        for entry in memory.long_term + (memory.cached or []):
            entry.ages = entry.ages + config.num_tokens
        gone = [LongTerm(states[i], layer.self_attn.key_proj(layer.input_layernorm(states[i])),
                         np.full(count, float(config.initial_rf_when_moving_stm_to_ltm)), ages[i])
                for i, layer in enumerate(blocks)]
        memory.cached = gone if memory.cached is None else [c.joined(g) for c, g in zip(memory.cached, gone)]
        memory.since_merge += config.num_tokens
        if memory.since_merge >= config.update_ltm_frequency * config.num_tokens:
            memory.long_term = [self.merged(entry, cached) for entry, cached in zip(memory.long_term, memory.cached)]
            memory.cached, memory.since_merge = None, 0
        return count

    def merged(self, long_term: LongTerm, cached: LongTerm) -> LongTerm:
        """The cache joined: frequencies decay, entries at zero leave if more than a retrieval's worth stay."""
        config = self.model.config
        joined = long_term.joined(cached)
        joined.frequencies = joined.frequencies - config.decay_frequency
        alive = np.where(joined.frequencies > 0.01)[0]
        if len(alive) > config.num_ltm_blocks * config.num_tokens:
            return joined.taken(alive)
        joined.frequencies = joined.frequencies + config.decay_frequency
        return joined


def retrieved(layer, long_term: LongTerm, cached: LongTerm | None, prompt: torch.Tensor, count: int) -> torch.Tensor:
    """The `count` entries [count, hidden] one layer retrieves for the prompt's input [T, hidden], oldest first.
    Entries are numbered long-term first, then cached; only the chosen states are copied. Scores are taken in
    fp32 (the top-k does not depend on the device's half-precision rounding); the choice stays on the prompt's
    device, the entries' ages joining it without the host waiting, so a layer makes no host sync."""
    parts = [long_term] if cached is None else [long_term, cached]
    device = prompt.device
    if len(long_term.keys) < count:             # too few long-term entries: all of them, cyclically
        index = torch.arange(len(long_term.keys), device=device).repeat(-(-count // len(long_term.keys)))[-count:]
    else:
        queries = layer.self_attn.query_proj(layer.input_layernorm(prompt)).float()
        keys = torch.cat([part.keys for part in parts]).to(device, torch.float32)
        index = torch.topk((queries @ keys.T).sigmoid().mean(dim=0), k=count).indices.sort().values
    ages = torch.from_numpy(np.concatenate([part.ages for part in parts])).to(device, non_blocking=True)[index]
    index = index[torch.argsort(ages, stable=True).flip(0)]     # numpy's stable argsort, reversed: oldest first
    first = len(long_term.states)
    chosen = long_term.states[index.clamp(max=first - 1)]
    if cached is not None:
        chosen = torch.where((index < first)[:, None], chosen, cached.states[(index - first).clamp(min=0)].to(chosen))
    return chosen


@torch.no_grad()
def retrieval_view(model, memory: MPlusMemory, prompt_ids: torch.Tensor) -> SlotMemory:
    """The memory every layer reads for this prompt: its retrieved long-term slots (leading, no fragment's),
    then the pool."""
    config, decoder, blocks = model.config, model.get_decoder(), layers(model)
    count = config.num_ltm_blocks * config.num_tokens
    width = (memory.sink.shape[1] if memory.sink is not None else 0) + count + memory.n_tokens
    chosen: list[torch.Tensor] = []

    def retrieve(index, hidden):
        cached = None if memory.cached is None else memory.cached[index]
        chosen.append(retrieved(blocks[index], memory.long_term[index], cached, hidden[0, width:], count))
        sink = [] if memory.sink is None else [memory.sink[index]]
        hidden[:, :width] = torch.cat([*sink, chosen[-1], memory.states[index]]).to(hidden)
        if index == len(blocks) - 1:
            raise StopForward                   # the last layer's retrieval is all that is left to know

    embeds = embeddings(model)(prompt_ids.view(1, -1).to(model.device, non_blocking=True))
    inputs = torch.cat([embeds.new_zeros(1, width, embeds.shape[-1]), embeds], dim=1)
    positions = torch.arange(inputs.shape[1], device=model.device).view(1, -1)
    with edited_layer_inputs(model, retrieve):
        until_stopped(decoder, inputs_embeds=inputs, position_ids=positions, use_cache=False)
    lead = torch.full((len(chosen), count), LEAD, dtype=torch.long, device="cpu")
    return SlotMemory(memory.sink, torch.cat([torch.stack(chosen).to(memory.states), memory.states], dim=1),
                      torch.cat([lead, memory.origin], dim=1), list(memory.order))


class MPlus(MemoryLLM):
    """An M+ checkpoint's memory; options as MemoryLLM's."""

    long_term = True
    kind, other_kind = "mplus", ("memoryllm", "MemoryLLM")

    def writer(self, model, tokenizer) -> MPlusWriter:
        return MPlusWriter(model, tokenizer, self.generator)

    def check_model(self, model_config) -> None:
        super().check_model(model_config)
        if getattr(model_config, "update_ltm_mode", "immediate") != "immediate":
            raise ValueError(f"method mplus reads update_ltm_mode 'immediate' (the released M+), got "
                             f"{model_config.update_ltm_mode!r}")
        if getattr(model_config, "ltm_initial_size", 0) < 1:
            raise ValueError("method mplus: this checkpoint has an empty long-term memory (ltm_initial_size 0); "
                             "M+ retrieves from one at every question")

    def plan(self, memory, prompt_ids, backend, question=Question()) -> Plan:
        start = clock(backend.model.device)
        view = retrieval_view(backend.model, memory, prompt_ids)
        seconds = {"retrieve": clock(backend.model.device) - start}
        plan = super().plan(view, prompt_ids, backend)
        plan.seconds = {**seconds, **plan.seconds}
        return plan
