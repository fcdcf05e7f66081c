"""Vanilla latent memory: the whole memory, in its stored order, as the prefix."""

from methods.base import Method, Plan


class Vanilla(Method):
    def plan(self, memory, prompt_ids, backend) -> Plan:
        return Plan(latent=memory)
