"""Which phase set a run's peak device memory, and from how much. The CUDA allocator's running peak is read at the
end of each timed phase (a question's plan, prefill and decoding; a store's compression, formation and
forgetting), and a phase that raised it is noted with the memory allocated as it began and the peak it rose to, so
a run's records say where its tab:gpu-memory figure was reached and how much of it the phase itself added. The
peak is never reset here: a caller's own measure (the runner's job peak, the bench's per question) stands. Only
the device of the model's first parameter is read (one of several under device_map=auto). Off a GPU nothing is
noted: a process's peak RSS spans every job it ran, and a CPU's records stay as the regression cache holds them."""

from __future__ import annotations

import torch


class PeakWatch:
    """The phases, in order, during which the allocator's running peak rose: {phase: {"start": MiB allocated as it
    began, "peak": MiB it rose to}}."""

    def __init__(self, device: torch.device):
        self.device, self.cuda = device, device.type == "cuda"
        self.high, self.start = self.allocated() if self.cuda else (0, 0)
        self.raised: dict[str, dict[str, float]] = {}

    def allocated(self) -> tuple[int, int]:
        """The allocator's running peak and what it holds now, in bytes, from one read of its statistics."""
        stats = torch.cuda.memory_stats(self.device)
        return stats.get("allocated_bytes.all.peak", 0), stats.get("allocated_bytes.all.current", 0)

    def end(self, phase: str) -> None:
        """The phase that ends now: noted where the running peak rose during it."""
        if not self.cuda:
            return
        peak, now = self.allocated()
        if peak > self.high:
            self.raised[phase], self.high = {"start": self.start / 2**20, "peak": peak / 2**20}, peak
        self.start = now
