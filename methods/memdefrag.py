"""MemDefrag (paper Sec. 4.1, Alg. 1): rank fragments by attention density at a tracer layer,
reorder them densest-nearest-the-prompt, keep the Top-K: one combination of the selection axis."""

from __future__ import annotations

from methods.attention.tracing import QueryMode
from methods.selection.selection import Selection


class MemDefrag(Selection):
    """k: an integer >= 1, or 'all' (reorder only); tracer_layer: 0-based decoder index;
    query_mode: 'last' or 'mean' prompt tokens (None for either: the model has none recorded)."""

    def __init__(self, k: int | str = 2, tracer_layer: int | None = 0, query_mode: QueryMode | None = "last"):
        if k != "all" and (not isinstance(k, int) or isinstance(k, bool) or k <= 0):
            raise ValueError(f"method.k={k!r} is not allowed: use an integer >= 1 or 'all'")
        super().__init__(ranker="density", size="all" if k == "all" else "topk", k=1 if k == "all" else k,
                         arrangement="best_last", reading="latent", tracer_layer=tracer_layer,
                         query_mode=query_mode)
