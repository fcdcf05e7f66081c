"""No memory at all: the paper's borderline."""

from methods.base import Method, Plan


class NoMemory(Method):
    needs_latent = False

    def plan(self, memory, prompt_ids, backend) -> Plan:
        return Plan()
