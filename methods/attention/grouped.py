"""One decoded token's attention over grouped key/value heads, without copying them per query head.

With grouped-query attention (Llama-3.1-8B: 32 query heads over 8 key/value heads) and a mask, transformers'
sdpa up to 5.17 (a GPU node's) copies every key and value once per query head (`repeat_kv`), because CUDA's
kernel that takes a mask cannot group heads: decoding over a full memory reads and writes four copies of it per
token (1.7 GB at N_max on the 8B shape). A decoding step has one query per head, so the query heads that share a
key/value head can instead stand as that head's rows: [1, heads, 1, d] -> [1, kv_heads, group, d], each row under
the one mask row every head shares. The same softmax over the same keys, computed on the stored keys and values as
they are. Later transformers releases do the same themselves (`pack_gqa`): there this module stands aside.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from transformers.integrations import sdpa_attention

from methods.attention.tracing import attention_calls

PACKED_BY_TRANSFORMERS = hasattr(sdpa_attention, "pack_gqa")
# Where a model's one-token steps are packed here: CUDA, whose masked kernel cannot group heads. A CPU model keeps
# the model's own path, on which its cached regression answers were made.
PACKING_DEVICES = {"cuda"}


def packs(module, query: torch.Tensor, attention_mask: torch.Tensor | None, kwargs: dict) -> bool:
    """Whether this call is one `packed` computes as transformers' sdpa does: one query per head over grouped
    key/value heads, under one mask row every head shares, with nothing else that sdpa applies (soft-capping,
    attention sinks, a position bias, dropout)."""
    return (getattr(module, "num_key_value_groups", 1) > 1 and query.shape[2] == 1
            and attention_mask is not None and attention_mask.dim() == 4
            and attention_mask.shape[1] == attention_mask.shape[2] == 1
            and all(kwargs.get(name) is None for name in ("softcap", "s_aux", "position_bias"))
            and not kwargs.get("dropout"))


def packed(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor,
           scaling: float | None = None) -> torch.Tensor:
    """The attention output [batch, 1, heads, d] of one query per head, the query heads of a key/value head as
    its rows."""
    batch, heads, _, width = query.shape
    rows = query.reshape(batch, key.shape[1], heads // key.shape[1], width)
    out = torch.nn.functional.scaled_dot_product_attention(rows, key, value, attn_mask=attention_mask, scale=scaling)
    return out.reshape(batch, heads, 1, value.shape[-1]).transpose(1, 2).contiguous()


@contextmanager
def grouped_decoding(model):
    """The model's one-token attention calls computed per key/value head (`packs`) where its transformers copies
    them: a model on sdpa, on a device of PACKING_DEVICES, under a transformers that does not pack them itself.
    Every other call as the model makes it."""
    if PACKED_BY_TRANSFORMERS or model.config._attn_implementation != "sdpa" or \
            model.device.type not in PACKING_DEVICES:
        yield
        return

    def wrap(inner, module, query, key, value, attention_mask, **kwargs):
        if packs(module, query, attention_mask, kwargs):
            return packed(query, key, value, attention_mask, kwargs.get("scaling")), None
        return inner(module, query, key, value, attention_mask, **kwargs)

    with attention_calls(model, wrap):
        yield
