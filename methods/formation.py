"""Memory formation: each fragment prefilled alone (its states depend on its own tokens only), one forward per
fragment, or, under `formation_batch=batched` (a GPU's default), the fragments a group is about to store side by
side in one padded forward, each row's states those of its forward alone.

Three formations, because a fragment prefilled alone turns its first token into
an attention sink that inflates its density:
- ``reference`` (the authors' code): the first stored fragment is tokenized with
  the tokenizer's special tokens and its first position becomes the memory's
  sink (bos); later fragments are tokenized without special tokens.
- ``shared_sink``: every fragment is prefilled behind one shared sink token whose
  states are then dropped; the sink of the first fragment is kept once at
  memory position 0.
- ``own_bos`` (EPIC's setting: every chunk begins with its own BOS): every fragment
  is prefilled behind the same sink token as under ``shared_sink`` and keeps it;
  the memory's sink is a copy of the first fragment's.
- ``shared_prefix`` (APE's setting: every context behind the prompt's header): as
  ``shared_sink``, the sink token followed by the prompt's header (the chat template's
  text before the question), whose states become the memory's sink; a prompt read
  after this memory starts after its header.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import replace
from enum import StrEnum

import torch
from transformers import DynamicCache

from methods.memory import Fragment, Layered, LatentMemory, pinned
from methods.attention.decoder import DecoderError, cache_keyword, hooked, layers
from methods.attention.positions import Rotary, watching_rotary
from methods.errors import one_of, whole_number
from methods.prompting import prompt_header

Formation = StrEnum("Formation", ["shared_sink", "reference", "own_bos", "shared_prefix"])   # see the module docstring
# how many fragments one forward forms: one (`solo`), or several a group is about to store (`batched`, see
# Former.expect): on a GPU a forward is ~1,450 kernel launches on an 8B model, whose host time a short fragment's
# arithmetic does not cover
FormationBatch = StrEnum("FormationBatch", ["solo", "batched"])
# padded positions (rows x the longest row) one batched forward holds: its transients (cache, logits) are those of
# one fragment of as many tokens (docs/gpu.md); a fragment longer than this is formed alone
BATCH_TOKENS = 2048
# where a fragment's tensors live: on the model's device (no copy at formation, forgetting or placement), or in
# host memory (pinned on a GPU, so placement copies overlap compute) for a memory larger than the device
Residence = StrEnum("Residence", ["model", "host"])


def default_formation_batch(device: torch.device) -> str:
    """batched on a GPU; solo elsewhere (a CPU's forward costs its arithmetic, to which padding only adds)."""
    return "batched" if device.type == "cuda" else "solo"


def sink_token_id(tokenizer) -> int:
    """The token every fragment is formed behind under ``shared_sink``."""
    for tid in (tokenizer.bos_token_id, tokenizer.eos_token_id):
        if tid is not None:
            return int(tid)
    raise ValueError("the tokenizer has neither a bos nor an eos token to use as a sink")


def formation_header(tokenizer, formation: str, style: str) -> list[int]:
    """The prompt header a formation forms every fragment behind: the style's under ``shared_prefix``, else none."""
    return prompt_header(tokenizer, style) if formation == "shared_prefix" else []


def sink_ids(tokenizer, header: list[int]) -> list[int]:
    """What every fragment is formed behind (not under ``reference``), the memory's sink: the sink token, then the
    header (whose own first token serves as the sink where it is that token)."""
    sink = sink_token_id(tokenizer)
    return header if header[:1] == [sink] else [sink, *header]


@contextmanager
def capture_layer_inputs(model, rows: int = 1):
    """Record the hidden-state input [rows, T, hidden] of every decoder layer during a forward of `rows` sequences."""
    captured: list[torch.Tensor] = []

    def make_hook(index):
        def hook(module, args, kwargs):
            states = args[0] if args else kwargs["hidden_states"]
            if states.dim() != 3 or states.shape[0] != rows:    # Gemma-3n's AltUp: several streams per token
                raise DecoderError(f"model type {model.config.model_type!r}: decoder layer {index} takes hidden "
                                   f"states of shape {tuple(states.shape)}, not one vector per token ([{rows}, "
                                   f"tokens, width]), so the paper's formulation cannot store its layer inputs")
            captured.append(states.detach())
        return hook

    with hooked(layers(model), make_hook):
        yield captured


# fp32 bytes of log-probabilities computed at once: a fragment's every position at once is [T, vocab] in fp32 twice
# (the upcast and its log-softmax), 1 MB a token on a 128k vocabulary, more than its keys and values (docs/gpu.md)
NLL_BYTES = 32 << 20


def nll_rows(vocabulary: int) -> int:
    """Positions whose log-probabilities next_token_nll computes at once."""
    return max(1, NLL_BYTES // (4 * vocabulary))


def next_token_nll(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """[T-1] nats of each of ids[1:] given the tokens before it, from the logits [T, vocab] of ids [T], a few
    positions at a time (`nll_rows`): each row's log-softmax is its own, so the nats are those of all at once."""
    rows = nll_rows(logits.shape[-1])
    wanted = ids[1:].view(-1, 1).to(logits.device)
    return torch.cat([-torch.log_softmax(part.float(), dim=-1).gather(1, targets).squeeze(1)
                      for part, targets in zip(logits[:-1].split(rows), wanted.split(rows))])


class Former:
    """Turns text into fragments of a `LatentMemory` with what the backend needs.

    keep_kv: position-free keys/values (fast backend); keep_states: per-layer
    inputs (hidden-prefix backend); keep_self_info: run the pass for self-information
    even when neither is kept (text memory under informativeness forgetting).
    """

    def __init__(self, model, tokenizer, formation: Formation = "shared_sink", keep_kv: bool = True,
                 keep_states: bool = False, reuse: dict | None = None, keep_self_info: bool = False,
                 memory_on: Residence = "model", header: list[int] = (), batch: FormationBatch = "solo",
                 batch_tokens: int = BATCH_TOKENS):
        """header: the prompt header's ids (see `shared_prefix`; other formations form behind the sink alone);
        batch: whether texts announced by `expect` are formed several per forward, within `batch_tokens`."""
        one_of("formation", formation, Formation)
        one_of("memory_on", memory_on, Residence)
        one_of("formation_batch", batch, FormationBatch)
        whole_number("batch_tokens", batch_tokens)
        self.memory_on = memory_on
        self.model, self.tokenizer, self.formation = model, tokenizer, formation
        self.keep_kv, self.keep_states, self.keep_self_info = keep_kv, keep_states, keep_self_info
        self._next_id = 0
        self._reuse = {} if reuse is None else reuse
        self.header = list(header) if formation == "shared_prefix" else []
        self.batch = batch == "batched" and (keep_kv or keep_states or keep_self_info)    # else no forward runs
        self.batch_tokens = batch_tokens
        self._expected: list[tuple[tuple, torch.Tensor]] = []   # (key, ids) announced by `expect`, in order
        self._formed: dict[tuple, Fragment] = {}                # key -> formed ahead of its store by a batch

    def __repr__(self) -> str:
        return (f"Former({self.formation}, kv={self.keep_kv}, states={self.keep_states}, "
                f"self_info={self.keep_self_info}, on={self.memory_on})")

    @property
    def stamp(self) -> str:
        """What the memories this former forms are formed by (LatentMemory.formed_by): the model's kind and shape
        (type, layers, width, vocabulary, dtype: not its path, which differs from machine to machine for the same
        model) and the formation, with the header a shared prefix forms behind."""
        config = self.model.config.get_text_config()
        behind = f" behind a header of {len(self.header)} ids" if self.header else ""
        return (f"a {config.model_type} model ({config.num_hidden_layers} layers, hidden "
                f"{getattr(config, 'hidden_size', '?')}, vocabulary {getattr(config, 'vocab_size', '?')}, "
                f"{str(self.model.dtype).removeprefix('torch.')}), formation {self.formation}{behind}")

    def adopt(self, memory: LatentMemory) -> None:
        """Take a memory formed elsewhere (a session's memory assigned, or loaded): refused (ValueError, naming
        both) where it was formed by another model or formation, or lacks what this former keeps for its
        backend and forgetting; then what this former forms next is numbered after its fragments."""
        if memory.formed_by is not None and memory.formed_by != self.stamp:
            raise ValueError(f"this memory was formed by {memory.formed_by}; this session forms by {self.stamp}")
        for name, kept in (("keys", self.keep_kv), ("states", self.keep_states)):
            if kept and memory.sink is not None and getattr(memory.sink, name) is None:
                raise ValueError(f"this memory was formed without '{name}', which this session's backend reads: "
                                 f"form it with this backend")
        if self.keep_self_info and memory.fragments and all(bool(torch.isinf(f.self_info).all())
                                                             for f in memory.fragments):
            raise ValueError("this memory has no self-information (formed with no forgetting that reads it), which "
                             "this session's forgetting ranks tokens by")    # one fragment may be all inf: one token
        self._next_id = max([self._next_id, *(f.fid + 1 for f in memory.fragments)])

    def token_ids(self, text: str, first: bool, kept: list[int] | None = None) -> torch.Tensor:
        """The ids prefilled for `text` (or for the ids `kept` of it by a compressor): a leading sink
        position where the formation has one."""
        special = self.formation == "reference" and first
        if kept is None:
            ids = self.tokenizer(text, add_special_tokens=special)["input_ids"]
        else:                                   # the tokenizer's leading special tokens, then the kept ids
            ids = [*self.tokenizer("", add_special_tokens=special)["input_ids"], *kept]
        if self.formation != "reference":
            ids = [*self.sink_ids(), *ids]
        return torch.tensor(ids, dtype=torch.long, device="cpu")

    def sink_ids(self) -> list[int]:
        """What every fragment is formed behind (see sink_ids)."""
        return sink_ids(self.tokenizer, self.header)

    def key(self, ids: torch.Tensor) -> tuple:
        """What a formed fragment is known by (in `reuse` and among those formed ahead): formation is
        deterministic, so the same ids under the same settings give the same fragment."""
        return repr(self), tuple(ids.tolist())

    def expect(self, texts, first: bool) -> None:
        """Announce the texts about to be stored, in this order (the first of them as the memory's first where
        `first`): under batch, forming one of them forms those announced after it in the same forward (see
        `_ahead`); each waits for its own store, which appends it as before. Nothing changes otherwise."""
        if self.batch:
            self._expected += [(self.key(ids), ids)
                               for ids in (self.token_ids(text, first and i == 0) for i, text in enumerate(texts))]

    def store(self, memory: LatentMemory, text: str, reuse: bool = False) -> Fragment:
        """Form `text` and append it to `memory` (unbounded; see methods.forgetting for a capacity)."""
        fragment = self.next_fragment(memory, text, reuse)
        memory.append(fragment)
        return fragment

    def next_fragment(self, memory: LatentMemory, text: str, reuse: bool = False,
                      kept: list[int] | None = None) -> Fragment:
        """Form `text` as the next fragment of `memory`; the first fragment also gives the sink.

        reuse: keep the formed states to serve the same text again (formation is
        deterministic), e.g. distractors that every group stores. kept: the ids a compressor
        kept of `text`, formed instead of its tokenization.
        """
        first = memory.sink is None
        whole = self.form(self.token_ids(text, first, kept), text, reuse)
        sink = torch.arange(len(self.sink_ids()) if self.formation != "reference" else 1, device="cpu")
        if first:
            memory.sink, memory.formed_by = whole.take(sink), self.stamp
        if self.formation in ("shared_sink", "shared_prefix") or (first and self.formation == "reference"):
            whole = whole.take(torch.arange(len(sink), len(whole), device="cpu"))   # its sink positions are not kept
        if len(whole) == 0:
            raise ValueError(f"fragment {text[:40]!r} is empty after tokenization")
        return whole

    @torch.no_grad()
    def form(self, ids: torch.Tensor, text: str, reuse: bool = False) -> Fragment:
        """One forward pass over `ids` [T]: keys/values, layer inputs, self-information (or its fragment as
        formed already: by an earlier store where `reuse`, or ahead of this store by a batch)."""
        fid, self._next_id = self._next_id, self._next_id + 1
        key = self.key(ids)
        if key in self._reuse:
            return replace(self._reuse[key], fid=fid, text=text)
        formed = self._formed.pop(key, None)
        fragment = self._prefill(ids, text, fid) if formed is None else replace(formed, fid=fid, text=text)
        if reuse:
            self._reuse[key] = fragment
        return fragment

    def _prefill(self, ids: torch.Tensor, text: str, fid: int) -> Fragment:
        """ids [T] formed in one forward, beside the announced fragments that follow it (under batch)."""
        ahead = self._ahead(self.key(ids), len(ids)) if self._expected else []
        fragment, *others = self._forward([ids, *(later for _, later in ahead)])
        self._formed.update(zip((key for key, _ in ahead), others))
        return replace(fragment, fid=fid, text=text)

    def _ahead(self, key: tuple, width: int) -> list[tuple[tuple, torch.Tensor]]:
        """The announced fragments formed in the same forward as `key` (of `width` ids): those announced after
        it, in order, each once and not served already (reused, or formed ahead), while the batch's padded
        positions (rows x its longest row) stay within batch_tokens; none where `key` was not announced. The
        ones passed over are forgotten: served already, or formed alone at their store."""
        at = next((i for i, (announced, _) in enumerate(self._expected) if announced == key), None)
        if at is None:
            return []
        later, taken, seen = self._expected[at + 1:], [], {key}
        stop = len(later)
        for i, (announced, ids) in enumerate(later):
            if announced in seen or announced in self._reuse or announced in self._formed:
                continue
            if (len(taken) + 2) * max(width, len(ids)) > self.batch_tokens:
                stop = i
                break
            taken.append((announced, ids))
            seen.add(announced)
            width = max(width, len(ids))
        self._expected = later[stop:]
        return taken

    def _forward(self, rows: list[torch.Tensor]) -> list[Fragment]:
        """Fragments of the ids rows [T_i] from one forward (no id or text yet: their store gives them).

        Several rows are right-padded behind an attention mask: a row attends to its own tokens only, causally,
        at positions 0..T_i-1 (its padding comes after it), and formation's cache keeps every position of every
        layer (sliding-window ones too: a DynamicCache built without the config), so its states are those of its
        forward alone, on every family, to the kernels' rounding (tests/test_formation_batch.py, every tiny family
        and formation). No family falls back to one row: a decoder whose layers take several vectors per token
        (Gemma-3n's AltUp) is refused by capture_layer_inputs batched or not."""
        unknown = [torch.full((len(ids),), float("inf"), device="cpu") for ids in rows]
        if not (self.keep_kv or self.keep_states or self.keep_self_info):
            return [Fragment(-1, "", ids, inf) for ids, inf in zip(rows, unknown)]
        device = self.model.device
        if len(rows) == 1:
            given = {"input_ids": rows[0].view(1, -1)}
        else:
            lengths = torch.tensor([len(ids) for ids in rows], device="cpu")
            mask = torch.arange(int(lengths.max()), device="cpu").view(1, -1) < lengths.view(-1, 1)  # [rows, width]
            padded = torch.zeros(mask.shape, dtype=torch.long, device="cpu")
            padded[mask] = torch.cat(rows)
            given = {"input_ids": padded, "attention_mask": mask.long()}
        given = {name: t.to(device, non_blocking=True) for name, t in given.items()}
        cache = DynamicCache()
        watch = watching_rotary(self.model, Rotary.of(self.model).reads) if self.keep_kv else nullcontext()
        # the vocabulary head runs only where self-information is read; otherwise the decoder alone runs, every
        # position through every layer (a model asked for its last logits may skip positions in late layers:
        # Gemma-4's layers that reuse another layer's keys)
        run = self.model if self.keep_self_info else self.model.get_decoder()
        with capture_layer_inputs(self.model, len(rows)) as inputs, watch as rotated:
            out = run(**given, **{cache_keyword(run): cache}, use_cache=True)
        if self.keep_kv:
            rotary = Rotary.of(self.model)
            keys, values = rotary.unrotated(rotated, cache)            # each [rows, heads, width, d]
        fragments = []
        for row, (ids, self_info) in enumerate(zip(rows, unknown)):
            n = len(ids)
            if self.keep_self_info:
                nll = next_token_nll(out.logits[row, :n], ids)
                self_info = torch.cat([torch.tensor([float("inf")], device=device), nll]).cpu()
            fragment = Fragment(-1, "", ids, self_info)
            if self.keep_kv:
                fragment.keys = self.kept([k[row, :, :n] for k in keys], rotary.stacked)        # [L, kv, T, d]
                fragment.values = self.kept([v[row, :, :n] for v in values], rotary.stacked)    # [L, kv, T, d_v]
            if self.keep_states:
                fragment.states = self.kept([s[row, :n] for s in inputs], torch.stack)          # [L, T, hidden]
            fragments.append(fragment)
        return fragments

    def kept(self, per_layer: list[torch.Tensor], stack) -> torch.Tensor | Layered:
        """Formed layer tensors stacked where the memory lives (see Residence): on the host, each layer copied
        there (no second copy on the device) and pinned once stacked, so the stored tensor is the pinned one."""
        if self.memory_on == "model":
            return stack(per_layer)
        return pinned(stack([t.cpu() for t in per_layer]))
