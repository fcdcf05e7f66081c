"""The stored fragments as plain text before the prompt: memory without positional distortion."""

import torch

from methods.base import Method, Plan


class TextMemory(Method):
    needs_latent = False

    def plan(self, memory, prompt_ids, backend) -> Plan:
        parts = [f.token_ids for f in [memory.sink, *memory.fragments] if f is not None]
        return Plan(text_ids=torch.cat(parts) if parts else None)
