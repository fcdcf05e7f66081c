"""From one score per stored fragment (higher: nearer the prompt) to the fragments kept, in the order they are
read (earliest first, the last next to the prompt). Pure functions of the scores."""

from __future__ import annotations

import torch


def defragment(scores: torch.Tensor, k: int | None) -> list[int]:
    """Fragment indices in ascending score, truncated from the front to the last k (None: all): the paper's
    Alg. 1, the best next to the prompt."""
    ascending = torch.argsort(scores, stable=True).tolist()
    return ascending if k is None else ascending[-k:]


def adaptive_k(scores: torch.Tensor, tau: float, k_max: int) -> int:
    """How many of the best to keep: K grows from 1 while the K-th best score is at most tau times the
    (K+1)-th, up to k_max: the authors' released rule (ryehr/MemDefrag's --adaptive_k;
    the paper's Limitations only name the idea). A (K+1)-th score <= 0 ends the growth (no ratio)."""
    best = torch.sort(scores, descending=True, stable=True).values.tolist()
    k = 1
    while k < min(k_max, len(best)) and best[k] > 0 and best[k - 1] / best[k] <= tau:
        k += 1
    return min(k, len(best))


def best_window(scores: torch.Tensor, width: int) -> int:
    """The start of the `width` consecutive fragments (in stored order, wrapping around) with the largest
    summed score; the earliest start on ties. A width beyond the memory is clipped to it."""
    n = len(scores)
    if width >= n:
        return 0                                   # the whole memory, in stored order
    values = scores.cpu().numpy()                  # summed in the scores' own dtype, one after another
    sums = [sum(values[(start + j) % n] for j in range(width)) for start in range(n)]
    return max(range(n), key=lambda start: (sums[start], -start))


def rotated(scores: torch.Tensor, width: int, cut: bool) -> list[int]:
    """The memory rotated cyclically so that its best window ends next to the prompt, the stored order
    otherwise kept; cut: only the window."""
    n = len(scores)
    start, width = best_window(scores, width), min(width, n)
    order = [(start + width + j) % n for j in range(n)]
    return order[n - width:] if cut else order
