"""The stored fragments as plain text before the prompt: memory without positional distortion."""

from methods.base import Method, Plan


class TextMemory(Method):
    needs_latent = False

    def plan(self, memory, prompt_ids, backend) -> Plan:
        return Plan(text_ids=memory.text_ids())
