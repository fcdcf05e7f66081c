"""The reference methods every table starts with: no memory, the whole latent memory as stored, and the
stored fragments as plain text."""

import torch

from methods.base import Method, Plan, Question
from methods.errors import whole_number


class NoMemory(Method):
    """No memory at all: the paper's borderline."""

    needs_latent = False

    def plan(self, memory, prompt_ids, backend, question=Question()) -> Plan:
        return Plan()


class Vanilla(Method):
    """Vanilla latent memory: the whole memory, in its stored order, as the prefix."""

    def plan(self, memory, prompt_ids, backend, question=Question()) -> Plan:
        return Plan(latent=memory)


class TextMemory(Method):
    """The stored fragments as plain text before the prompt: memory without positional distortion.
    fit_window: cut to the model's positions, keeping the sink and the latest tokens that fit before the prompt
    and `answer_room` answer tokens (a memory longer than the window loses its oldest tokens first)."""

    needs_latent = False

    def __init__(self, fit_window: bool = False, answer_room: int = 64):
        whole_number("method.answer_room", answer_room, least=1)
        self.fit_window, self.answer_room = fit_window, answer_room

    def plan(self, memory, prompt_ids, backend, question=Question()) -> Plan:
        ids = memory.text_ids()
        if self.fit_window and ids is not None:
            window = backend.model.config.get_text_config().max_position_embeddings
            room = max(window - len(prompt_ids) - self.answer_room - memory.sink_length, 0)
            if len(ids) > memory.sink_length + room:
                ids = torch.cat([ids[: memory.sink_length], ids[len(ids) - room:]])
        return Plan(text_ids=ids)
