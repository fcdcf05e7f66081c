"""A question's attention on CUDA over grouped key/value heads without copying them per query head, and its
decoding steps' attention spread over the device.

With grouped-query attention (Llama-3.1-8B: 32 query heads over 8 key/value heads) and a mask, transformers' sdpa on
CUDA copies every key and value once per query head (`repeat_kv`), because CUDA's kernel that takes a mask cannot
group heads. A question reads under a mask: its trace runs the prompt over the placed memory (a copy of 0.21 GB per
layer at N_max on the 8B shape) and its captured decoding step reads a fixed-size cache (four copies of the read per
token under transformers 5.17, a GPU node's; 5.24 packs one-token queries itself). Instead the query heads that
share a key/value head stand as that head's rows, [b, heads, q, d] -> [b, kv_heads, group·q, d], each under its
query's mask row: the same softmax over the same keys, on the stored keys and values as they are. A mask of more
than one row is repeated per group, so a call is packed only where that repeat is smaller than the copies it saves
(a prompt of up to 2,730 tokens on the 8B shape in bf16).

A decoding step (one query token) is computed as two matrix products with a float32 softmax between them, not by
sdpa: CUDA's kernel that takes a mask runs one block per head and tile of query rows, so the 8B shape's step over
a read of 12,958 positions runs on 8 of an H100's 132 multiprocessors, each streaming 6.6 MB of keys and values a
layer (~0.25 ms a layer, about the 8 ms a token vanilla took beyond none on the H200), while cuBLAS spreads the
same products over the device, grouped heads or not. The scores are float32 (cuBLAS accumulates the bf16 products
in float32 and returns them so) and the weights meet the values in their dtype, as flash attention does.

A read is split along its keys, in chunks of KEY_CHUNK positions (flash-decoding's split): on the H200 the
weights' product with the values over 12,958 positions, a [4 x 12,958] by [12,958 x 128] product per key/value
head, ran as 64 blocks at 0.22 TB/s (119 µs a layer) and inductor's softmax as one program per row (57 µs), where
reading the keys and values once takes ~14 µs (results/gpu/README.md, the fourth run). Each chunk's scores, their
exponentials under the read's one maximum, and its part of the product are computed for every chunk at once, and
the parts summed in float32: the same softmax, every chunk a block of its own. The read's buffers are sized in
whole chunks on the devices that pack (`in_chunks`), so the split of those contiguous buffers is a view, not a
copy.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from methods.attention.tracing import attention_calls

# Where a question's attention is packed: CUDA, whose masked kernel cannot group heads. A CPU model keeps the
# model's own path, on which its cached regression answers were made (harness/models/loading.py has transformers'
# sdpa group heads there).
PACKING_DEVICES = {"cuda"}


def packs(module, query: torch.Tensor, key: torch.Tensor, attention_mask: torch.Tensor | None, kwargs: dict) -> bool:
    """Whether `packed` computes this call as transformers' sdpa does, in less memory or on more of the device:
    grouped key/value heads or a one-token query, on a device of PACKING_DEVICES, a mask every head shares,
    nothing else sdpa applies (soft-capping, attention sinks, a position bias, dropout), and the mask repeated per
    group (beyond one query row; a boolean one made additive in the query's dtype) smaller than the keys and values
    repeat_kv copies for every query head."""
    if (getattr(module, "num_key_value_groups", 1) < 2 and query.shape[2] > 1) \
            or query.device.type not in PACKING_DEVICES or key.shape[0] != query.shape[0] \
            or attention_mask is None or attention_mask.dim() != 4 or attention_mask.shape[1] != 1 \
            or attention_mask.shape[2] not in (1, query.shape[2]) \
            or any(kwargs.get(name) is not None for name in ("softcap", "s_aux", "position_bias")) \
            or kwargs.get("dropout"):
        return False
    heads, q_len, kv_heads, width = query.shape[1], query.shape[2], key.shape[1], key.shape[3]
    entry = query.element_size() if attention_mask.dtype == torch.bool else attention_mask.element_size()
    more_rows = 0 if attention_mask.shape[2] == 1 else (heads // kv_heads - 1) * q_len * entry
    return more_rows < 2 * heads * width * key.element_size()        # both per key position


def packed(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor,
           scaling: float | None = None) -> torch.Tensor:
    """The attention output [batch, q_len, heads, d], the query heads of a key/value head as its rows."""
    batch, heads, q_len, width = query.shape
    kv_heads, kv_len = key.shape[1], key.shape[2]
    group = heads // kv_heads
    rows = query.reshape(batch, kv_heads, group * q_len, width)
    if attention_mask.shape[2] > 1:     # row g·q_len + t is query t of head g of the group: query t's mask row
        repeated = attention_mask.unsqueeze(2).expand(-1, -1, group, -1, -1)
        if repeated.dtype == torch.bool:  # made additive once, in the query's dtype, as sdpa would convert it
            repeated = torch.where(repeated, query.new_zeros(()), query.new_full((), float("-inf")))
        attention_mask = repeated.reshape(attention_mask.shape[0], 1, group * q_len, kv_len)
    attend = stepped if q_len == 1 else torch.nn.functional.scaled_dot_product_attention
    out = attend(rows, key, value, attn_mask=attention_mask, scale=scaling)
    return out.reshape(batch, heads, q_len, value.shape[-1]).transpose(1, 2).contiguous()


KEY_CHUNK = 256        # key positions per chunk of a split decoding step


def in_chunks(positions: int, device: torch.device) -> int:
    """Room for `positions` in a read's buffers: whole chunks on a device that packs, so that its steps split them
    without a copy; as asked elsewhere (a CPU keeps its reads as they were, the eager loop its regression answers)."""
    return -(-positions // KEY_CHUNK) * KEY_CHUNK if device.type in PACKING_DEVICES else positions


def stepped(rows: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor,
            scale: float | None = None) -> torch.Tensor:
    """sdpa's attention [batch, kv_heads, rows, d] for a decoding step's few rows per key/value head, as two
    batched matrix products: the scores in float32, softmax'd under the mask, the weights in the values' dtype;
    split along the keys where the read is whole chunks (every read `fixed` sizes on a packing device: one branch,
    so a compiled step compiles once) and the mask one row (a step's). Every row sees at least one key (a step sees
    its own position): a row masked whole would be NaN, not sdpa's 0."""
    batch, kv_heads, n_rows, width = rows.shape
    split = key.shape[2] % KEY_CHUNK == 0 and attn_mask.shape[2] == 1
    chunks, length = (key.shape[2] // KEY_CHUNK, KEY_CHUNK) if split else (1, key.shape[2])
    matrices = batch * kv_heads * chunks
    queries = rows.unsqueeze(2).expand(-1, -1, chunks, -1, -1).reshape(matrices, n_rows, width)
    scores = float32_products(queries, key.reshape(matrices, length, width).mT)
    scores = scores.view(batch, kv_heads, chunks, n_rows, length) * (width ** -0.5 if scale is None else scale)
    mask = attn_mask.reshape(attn_mask.shape[0], 1, attn_mask.shape[2], chunks, length).transpose(2, 3)
    scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    if not split:
        weights = scores.softmax(dim=-1).to(value.dtype)
        return torch.bmm(weights.view(matrices, n_rows, length), value.reshape(matrices, length, -1)).view(
            batch, kv_heads, n_rows, -1)
    top = scores.amax(dim=-1, keepdim=True).amax(dim=2, keepdim=True)        # the read's maximum, per row
    weights = (scores - top).exp()
    parts = float32_products(weights.to(value.dtype).view(matrices, n_rows, length),
                             value.reshape(matrices, length, -1))
    out = parts.view(batch, kv_heads, chunks, n_rows, -1).sum(dim=2) / weights.sum(dim=(2, 4)).unsqueeze(-1)
    return out.to(value.dtype)


# Whether this torch's bmm returns float32 products of half-precision inputs (on CUDA; torch.bmm's out_dtype).
BMM_OUT_DTYPE = "dtype" in torch.ops.aten.bmm.overloads()


def float32_products(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b (batched) in float32: on CUDA half-precision inputs stay as they are where torch can (cuBLAS
    accumulates their products in float32 and returns them so), elsewhere they are made float32 (no copy where
    they are)."""
    if BMM_OUT_DTYPE and a.is_cuda and a.dtype in (torch.float16, torch.bfloat16):
        return torch.bmm(a, b, out_dtype=torch.float32)
    return torch.bmm(a.float(), b.float())


@contextmanager
def grouped_attention(model):
    """The model's attention calls computed per key/value head where `packs` says so: a model on sdpa, on a
    device of PACKING_DEVICES. Every other call as the model makes it; attention changed inside (a trace, a
    recomputation) wraps this one."""
    if model.config._attn_implementation != "sdpa" or model.device.type not in PACKING_DEVICES:   # nothing to pack
        yield
        return

    def wrap(inner, module, query, key, value, attention_mask, **kwargs):
        if packs(module, query, key, attention_mask, kwargs):
            return packed(query, key, value, attention_mask, kwargs.get("scaling")), None
        return inner(module, query, key, value, attention_mask, **kwargs)

    with attention_calls(model, wrap, bakes="grouped"):     # its choices follow the call's shapes alone
        yield
