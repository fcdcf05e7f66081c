"""The reference methods every table starts with: no memory, the whole latent memory as stored, and the
stored fragments as plain text."""

import math

import torch

from methods.base import Method, Plan, Question
from methods.errors import whole_number
from methods.window import trained_window


class NoMemory(Method):
    """No memory at all: the paper's borderline."""

    needs_latent = False
    reads_memory = False

    def plan(self, memory, prompt_ids, backend, question=Question()) -> Plan:
        return Plan()


class Vanilla(Method):
    """Vanilla latent memory: the whole memory, in its stored order, as the prefix."""

    def plan(self, memory, prompt_ids, backend, question=Question()) -> Plan:
        return Plan(latent=memory)


class TextMemory(Method):
    """The stored fragments as plain text before the prompt: memory without positional distortion.
    fit_window: the verbatim fragments (their text as stored, before any forgetting) cut to the model's positions
    (uncut where its config declares none) as LoCoMo cuts its conversation (snap-research/locomo
    `task_eval/evaluate_llama2.py`, `get_input_context`): whole lines, the latest first, while the sink, the
    lines, the prompt and `answer_room` answer tokens fit;
    a fragment with any line kept keeps its first line too (a LoCoMo session's date header), and the fragments
    before the first that does not fit whole are dropped. Each line is tokenized on its own (LoCoMo counts
    each turn on its own too)."""

    needs_latent = False

    def __init__(self, fit_window: bool = False, answer_room: int = 64):
        whole_number("method.answer_room", answer_room, least=1)
        self.fit_window, self.answer_room = fit_window, answer_room
        self.tokenizer = None

    def with_tokenizer(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def plan(self, memory, prompt_ids, backend, question=Question()) -> Plan:
        ids = memory.text_ids()
        if self.fit_window and ids is not None:
            window = trained_window(backend.model.config)        # None (ALiBi, say): no positions to cut to
            room = math.inf if window is None else max(window - len(prompt_ids) - self.answer_room
                                                       - memory.sink_length, 0)
            ids = torch.cat([ids[: memory.sink_length], self.latest_lines(memory.fragments, room)])
        return Plan(text_ids=ids)

    def latest_lines(self, fragments, room: float) -> torch.Tensor:
        """The ids of the latest whole lines of `fragments` that fit in `room` tokens, each kept fragment's
        first line with them, in stored order."""
        kept = []                                   # per fragment, latest first: its first line's ids, then its lines'
        for fragment in reversed(fragments):
            header, *lines = [self.ids(line) for line in fragment.text.splitlines(keepends=True)]
            if len(header) > room:
                break
            room -= len(header)
            taken = []
            for line in reversed(lines):
                if len(line) > room:
                    break
                room -= len(line)
                taken.insert(0, line)
            kept.append([header, *taken])
            if len(taken) < len(lines):
                break
        pieces = [piece for fragment in reversed(kept) for piece in fragment]
        return torch.cat(pieces) if pieces else torch.empty(0, dtype=torch.long, device="cpu")

    def ids(self, text: str) -> torch.Tensor:
        return torch.tensor(self.tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long, device="cpu")
