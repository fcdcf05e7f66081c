"""The reference methods every table starts with: no memory, the whole latent memory as stored, and the
stored fragments as plain text."""

from methods.base import Method, Plan, Question


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
    """The stored fragments as plain text before the prompt: memory without positional distortion."""

    needs_latent = False

    def plan(self, memory, prompt_ids, backend, question=Question()) -> Plan:
        return Plan(text_ids=memory.text_ids())
