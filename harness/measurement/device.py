"""The device a run measures on: its name, as its maker sells it, and its peak memory. A table's row says which
machine its seconds and gigabytes are of (an H100's and an H200's differ as much as two methods do); `cuda:0` or
`cpu` say only what kind of device it was."""

from __future__ import annotations

import platform
import re
import resource
from pathlib import Path

import torch

MARKS = re.compile(r"\((?:R|TM|tm)\)|\bCPU\b|\bProcessor\b")      # what a CPU's name adds to its model and clock


def device_name(device: torch.device) -> str:
    """A CUDA device's name (`NVIDIA H200`); a CPU's model as the kernel reports it (cpu_model)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        return cpu_model(Path("/proc/cpuinfo").read_text(errors="replace"))
    except OSError:
        return cpu_model("")


def cpu_model(cpuinfo: str) -> str:
    """The first `model name` of /proc/cpuinfo without its trademarks (`Intel Xeon Platinum 8375C @ 2.90GHz`: a
    cloud's virtual CPUs often differ by their clock alone); the machine's architecture where it has none (an Arm
    server's kernel lists parts, not names)."""
    found = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
    name = " ".join(MARKS.sub(" ", found.group(1)).split()) if found else ""
    return name or f"cpu ({platform.machine() or 'unknown'})"


def reset_peak_memory(device: torch.device) -> None:
    """Start counting the CUDA allocator's peak on the model's device afresh (the jobs of a sweep share one
    process)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_mb(device: torch.device) -> dict[str, float]:
    """Process peak RSS (over the whole process: every job it ran so far), and the CUDA allocator's peak on the
    model's device (its first parameter's, one of several under device_map=auto) since reset_peak_memory where it
    is a GPU."""
    measured = {"cpu_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if device.type == "cuda":
        measured["cuda_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    return measured
