"""Greedy decoding from a prefilled cache, shared by every backend and method: step by step on the cache as the
prefill left it (`eager`), or on fixed tensors over a cache of fixed size, replayed as one CUDA graph per token on a
GPU (`captured`: a decoding step is ~1,450 small kernels on an 8B model, whose launches, not the weights' reads,
bound an eager step), or the same with the step compiled by torch.compile first (`compiled`: inductor fuses the
step's small elementwise kernels, which a graph still runs one after another)."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import itertools
import time
import weakref
from enum import StrEnum

import torch
from transformers.cache_utils import Cache, StaticLayer

from methods.attention.decoder import cache_keyword
from methods.attention.grouped import in_chunks
from methods.attention.tracing import baked

Decode = StrEnum("Decode", ["eager", "captured", "compiled"])


def default_decode(device: torch.device) -> str:
    """captured on a GPU; eager elsewhere (a CPU launches no kernels to save, and the fixed-size cache's masked
    tail costs it work)."""
    return "captured" if device.type == "cuda" else "eager"


def clock(device: torch.device) -> float:
    """perf_counter once the device has finished its queued work (a GPU runs ahead of Python)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def stop_ids(model, tokenizer) -> set[int]:
    """Every id that ends a turn: the tokenizer's eos and the generation config's."""
    ids = {tokenizer.eos_token_id}
    configured = getattr(model.generation_config, "eos_token_id", None)
    ids.update(configured if isinstance(configured, (list, tuple)) else [configured])
    return {int(i) for i in ids if i is not None}


CHECK_EVERY = 8          # on a GPU, tokens decoded between two looks for a stop id


class Look:
    """Whether a stop id was decoded, asked of the device without waiting for it: the device's answer is copied
    to the host asynchronously and read once a CUDA event says it has landed (at once elsewhere)."""

    def __init__(self, found: torch.Tensor):
        self.answer = found.to("cpu", non_blocking=True)
        self.landed = None
        if found.device.type == "cuda":
            self.landed = torch.cuda.Event()
            self.landed.record()

    def ready(self) -> bool:
        return self.landed is None or self.landed.query()


class ReadLayer(StaticLayer):
    """transformers' StaticLayer over a read's own buffers: keys/values [1, kv_heads, capacity, head_dim], the
    first `filled` positions the read (memory view and prompt), the rest zeroed (masked, yet a value read under a
    zero weight must not be NaN), written in place at `cumulative_length` (a device tensor) by each step."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, filled: int):
        super().__init__(keys.shape[2])
        keys[:, :, filled:].zero_()
        values[:, :, filled:].zero_()
        self.keys, self.values, self.device, self.dtype = keys, values, keys.device, keys.dtype
        self.batch_size, self.num_heads, _, self.k_head_dim = keys.shape
        self.v_head_dim = values.shape[-1]
        self.cumulative_length = torch.tensor(filled, device=keys.device)
        self.is_initialized = True


def fixed(cache: Cache, budget: int) -> Cache:
    """The cache as one of fixed size with room for `budget` more positions: each layer's own buffers where they
    have that room, in whole chunks where a step's attention splits them (methods/attention/grouped.py; the fast
    backend sizes them so for the read: memory view + prompt + answer budget), else new ones the filled part is
    copied into (hidden_prefix's and text memory's grown caches: `grown`)."""
    own = []
    for layer in cache.layers:
        keys, values = getattr(layer, "_k", None), getattr(layer, "_v", None)     # PrefixLayer's buffers
        filled, device = layer.keys.shape[2], layer.keys.device
        fits = keys is not None and keys.shape[2] >= filled + budget and keys.shape[2] == in_chunks(keys.shape[2],
                                                                                                   device)
        own.append((keys, values) if fits else None)
    needed = [layer for layer, buffers in zip(cache.layers, own) if buffers is None]
    fresh = zip(grown([layer.keys for layer in needed], budget), grown([layer.values for layer in needed], budget))
    return Cache(layers=[ReadLayer(*(buffers or next(fresh)), layer.keys.shape[2])
                         for layer, buffers in zip(cache.layers, own)])


def grown(filled: list[torch.Tensor], budget: int) -> list[torch.Tensor]:
    """Buffers [batch, heads, positions, width] with room for `budget` more positions (in whole chunks) after
    each of `filled`, which is copied in: one buffer per shape for all the layers of that shape, laid out as the
    fast backend's (Placed: so a compiled step compiles once), not one per layer, so that a later read of the same
    shapes is handed the same addresses by the allocator more often (and its captured graph replays: `Kept`)."""
    def shape(t):
        return t.device, t.dtype, *t.shape[:2], in_chunks(t.shape[2] + budget, t.device), t.shape[3]

    alike = collections.defaultdict(list)
    for i, t in enumerate(filled):
        alike[shape(t)].append(i)
    made = [None] * len(filled)
    for (device, dtype, rows, *dims), indices in alike.items():
        whole = torch.empty(len(indices) * rows, *dims, dtype=dtype, device=device)
        for buffer, i in zip(whole.split(rows), indices):
            buffer[:, :, :filled[i].shape[2]].copy_(filled[i])
            made[i] = buffer
    return made


class EagerStep:
    """Today's step: the model on the last id at the next position, the cache growing by one."""

    def __init__(self, model, cache, position: int, max_new_tokens: int):
        self.model, self.cache, self.keyword = model, cache, cache_keyword(model)
        self.positions = torch.arange(position, position + max_new_tokens, device=model.device).view(1, -1)
        self.done = 0

    def __call__(self, last: torch.Tensor) -> torch.Tensor:
        self.done += 1
        return next_id(self.model, self.keyword, last, self.cache, self.positions[:, self.done - 1:self.done])


def next_id(model, keyword: str, ids: torch.Tensor, cache: Cache, position: torch.Tensor) -> torch.Tensor:
    """One step's greedy id [1, 1] on the device, the cache written in place (grown, for the eager step's)."""
    logits = model(input_ids=ids, **{keyword: cache}, position_ids=position, use_cache=True).logits
    return logits[0, -1].argmax().view(1, 1)


# Free device memory under which a capture first empties the allocator's cache (a decoding step's own
# allocations, which its graph's pool holds, are a few MB on the 8B shape: its logits and attention scores).
CAPTURE_HEADROOM = 1 << 30


@functools.cache
def capture_stream(device: torch.device) -> torch.cuda.Stream:
    """The device's one stream for warm-ups and captures: a capture cannot be made on the default stream, and
    cuBLAS keeps a workspace per stream, which the warm-up makes before the capture (a new stream at every capture
    would make one inside each graph's pool)."""
    return torch.cuda.Stream(device)


@contextlib.contextmanager
def side_stream(device: torch.device):
    """Work queued on the device's capture stream, after what the current stream holds and before what it
    queues next."""
    current = torch.cuda.current_stream(device)
    side = capture_stream(device)
    side.wait_stream(current)
    with torch.cuda.stream(side):
        yield
    current.wait_stream(side)


def make_room_to_capture(device: torch.device) -> None:
    """Empty the allocator's cache only where the device has less than CAPTURE_HEADROOM free. torch.cuda.graph
    empties it before every capture (and waits for the device): a question's capture would then hand back what its
    trace and prefill left cached, and the next question's allocations would ask the driver for it again."""
    if torch.cuda.mem_get_info(device)[0] < CAPTURE_HEADROOM:
        torch.cuda.empty_cache()


@dataclasses.dataclass
class Kept:
    """A captured step kept for a later read laid out as its own (`layout`): that read replays it with no warm-up,
    capture or instantiation (37-50 ms an answer on the 8B shape, spread over its tokens). The graph reads the
    read's keys and values where they lie, and the lengths, ids and position where it was captured (these go with
    it); what changes from read to read as from token to token is in those tensors, and what the attention's wraps
    fix is in the layout (tracing.baked)."""
    layout: tuple
    graph: torch.cuda.CUDAGraph
    ids: torch.Tensor
    position: torch.Tensor
    lengths: list[torch.Tensor]
    next: torch.Tensor


# graphs kept per model, the last captured: the bench asks its methods in turn over one model, each a full and a
# shorter answer, which may lie apart (a cycle of more layouts than are kept never replays one)
KEEP_GRAPHS = 16


class Graphs:
    """A model's kept graphs (each a private pool of a few MB) and how many reads have replayed one."""

    def __init__(self):
        self.kept: collections.OrderedDict[tuple, Kept] = collections.OrderedDict()
        self.replays = 0

    def find(self, layout: tuple | None) -> Kept | None:
        kept = self.kept.get(layout) if layout is not None else None
        if kept is not None:
            self.kept.move_to_end(layout)
            self.replays += 1
        return kept

    def keep(self, kept: Kept) -> None:
        self.kept[kept.layout] = kept
        while len(self.kept) > KEEP_GRAPHS:
            self.kept.popitem(last=False)


GRAPHS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()      # model -> its Graphs


def replays(model) -> int:
    """Reads so far that replayed a graph kept on the model (Answer.replayed)."""
    graphs = GRAPHS.get(model)
    return 0 if graphs is None else graphs.replays


def layout(kind: type, model, cache: Cache) -> tuple | None:
    """All that a graph over the read bakes in: where the model's weights lie (a cast moves them), where and how
    the read's keys and values lie, and what the attention's wraps fix; None where a wrap does not say (no graph
    is kept or replayed)."""
    wraps = baked(model)
    if wraps is None:
        return None
    weights = tuple(t.data_ptr() for t in itertools.chain(model.parameters(), model.buffers()))
    return (kind, wraps, weights, *((t.data_ptr(), tuple(t.shape), t.stride(), t.dtype)
                                    for layer in cache.layers for t in (layer.keys, layer.values)))


class CapturedStep:
    """The step on fixed tensors (the last id, its position) over `fixed(cache)`: run as is on a CPU; on a GPU the
    first step runs on a side stream (warm-up), the second is captured as a CUDA graph (recorded, not run) and
    every step from then on replays it. A read whose keys and values lie where a kept captured read's did (the same
    placed memory asked again, or buffers the allocator hands back at the same addresses), under the same attention
    wraps, replays that graph from its first step (`Kept`). Each graph has its own private memory pool (a pool
    shared across graphs is freed with its last graph, and a later capture into the freed pool fails inside torch's
    allocator). The capture calls CUDAGraph.capture_begin/capture_end itself, not torch.cuda.graph, so that it
    leaves the allocator's cache alone (`make_room_to_capture`)."""

    def __init__(self, model, cache, position: int, max_new_tokens: int):
        self.model, self.keyword = model, cache_keyword(model)
        self.cache = fixed(cache, max_new_tokens)
        device = model.device
        self.cuda, self.graph, self.calls = device.type == "cuda", None, 0
        self.next_id = next_id
        self.layout = layout(type(self), model, self.cache) if self.cuda else None
        self.graphs = GRAPHS.setdefault(model, Graphs())
        kept = self.graphs.find(self.layout)
        if kept is not None:
            self.take(kept, position)
            return
        self.ids = torch.zeros((1, 1), dtype=torch.long, device=device)
        self.position = torch.full((1, 1), position, dtype=torch.long, device=device)
        self.next = self.ids

    def take(self, kept: Kept, position: int) -> None:
        """Replay `kept` over this read: its fixed tensors set to this read's lengths and position."""
        for layer, length in zip(self.cache.layers, kept.lengths):
            length.copy_(layer.cumulative_length)
            layer.cumulative_length = length
        kept.position.fill_(position)
        self.ids, self.position, self.next, self.graph = kept.ids, kept.position, kept.next, kept.graph

    def forward(self) -> None:
        self.next = self.next_id(self.model, self.keyword, self.ids, self.cache, self.position)
        self.position.add_(1)

    def __call__(self, last: torch.Tensor) -> torch.Tensor:
        self.ids.copy_(last)
        self.calls += 1
        if not self.cuda:
            self.forward()
        elif self.graph is not None:
            self.graph.replay()
        elif self.calls == 1:
            with side_stream(self.model.device):
                self.forward()
        else:
            make_room_to_capture(self.model.device)
            graph = torch.cuda.CUDAGraph()
            with side_stream(self.model.device):
                graph.capture_begin()
                try:
                    self.forward()
                finally:                        # the stream leaves capture mode whatever happened inside
                    graph.capture_end()
            self.graph = graph                  # replayed from now on: only a graph captured whole
            if self.layout is not None:
                self.graphs.keep(Kept(self.layout, graph, self.ids, self.position,
                                      [layer.cumulative_length for layer in self.cache.layers], self.next))
            self.graph.replay()
        return self.next.clone()


@functools.cache
def compiled_next_id():
    """`next_id` compiled once per process, whatever the model: dynamic shapes from the first read on, as every
    read's cache has its own length, and no CUDA graphs of inductor's own (CapturedStep captures the compiled step
    as it captures the model's)."""
    return torch.compile(next_id, dynamic=True, fullgraph=True)


class CompiledStep(CapturedStep):
    """CapturedStep over the step compiled by inductor: the first step of a process compiles it (inductor keeps
    its kernels on disk for the next process), every later step runs its fused kernels."""

    def __init__(self, model, cache, position: int, max_new_tokens: int):
        super().__init__(model, cache, position, max_new_tokens)
        self.next_id = compiled_next_id()


STEPS = {Decode.eager: EagerStep, Decode.captured: CapturedStep, Decode.compiled: CompiledStep}


@torch.no_grad()
def greedy(model, logits: torch.Tensor, cache, position: int, max_new_tokens: int, stop: set[int],
           check_every: int | None = None, decode: str = "eager") -> list[int]:
    """Continue greedily from the last row of `logits` [p, vocab] until a stop id or the budget; the ids before
    the first stop id.

    Each next id stays on the device and feeds the next step as it is: every `check_every` tokens the device is
    asked whether a stop id came (default: CHECK_EVERY on a GPU; every token on a CPU, where a look costs nothing
    and a step past the stop would), and its answer is read once it has reached the host (`Look`), so the host
    never waits for the device inside the loop. The steps decoded past a stop are dropped; the ids are those of a
    loop that stops at once. The ids are read to the host once, at the end. decode: how each step runs (STEPS);
    the stop check is the same for each."""
    device = model.device
    if max_new_tokens < 1:
        return []
    check_every = check_every or (1 if device.type == "cpu" else CHECK_EVERY)
    stops = torch.tensor(sorted(stop), dtype=torch.long, device=device)
    ids = [logits[-1].argmax().view(1, 1)]
    step = STEPS[decode](model, cache, position, max_new_tokens) if max_new_tokens > 1 else None
    looks: list[Look] = []                  # asked, not yet read
    while len(ids) < max_new_tokens:
        if len(ids) % check_every == 0:
            looks.append(Look(torch.isin(torch.cat(ids[-check_every:]), stops).any()))
            landed = [look for look in looks if look.ready()]
            if any(look.answer for look in landed):
                break
            looks = [look for look in looks if look not in landed]
        ids.append(step(ids[-1]))
    out = torch.cat(ids).view(-1).tolist()
    first_stop = next((i for i, token in enumerate(out) if token in stop), len(out))
    return out[:first_stop]
