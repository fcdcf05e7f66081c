"""One model, one backend, one method and one memory: store fragments, answer questions.

This is the shared machinery every method uses; methods only choose the Plan.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch

from methods.attention.decoder import num_layers
from methods.attention.grouped import grouped_attention
from methods.base import Method, Question, taken
from methods.compression.compressor import Compression, NoCompression
from methods.forgetting import Forgetting, NoForgetting, pairing_refusal
from methods.formation import Former, default_formation_batch, formation_header
from methods.errors import ConfigError, given, one_of, whole_number
from methods.generation import Decode, clock, default_decode, greedy, replays, stop_ids
from methods.memory import LatentMemory
from methods.phase_peaks import PeakWatch
from methods.prompting import format_prompt, prompt_template, read_prompt
from methods.backends.support import UNSUPPORTED, way_out
from methods.backends.text_prefix import TextPrefix
from methods.window import Window

UPDATE_PHASES = ("compression", "formation", "forgetting", "index")  # a store's seconds (index: a ranker's own)


@dataclass
class Answer:
    text: str
    memory_tokens: int            # memory positions the answer was generated with (text ones included)
    densities: dict[int, float]   # fragment id -> attention density, where the method traced (or the score of
                                  # `scored_by`, a retriever's)
    seconds: dict[str, float]     # per phase: the method's (e.g. trace, defragment) or plan, then prefill, decode
    tokens: int = 0               # tokens generated: the first from the prefill, the rest decoded
    read: list[int] | None = None # the fragment ids the answer read, where the method chose some
    prompt_tokens: int = 0        # tokens of the prompt run after the memory
    recomputed: float = 0.0       # memory positions computed for the answer, averaged over the layers (text: all
                                  # of its tokens, unless a held prefix of them is reused)
    scored_by: str = "density"
    peak_mb: dict[str, dict[str, float]] = field(default_factory=dict)   # on a GPU, the phases since the previous
                                  # question (its stores' and its own) that raised the allocator's running peak:
                                  # MiB allocated as each began and the peak it rose to (methods/phase_peaks.py)
    replayed: bool = False        # its decoding replayed a graph kept from an earlier read: no warm-up or capture

    def ranked(self) -> dict:
        """For a record with a rank under `densities`: what ranked, where it was not attention density."""
        return {} if self.scored_by == "density" else {"ranked_by": self.scored_by}

    def peaks(self) -> dict:
        """For a record: the phases that raised the device's peak, where any did (on a GPU)."""
        return {"peak_mb": self.peak_mb} if self.peak_mb else {}


class Session:
    def __init__(self, model, tokenizer, backend, method: Method, formation: str, prompt: str,
                 max_new_tokens: int = 32, reuse: dict | None = None,
                 forgetting: Forgetting | NoForgetting | None = None, compressor: Compression | None = None,
                 memory_on: str = "model", window: Window | None = None, decode: str | None = None,
                 formation_batch: str | None = None):
        """window: what counts the positions of every read against the model's (None: the model's own trained
        window, a read past it refused; Window(None) counts nothing); decode: how an answer's steps run
        (methods/generation.py: eager, captured, compiled; None: the device's default);
        formation_batch: how many fragments a forward forms (methods/formation.py: solo, batched; None: the
        device's default)."""
        self.model, self.tokenizer, self.backend, self.method = model, tokenizer, backend, method
        self._check_parts(forgetting, compressor, window, prompt, max_new_tokens)
        method.with_tokenizer(tokenizer)
        self.window = window or Window.of(model)
        self.prompt, self.max_new_tokens = prompt, max_new_tokens
        self.decode = decode or default_decode(model.device)
        one_of("decode", self.decode, Decode)
        self.compressor = compressor or NoCompression()
        self.compressed: list[dict] = []    # per stored fragment under compression: tokens before and after
        if method.keeps_own_memory:         # the model's own memory: it writes and admits
            writer = method.writer(model, tokenizer)
            self._memory, self.former, self.forgetting = writer.memory, writer, writer
        else:
            self.forgetting = forgetting or NoForgetting()
            latent = method.needs_latent
            header = formation_header(tokenizer, formation, prompt)
            self.former = Former(model, tokenizer, formation, keep_kv=latent and backend.keep_kv,
                                 keep_states=latent and backend.keep_states, reuse=reuse,
                                 keep_self_info=self.forgetting.needs_self_info, memory_on=memory_on,
                                 header=header, batch=formation_batch or default_formation_batch(model.device))
            self._memory = LatentMemory()
        self.update_seconds: dict[str, float] = {}     # the last store's formation and forgetting
        self.stored_peak_mb: dict[str, dict[str, float]] = {}  # the stores' since the last question (Answer.peak_mb)
        self.text = TextPrefix(model)                   # plain-token memory (text, none)
        self.stop = stop_ids(model, tokenizer)          # ids that end an answer (empty: always the full budget)

    def _check_parts(self, forgetting, compressor, window, prompt: str, max_new_tokens: int) -> None:
        """What the runner's preflight checks, for a library user, as the session is made: each part an instance
        of its kind, the backend built on this model and able to hold it, the method's layers, the forgetting
        able to serve the method, the prompt style and the answer budget (one line each)."""
        for name, value in (("method", self.method), ("forgetting", forgetting), ("compressor", compressor)):
            if isinstance(value, type):                       # any object with its kind's members, but a class
                raise TypeError(f"Session: {name} must be an instance, not the class {value.__name__} itself "
                                f"(make one: {value.__name__}(...))")
        given("Session: window", window, (Window, type(None)))
        if getattr(self.backend, "model", None) is not self.model:
            raise ValueError(f"Session: backend {self.backend!r:.80} is not built on this session's model: pass "
                             f"KVPrefixBackend(model) or HiddenPrefixBackend(model), with the session's model")
        try:
            type(self.backend).check(self.model.config)
        except UNSUPPORTED as err:
            raise ValueError(f"{type(self.backend).__name__} {err}: "
                             f"{way_out(type(self.backend), self.model.config, lambda b: b.__name__)}") from None
        self.method.check_model(self.model.config)
        self.method.check(num_layers(self.model.config))
        unpaired = pairing_refusal(self.method, forgetting or NoForgetting(), f"method {type(self.method).__name__}",
                                   f"forgetting {type(forgetting).__name__}")
        if unpaired:
            raise ValueError(unpaired)
        prompt_template(self.tokenizer, prompt)
        whole_number("max_new_tokens", max_new_tokens)

    def _check_kept(self, kept, before: int) -> None:
        """What a compressor kept of a text of `before` tokens: a non-empty list of at most that many of the
        model's token ids (else one line naming the compressor, before the fragment's forward)."""
        vocabulary = self.model.get_input_embeddings().num_embeddings
        ids = isinstance(kept, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in kept)
        if not ids or not kept or len(kept) > before or not all(0 <= i < vocabulary for i in kept):
            raise ConfigError(f"compression {type(self.compressor).__name__} returned {kept!r:.80} for a text of "
                              f"{before} tokens: it must return a non-empty list of at most {before} token ids in "
                              f"0..{vocabulary - 1} (or None to keep the text whole)")

    @property
    def memory(self) -> LatentMemory:
        return self._memory

    @memory.setter
    def memory(self, memory: LatentMemory) -> None:
        """A memory formed elsewhere (another session's, or loaded), checked as this session would have formed it
        (Former.adopt); the fragments this session stores next are numbered after its."""
        given("Session.memory", memory, type(self._memory))
        if not self.method.keeps_own_memory:
            self.former.adopt(memory)
        self._memory = memory

    def expect(self, texts) -> None:
        """Announce the texts about to be stored, in order (see Former.expect: under formation_batch=batched they
        are formed several per forward). Not under a compressor, whose kept ids are known only at each store,
        nor where the method's model keeps its own memory."""
        if not self.method.keeps_own_memory and isinstance(self.compressor, NoCompression):
            self.former.expect(texts, first=self.memory.sink is None)

    def store(self, text: str, reuse: bool = False) -> int:
        """Form one fragment and admit it, forgetting to stay within capacity; returns its id.
        reuse: the text recurs (see Former.next_fragment)."""
        given("Session.store: text", text, str)
        first = self.memory.sink is None
        with self.window.watching(self.model):
            try:
                return self._store(text, reuse)
            except Exception:
                if first and not self.method.keeps_own_memory:     # a failed first store leaves no memory behind
                    self.memory.sink, self.memory.fragments, self.memory.formed_by = None, [], None
                raise

    def _store(self, text: str, reuse: bool) -> int:
        self.backend.forget_trace()         # not held beside the forward that forms the fragment
        peaks = PeakWatch(self.model.device)
        start = clock(self.model.device)
        kept = self.compressor(text, self.model, self.tokenizer)
        compressed = clock(self.model.device)
        peaks.end("compression")
        if kept is not None:
            before = len(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            self._check_kept(kept, before)
            self.compressed.append({"tokens": before, "kept": len(kept), "seconds": compressed - start})
            text = self.tokenizer.decode(kept)
        fragment = self.former.next_fragment(self.memory, text, reuse, kept)
        formed = clock(self.model.device)
        peaks.end("formation")
        self.forgetting.admit(self.memory, fragment)
        self.update_seconds = {"compression": compressed - start, "formation": formed - compressed,
                               "forgetting": clock(self.model.device) - formed, **self.method.stored(fragment)}
        peaks.end("forgetting")
        self.stored_peak_mb |= peaks.raised             # a later rise of a phase is the higher
        return fragment.fid

    def store_all(self, texts, reuse: bool = False) -> tuple[list[int], dict[str, float]]:
        """Store each text in order; their ids and the seconds per phase of storing them all, summed.
        reuse: the texts recur (see Former.next_fragment)."""
        if isinstance(texts, str):
            raise TypeError("Session.store_all: texts must be an iterable of str, not one str (store() stores one)")
        ids, seconds = [], Counter()
        for text in texts:
            ids.append(self.store(text, reuse))
            seconds.update(self.update_seconds)
        return ids, dict(seconds)

    @torch.no_grad()
    def trace(self, view: LatentMemory, prompt_ids: torch.Tensor, layers: list[int]) -> dict[int, torch.Tensor]:
        """Prompt attention rows of `layers` from one forward, over `view` as this method holds it:
        a latent prefix (the backend's), or the same fragments as plain tokens; a read the window counts."""
        with self.window.watching(self.model):
            if self.method.needs_latent:
                return self.backend.attention_rows(view, prompt_ids, layers)
            return self.text.attention_rows(view.text_ids(), prompt_ids, layers)

    def shuffle(self, generator: torch.Generator) -> None:
        self.memory.reorder(torch.randperm(len(self.memory), generator=generator).tolist())

    def prompt_ids(self, question: str, style: str | None = None) -> torch.Tensor:
        """The ids read after the memory: the whole prompt, or what follows its header where the memory's sink
        holds that header (formation=shared_prefix)."""
        header = getattr(self.former, "header", []) if self.memory.sink is not None else []
        return read_prompt(self.tokenizer, question, style or self.prompt, header)

    @torch.no_grad()
    def ask(self, question: str, prompt: str | None = None, max_new_tokens: int | None = None,
            targets: tuple[int, ...] = ()) -> Answer:
        """prompt, max_new_tokens: this question's own (a task's), instead of the session's; targets: the ids
        of the stored fragments that hold its answer, where the task knows them (an oracle reads them).
        A read past the window (the session's) raises WindowError, unless the window allows it."""
        given("Session.ask: question", question, str)
        with self.window.watching(self.model):
            answer = self._ask(question, prompt, max_new_tokens, targets)
            self.window.settle()
        return answer

    def _ask(self, question: str, prompt: str | None, max_new_tokens: int | None, targets: tuple[int, ...]) -> Answer:
        if self.method.reads_memory and not self.method.keeps_own_memory and self.memory.sink is None:
            raise ValueError(f"nothing is stored yet for {type(self.method).__name__} to read: store() a fragment "
                             f"first (a question with no memory is method none's)")
        whole_number("max_new_tokens", max_new_tokens, or_null=True)
        prompt_ids = self.prompt_ids(question, prompt)
        if len(prompt_ids) == 0:
            raise ValueError(f"Session.ask: the question {question!r} in prompt {prompt or self.prompt!r} reads no "
                             f"token: ask something")
        max_new_tokens = self.max_new_tokens if max_new_tokens is None else max_new_tokens
        device = self.model.device
        peaks = PeakWatch(device)
        t0 = clock(device)
        with grouped_attention(self.model):     # the trace's forward and the read's, on CUDA (grouped.py)
            plan = taken(self.method.plan(self.memory, prompt_ids, self.backend,
                                          Question(question, frozenset(targets))), self.method, self.memory)
            t1 = clock(device)
            peaks.end("plan")
            latent = plan.latent
            with plan.reading.attention(self.model, latent), self.window.answering(max_new_tokens):
                if latent is not None:
                    logits, cache, position = self.backend.prefill(latent, prompt_ids, room=max_new_tokens,
                                                                   logits_to_keep=1, reading=plan.reading)
                    memory_tokens = latent.prefix_length
                else:
                    text_ids = plan.text_ids if plan.text_ids is not None else \
                        torch.empty(0, dtype=torch.long, device="cpu")
                    if plan.text_ids is None:           # no memory read: the prompt whole, its header included
                        prompt_ids = format_prompt(self.tokenizer, question, prompt or self.prompt)
                    logits, cache, position = self.text.prefill(text_ids, prompt_ids)
                    memory_tokens = len(text_ids)
                t2 = clock(device)
                peaks.end("prefill")
                self.window.decode()
                replayed = replays(self.model)
                new_ids = greedy(self.model, logits, cache, position, max_new_tokens, self.stop, decode=self.decode)
                replayed = replays(self.model) > replayed
                t3 = clock(device)
                peaks.end("decode")
        recomputed = float(memory_tokens) if latent is None else \
            plan.reading.recomputed(latent.n_tokens, num_layers(self.model.config))     # text: every token runs
        dens = {} if plan.densities is None else dict(zip(self.memory.ids(), plan.densities.tolist()))
        answer = Answer(self.tokenizer.decode(new_ids, skip_special_tokens=True), memory_tokens, dens,
                        {**(plan.seconds or {"plan": t1 - t0}), "prefill": t2 - t1, "decode": t3 - t2},
                        len(new_ids), plan.read, len(prompt_ids), recomputed, plan.scored_by,
                        self.stored_peak_mb | peaks.raised, replayed)
        self.stored_peak_mb = {}
        return answer
