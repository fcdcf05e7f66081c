"""MemoryLLM (Wang et al., ICML 2024) as a method, native, and MemDefrag on its memory (the paper's
`tab:defrag_memoryllm_mplus`).

Writing (an injection): the model reads [bos; the newest `num_tokens` slots of the pool; the context] with
those prefix states put in place of every layer's input at positions 0.., the newest-memory embedding added
to the last `num_tokens` inputs of every layer, and the outputs of those last positions at every layer
become the new slots. Before they join, as many random slots leave the pool (the same at every layer, or
each layer its own under `drop_memory_per_layer`), so the pool keeps its size; an empty pool is first
filled with copies of the new slots. Reading: [bos; pool] is every layer's prefix at positions 0..M and
the prompt follows (the hidden_prefix backend). This is the authors' `inject_memory`, drop and generation,
checked against their code on a tiny checkpoint (tests/test_memoryllm.py).

`defragment: true` traces the prompt at `tracer_layer` (paper: 13, last token), ranks the injections by
attention density and moves each injection's slots, at every layer, densest nearest the prompt; nothing is
filtered (the pool is fixed-size).
"""

from __future__ import annotations

import copy
from contextlib import ExitStack, contextmanager

import torch

from methods.base import Method, Plan, Question
from methods.backends.hidden_prefix import edited_layer_inputs, stored_prefix
from methods.memdefrag import MemDefrag
from methods.memory import Fragment
from methods.memoryllm.checkpoint import MemoryLLMConfig, MemoryLLMForCausalLM
from methods.attention.decoder import embeddings, hooked, layers
from methods.attention.tracing import QueryMode
from methods.memoryllm.slots import SlotMemory


def added_to_last(model, vector: torch.Tensor, count: int):
    """Add `vector` [1, 1, hidden] to the last `count` positions of every decoder layer's input."""
    def add(index, hidden):
        hidden[:, -count:] += vector.to(hidden)

    return edited_layer_inputs(model, add)


@contextmanager
def last_outputs(model, count: int):
    """Record the last `count` output states of every decoder layer."""
    outputs: list[torch.Tensor] = []

    def make_hook(index):
        def hook(module, args, output):
            hidden = output[0] if isinstance(output, tuple) else output
            outputs.append(hidden[0, -count:].detach())
        return hook

    with hooked(layers(model), make_hook, before=False):
        yield outputs


@torch.no_grad()
def inject(model: MemoryLLMForCausalLM, memory: SlotMemory, ids: torch.Tensor) -> torch.Tensor:
    """The new slots [L, num_tokens, hidden] that context `ids` [T] writes, given the pool."""
    count = model.config.num_tokens
    prefix = None if memory.states is None else \
        torch.cat([t for t in (memory.sink, memory.states[:, -count:]) if t is not None], dim=1)
    embeds = embeddings(model)(ids.view(1, -1).to(model.device))
    width = 0 if prefix is None else prefix.shape[1]
    inputs = torch.cat([embeds.new_zeros(1, width, embeds.shape[-1]), embeds], dim=1)
    positions = torch.arange(inputs.shape[1], device=model.device).view(1, -1)
    with ExitStack() as stack:
        if prefix is not None:
            stack.enter_context(stored_prefix(model, prefix))
        stack.enter_context(added_to_last(model, model.new_memory_positional_emb, count))
        outputs = stack.enter_context(last_outputs(model, count))
        stack.enter_context(model.writing())
        model.get_decoder()(inputs_embeds=inputs, position_ids=positions, use_cache=False)
    if prefix is None:          # as the authors' code: with nothing to put before it, the next layer adds the
        for layer_outputs in outputs[:-1]:      # embedding in place to the states it keeps as new slots
            layer_outputs += model.new_memory_positional_emb[0].to(layer_outputs)
    return torch.stack(outputs)


class PoolWriter:
    """Stores texts in a MemoryLLM's own pool (the session's formation and forgetting for this method)."""

    capacity, layerwise, needs_self_info = None, False, False
    memory_class = SlotMemory

    def __init__(self, model: MemoryLLMForCausalLM, tokenizer, generator: torch.Generator):
        self.model, self.tokenizer, self.generator = model, tokenizer, generator
        config: MemoryLLMConfig = model.config
        sink = None if model.bos_embedding is None else model.bos_embedding.detach()
        self.memory = self.memory_class(sink=sink)
        if model.pool_ready:
            count = config.stm_slots // config.num_tokens
            blocks = torch.arange(count, device="cpu").repeat_interleave(config.num_tokens) - count
            self.memory.states = model.memory.detach()
            self.memory.origin = blocks.expand(config.num_hidden_layers, -1).clone()
            self.memory.order = list(range(-count, 0))                  # the checkpoint's blocks
        self._next_id = 0

    def next_fragment(self, memory: SlotMemory, text: str, reuse: bool = False,
                      kept: list[int] | None = None) -> Fragment:
        """The slots `text` (or the ids a compressor `kept` of it) writes; token ids: the context tokens
        whose outputs they are (-1 where a slot is an old slot's output)."""
        ids = torch.tensor(kept if kept is not None else
                           self.tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long, device="cpu")
        if len(ids) == 0:
            raise ValueError(f"fragment {text[:40]!r} is empty after tokenization")
        slots = inject(self.model, memory, ids)
        fid, self._next_id = self._next_id, self._next_id + 1
        tokens = torch.cat([torch.full((max(0, slots.shape[1] - len(ids)),), -1, device="cpu"), ids])[-slots.shape[1]:]
        return Fragment(fid, text, tokens, torch.full((len(tokens),), float("inf"), device="cpu"), states=slots)

    def admit(self, memory: SlotMemory, fragment: Fragment) -> int:
        """Drop as many random slots as join (the authors' rule), then append; returns the slots dropped."""
        config: MemoryLLMConfig = self.model.config
        size, new = config.stm_slots, fragment.states
        if memory.states is None:                               # an empty pool: copies of the first slots
            copies = [new] * (size // new.shape[1]) + ([new[:, -(size % new.shape[1]):]] if size % new.shape[1] else [])
            memory.append(fragment.fid, torch.cat(copies, dim=1)[:, -size:])
            return 0
        total = memory.n_tokens
        dropped = int(total * (1 / config.num_blocks)) if new.shape[1] == config.num_tokens else new.shape[1]
        draws = config.num_hidden_layers if config.drop_memory_per_layer else 1
        kept = torch.stack([torch.randperm(total, generator=self.generator)[: total - dropped].sort().values
                            for _ in range(draws)])
        memory.keep(kept if config.drop_memory_per_layer else kept[0])
        memory.append(fragment.fid, new)
        return dropped


class MemoryLLM(Method):
    """defragment: reorder the pool's injections by attention density before every question;
    tracer_layer, query_mode: where and how to trace (paper: 13, last); seed: the random drops'."""

    backends = ("hidden_prefix",)
    keeps_own_memory = True
    model_type = MemoryLLMConfig.model_type
    long_term = False           # M+'s: a checkpoint with a long-term memory (num_ltm_blocks)
    kind, other_kind = "memoryllm", ("mplus", "M+")        # the method's name; the other's, for a wrong checkpoint

    def __init__(self, defragment: bool = False, tracer_layer: int | None = 13, query_mode: QueryMode | None = "last",
                 seed: int = 0):
        self.defragment, self.seed = defragment, seed
        self.tracer = MemDefrag("all", tracer_layer, query_mode)
        self.generator = torch.Generator().manual_seed(seed)

    def for_group(self, index: int) -> "MemoryLLM":
        fresh = copy.copy(self)
        fresh.generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        return fresh

    def check(self, num_layers: int) -> None:
        if self.defragment:
            self.tracer.check(num_layers)

    def check_model(self, model_config) -> None:
        name, (other, other_title) = self.kind, self.other_kind
        found, blocks = getattr(model_config, "model_type", None), getattr(model_config, "num_ltm_blocks", 0)
        if found != self.model_type:
            raise ValueError(f"method {name} needs a checkpoint of model_type {self.model_type!r}, got {found!r}: "
                             f"use model={name}_8b or model=hf model.source=<a folder of one>")
        if bool(blocks) != self.long_term:
            raise ValueError(f"method {name}: this checkpoint is {other_title} (num_ltm_blocks={blocks}); "
                             f"use method={other}")

    def writer(self, model, tokenizer) -> PoolWriter:
        return PoolWriter(model, tokenizer, self.generator)

    def plan(self, memory, prompt_ids, backend, question=Question()) -> Plan:
        return self.tracer.plan(memory, prompt_ids, backend) if self.defragment else Plan(latent=memory)
