"""The model's trained window, and the positions every read takes against it.

A read is one forward that places tokens at positions: a memory read as a prefix (the sink, the memory's
tokens, then the prompt; the fast backend places them, the hidden-prefix backend recomputes them), the same
fragments as plain text before the prompt, a trace of the prompt's attention over the memory, and the answer,
whose budget of `max_new_tokens` takes the positions after the prompt (the last generated token is never read
back: a read with prefix P, prompt p and budget b feeds positions 0 .. P + p + b - 2, so it takes
P + p + b - 1 of them). `Window` watches the positions every forward of the decoder is given, so every read
of every method and backend is counted where it happens, not recomputed beside it.

The trained window is the number of positions the model's configuration says it was trained on:
`max_position_embeddings` (or the family's own field), or, where its rotary embedding is scaled to a longer
context with a stated pretraining length (yarn, longrope, llama3: `factor` x `original_max_position_embeddings`),
the longer of the two; a linear or dynamic scaling with no stated pretraining length extends nothing
(Gemma-3's global layers: `max_position_embeddings` is already the scaled window). A sliding-window layer
(Mistral's, Gemma-2/3's local layers) attends to the last `sliding_window` keys only, but at the same absolute
positions: it shortens what a layer sees, not the window, so it changes nothing here.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from methods.attention.decoder import cache_keyword

SCALED = ("yarn", "longrope", "llama3")       # RoPE types that extend a stated pretraining length by `factor`
DECLARED = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length")
BEYOND_MARK = "(past window)"                 # a table's mark on a run that read past its model's trained window
BEYOND_CELL = "†"                             # a cell's: an answer it counts read past it (a record's beyond_window)
HOST = torch.device("cpu")                    # position ids here are read at once; an accelerator's wait for take
WAYS_OUT = "lower model.memory_capacity, or set allow_beyond_window=true to study reads beyond it deliberately"
LIBRARY_WAYS_OUT = ("store less or ask for fewer tokens, or pass Session(window=Window.of(model, allow=True)) to read "
                    "past it deliberately (a model whose own memory outgrows its window by design, MemoryLLM's, "
                    "needs that)")


class WindowError(ValueError):
    """A read would take more positions than the model's trained window (one line, the numbers, the ways out)."""


def trained_window(config) -> int | None:
    """The positions the model's config says it was trained on (see the module docstring); None where it
    declares none (ALiBi models, say)."""
    text = config.get_text_config()
    declared = next((int(getattr(text, f)) for f in DECLARED if getattr(text, f, None)), None)
    scaled = [int(p["factor"] * p["original_max_position_embeddings"]) for p in rope_settings(text)
              if rope_type(p) in SCALED and p.get("factor")
              and p.get("original_max_position_embeddings")]
    return max([*scaled, *([] if declared is None else [declared])], default=None)


def rope_settings(text_config) -> list[dict]:
    """The rotary settings of a text config: one dict, or one per layer type (Gemma-3's local and global)."""
    rope = getattr(text_config, "rope_parameters", None) or getattr(text_config, "rope_scaling", None) or {}
    nested = bool(rope) and all(isinstance(v, dict) or v is None for v in rope.values())
    return [p for p in (rope.values() if nested else [rope]) if p]


def rope_type(settings: dict) -> str | None:
    """One rotary setting's type (`rope_type`; `type` in configs written before transformers renamed it)."""
    return settings.get("rope_type", settings.get("type"))


def positions(prefix: int, prompt: int, budget: int) -> int:
    """The positions a read takes: `prefix` (sink and memory, or text) before a `prompt`, then an answer of at
    most `budget` tokens (its last one is never read back)."""
    return prefix + prompt + max(budget - 1, 0)


def refusal(needed: int, window: int, model: str | None, what: str, ways_out: str) -> str:
    """The one line that refuses a read past the window (`model`: its name, if known)."""
    whose = f"model {model}'s" if model else "the model's"
    return f"{what} takes {needed} positions, {needed - window} past {whose} trained window of {window}: {ways_out}"


class Window:
    """The positions a run's reads take against the model's trained window `limit` (None: no limit).

    A read past it raises WindowError unless `allow` (then `beyond` keeps, for the record being read, how
    many positions past the window its longest read went: 0 inside): at once where its position ids are on the
    host, at the question's end (`settle`) or the record's `take` where they are on an accelerator (so no
    forward waits for the device)."""

    def __init__(self, limit: int | None, allow: bool = False, model: str | None = None,
                 ways_out: str = LIBRARY_WAYS_OUT):
        self.limit, self.allow, self.model, self.ways_out = limit, allow, model, ways_out
        self.reserve = 0                # positions after a forward's own that its answer takes (see answering)
        self.decoding = False           # inside `answering`'s decoding: one-token steps it already counted
        self.beyond = 0
        self.pending: list[tuple] = []  # (last position id on an accelerator, answer positions after it, what)
        self.watched = False            # inside `watching`

    @classmethod
    def of(cls, model, allow: bool = False) -> "Window":
        """A loaded model's own trained window, named as its config names the model (a library session's
        default: a read past it is refused unless `allow`)."""
        return cls(trained_window(model.config), allow, getattr(model.config, "name_or_path", None) or None)

    def past(self, needed: int) -> int:
        """How many of a read's `needed` positions lie past the window (0 inside, or with no limit)."""
        return 0 if self.limit is None else max(needed - self.limit, 0)

    def check(self, needed: int, what: str = "a read") -> None:
        """Count a read of `needed` positions: refused past the window unless allowed."""
        past = self.past(needed)
        if past and not self.allow:
            raise WindowError(refusal(needed, self.limit, self.model, what, self.ways_out))
        self.beyond = max(self.beyond, past)

    def settle(self) -> None:
        """Check the reads whose position ids lay on an accelerator, all with one host read (none per forward):
        at the end of a question, whose answer is on the host by then, and at a record's take."""
        if self.pending:
            lasts = torch.stack([last for last, _, _ in self.pending]).tolist()
            pending, self.pending = self.pending, []
            for last, (_, reserve, what) in zip(lasts, pending):
                self.check(positions(last + 1, 0, reserve + 1), what)

    def take(self) -> int:
        """Positions past the window of the longest read since the last take (0 inside), for one record."""
        self.settle()
        beyond, self.beyond = self.beyond, 0
        return beyond

    @contextmanager
    def answering(self, budget: int):
        """The forwards inside read a prompt an answer of `budget` tokens follows: each counts the positions of
        the answer after its own; the steps inside `decoding` are the answer's, counted already."""
        self.reserve = max(budget - 1, 0)
        try:
            yield
        finally:
            self.reserve, self.decoding = 0, False

    def decode(self) -> None:
        """The answer's decoding starts (inside `answering`): its steps take the positions counted for it."""
        self.decoding = self.reserve > 0

    @contextmanager
    def watching(self, model):
        """Check every forward of the model's decoder while inside (hook removed in `finally`); inside a watch
        already (a session's store or question within a run's group), the outer one watches; with no limit, none."""
        if self.watched or self.limit is None:          # nothing to count against
            yield self
            return

        def hook(module, args, kwargs):
            if self.decoding:                               # the answer's steps, counted with its prefill
                return
            ids = kwargs.get("input_ids", args[0] if args else None)
            tokens = (ids if ids is not None else kwargs["inputs_embeds"]).shape[1]
            given = kwargs.get("position_ids")
            what = "a read with the answer's budget" if self.reserve else "a read"
            if given is not None and given.device != HOST:       # read with the record's (take), not now
                self.pending.append((given.max(), self.reserve, what))
                return
            if given is not None:
                last = int(given.max()) + 1
            else:
                cache = kwargs.get(cache_keyword(module))
                last = (0 if cache is None else cache.get_seq_length()) + tokens
            self.check(positions(last, 0, self.reserve + 1), what)

        handle = model.get_decoder().register_forward_pre_hook(hook, with_kwargs=True)
        self.watched = True
        try:
            yield self
        finally:
            handle.remove()
            self.watched = False


def window_summary(limit: int | None, allow: bool, records: list[dict]) -> dict:
    """For run.json: the trained window, whether reads past it were allowed, how many records read past it and
    the most positions past it any of them read."""
    past = [r.get("beyond_window", 0) for r in records]
    return {"trained": limit, "allow_beyond": allow, "records_beyond": sum(p > 0 for p in past),
            "most_beyond": max(past, default=0)}


def marked(label: str, beyond: bool) -> str:
    """A table's label for a run, marked where any of its records read past the model's trained window."""
    return f"{label} {BEYOND_MARK}" if beyond else label


def capacity_positions(capacity: int, sink: int, prompt: int, budget: int) -> int:
    """The positions a read of a full memory of `capacity` tokens takes behind its sink of `sink` positions, with
    the shortest prompt read after it (the question empty) and the answer budget."""
    return positions(sink + capacity, prompt, budget)


def check_capacity(config, capacity: int | None, sink: int, prompt: int, budget: int, allow: bool,
                   model: str, stored: tuple[int, str] | None = None, longest: int = 1) -> None:
    """Before any weights load: refuse a memory capacity whose full read cannot fit the trained window beside
    the prompt and the answer, whatever the data (WindowError); with no capacity (nothing forgotten), the most
    a group of the task stores, `stored` = (its tokens, which group stores how many fragments). The way out it
    names is one the run takes: a capacity below the task's `longest` fragment (tokens) is none."""
    window = trained_window(config)
    memory = capacity if capacity is not None else stored and stored[0]
    if memory is None or window is None or allow:
        return
    needed = capacity_positions(memory, sink, prompt, budget)
    if needed > window:
        fits = memory - (needed - window)
        held = f"model.memory_capacity={capacity}" if capacity is not None else \
            f"{stored[1]} of {memory} tokens in all, none forgotten"
        if fits < longest:
            lower = (f"no capacity fits, as a fragment of this task takes up to {longest} tokens and the window "
                     f"leaves {max(fits, 0)} for the memory: store shorter fragments, ask for a shorter answer "
                     f"(max_new_tokens), or use a model with a longer window")
        elif capacity is not None:
            lower = f"set model.memory_capacity<={fits}"
        else:
            lower = (f"store fewer or shorter fragments, or forget (e.g. forgetting=informativeness "
                     f"model.memory_capacity={fits})")
        raise WindowError(f"{held}: a full memory's read (sink {sink} + {memory} + prompt {prompt} + answer budget "
                          f"{budget} - 1) takes {needed} positions, {needed - window} past model {model}'s trained "
                          f"window of {window}: {lower}, or allow_beyond_window=true to study reads beyond it "
                          f"deliberately")
