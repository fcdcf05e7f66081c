"""Which phase set a run's peak device memory, and from how much. The CUDA allocator's running peak is read at the
end of each timed phase (a question's plan, prefill and decoding; a store's compression, formation and
forgetting), and a phase that raised it is noted with the memory allocated as it began and the peak it rose to, so
a run's records say where its tab:gpu-memory figure was reached and how much of it the phase itself added. The
peak is never reset here: a caller's own measure (the runner's job peak, the bench's per question) stands. Off a
GPU nothing is read: a process's peak RSS cannot be restarted per phase without walking its pages."""

from __future__ import annotations

import torch


class PeakWatch:
    """The phases, in order, during which the allocator's running peak rose: {phase: {"start": MiB allocated as it
    began, "peak": MiB it rose to}}."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.high = torch.cuda.max_memory_allocated(device) if self.cuda else 0
        self.start = torch.cuda.memory_allocated(device) if self.cuda else 0
        self.raised: dict[str, dict[str, float]] = {}

    def end(self, phase: str) -> None:
        """The phase that ends now: noted where the running peak rose during it."""
        if not self.cuda:
            return
        peak = torch.cuda.max_memory_allocated(self.device)
        if peak > self.high:
            self.raised[phase], self.high = {"start": self.start / 2**20, "peak": peak / 2**20}, peak
        self.start = torch.cuda.memory_allocated(self.device)


def highest(*raised: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Several watches' raised phases as one: each phase as it was when it rose highest."""
    out: dict[str, dict[str, float]] = {}
    for phases in raised:
        for phase, rise in phases.items():
            if phase not in out or rise["peak"] > out[phase]["peak"]:
                out[phase] = rise
    return out
