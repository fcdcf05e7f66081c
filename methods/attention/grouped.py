"""One decoded token's attention over grouped key/value heads, without copying them per query head.

With grouped-query attention (Llama-3.1-8B: 32 query heads over 8 key/value heads) and a mask, transformers'
sdpa copies every key and value once per query head on CUDA (`repeat_kv`), because the kernel that takes a mask
cannot group heads: decoding over a full memory reads and writes four copies of it per token (1.7 GB at N_max on
the 8B shape). A decoding step has one query per head, so the query heads that share a key/value head can instead
stand as that head's rows: [1, heads, 1, d] -> [1, kv_heads, group, d], each row under the one mask row every
head shares. The same softmax over the same keys, computed on the stored keys and values as they are.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from methods.attention.tracing import attention_calls

COPYING_DEVICES = {"cuda"}     # where transformers' sdpa copies grouped heads under a mask (a CPU groups them)


def copies_heads(module, query: torch.Tensor, attention_mask: torch.Tensor | None, kwargs: dict) -> bool:
    """Whether transformers' sdpa would copy the keys and values of this one-token call per query head (a mask
    every head shares, on a device of COPYING_DEVICES) and the call is one `packed` computes as the model does (no soft-capping, attention
    sinks or position bias)."""
    groups = getattr(module, "num_key_value_groups", 1)
    return (groups > 1 and query.shape[2] == 1 and query.device.type in COPYING_DEVICES and attention_mask is not None
            and attention_mask.dim() == 4 and attention_mask.shape[1] == 1
            and all(kwargs.get(name) is None for name in ("softcap", "s_aux", "position_bias")))


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
    """The model's one-token attention calls computed per key/value head where transformers' sdpa would copy them
    (`copies_heads`); every other call as the model makes it, and every call of a model on another attention
    implementation (eager's softmax is not sdpa's kernel)."""
    if model.config._attn_implementation != "sdpa":
        yield
        return

    def wrap(inner, module, query, key, value, attention_mask, **kwargs):
        if copies_heads(module, query, attention_mask, kwargs):
            return packed(query, key, value, attention_mask, kwargs.get("scaling")), None
        return inner(module, query, key, value, attention_mask, **kwargs)

    with attention_calls(model, wrap):
        yield
