"""APE's attention (Adaptive Parallel Encoding, Yang et al., ICLR 2025) for the queries after a memory read in
parallel: every fragment at the same positions behind one shared prefix (the shared sink).

A query's keys fall in two blocks: the fragments' tokens (the context) and the rest (the shared prefix and
the query's own tokens). Each block gets its own softmax, the context's over logits divided by a temperature
T; the blocks are merged by their log-sum-exp, the context's taken S*T times (the authors' merge). With
T = S = 1 this is the model's own attention, computed in two blocks.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from methods.attention.tracing import attended, attention_calls, masked_scores


def merged_probabilities(scores: torch.Tensor, context: tuple[int, int], temperature: float, scale: float,
                         sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Probabilities [1, heads, q, kv] from masked logits `scores` (fp32): keys context[0]..context[1]-1 form
    the context block. sinks: [heads] logits that join the rest's softmax and keep their share."""
    start, end = context
    inside = torch.zeros(scores.shape[-1], dtype=torch.bool, device=scores.device)
    inside[start:end] = True
    rest = scores.masked_fill(inside, float("-inf"))
    if sinks is not None:
        rest = torch.cat([rest, sinks.float().view(1, -1, 1, 1).expand(*rest.shape[:3], 1)], dim=-1)
    ctx = scores.masked_fill(~inside, float("-inf")) / temperature
    rest_lse, ctx_lse = torch.logsumexp(rest, dim=-1, keepdim=True), torch.logsumexp(ctx, dim=-1, keepdim=True)
    block = scale * temperature * ctx_lse
    total = torch.logaddexp(rest_lse, block)
    seen = ctx_lse.nan_to_num(neginf=0.0)            # a row that sees no fragment token: its block weighs 0
    return torch.exp(rest[..., : scores.shape[-1]] - total) + torch.exp(ctx - seen + block - total)


@contextmanager
def parallel_attention(model, context: tuple[int, int], temperature: float, scale: float):
    """Every attention call of the model (prefill and decoding) merged as APE does, the cache's positions
    context[0]..context[1]-1 being the fragments' tokens."""
    def merged(inner, module, query, key, value, attention_mask, scaling=None, softcap=None, s_aux=None, **_):
        scores = masked_scores(query, key, attention_mask, scaling, softcap)
        return attended(merged_probabilities(scores, context, temperature, scale, s_aux), value), None

    with attention_calls(model, merged, bakes=("parallel", context, temperature, scale)):
        yield
