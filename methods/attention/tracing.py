"""Attention density (paper Eq. 2, App. B): how much the prompt attends to each fragment.

The prompt-to-sequence attention rows are taken from inside the model's own
attention call, so every family's details (biases, QK-norm, logit soft-capping,
sliding windows, query scaling) are exactly the model's. Only the |p| x S rows
of the prompt are built, never an S x S matrix, and the forward stops after the
last layer asked for.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from enum import StrEnum

import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from methods.attention.decoder import DecoderError, attentions, hooked
from methods.errors import one_of

QueryMode = StrEnum("QueryMode", ["last", "mean"])   # the prompt tokens a density is read from


class StopForward(Exception):
    """Raised inside the forward once every traced layer has been seen."""


def masked_scores(query, key, attention_mask, scaling=None, softcap=None) -> torch.Tensor:
    """The attention logits [1, heads, q_len, kv_len] (fp32) as the layer computes them, -inf where masked.

    query: [1, heads, q_len, d]; key: [1, kv_heads, kv_len, d]; the queries are the last q_len
    positions of the kv_len keys. Query heads are grouped onto their key/value head, so keys are
    never repeated per head. The product is taken in fp32 (q and k cast first), so densities and APE's merge
    read logits unrounded by a half-precision model's dtype."""
    _, heads, q_len, dim = query.shape
    kv_heads, kv_len = key.shape[1], key.shape[2]
    grouped = query.float().reshape(1, kv_heads, heads // kv_heads * q_len, dim)
    scores = torch.matmul(grouped, key.float().transpose(2, 3)).view(1, heads, q_len, kv_len)
    scores = scores * (scaling or dim ** -0.5)
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    if attention_mask is None:                          # causal: only the prompt's own keys are masked
        blocked = torch.ones(q_len, q_len, dtype=torch.bool, device=query.device).triu(1)
        scores[..., kv_len - q_len:].masked_fill_(blocked, float("-inf"))
    elif attention_mask.dtype == torch.bool:
        scores.masked_fill_(attention_mask[..., -kv_len:].logical_not(), float("-inf"))
    else:
        scores += attention_mask[..., -kv_len:].float()
    return scores


def prompt_probabilities(query, key, attention_mask, scaling=None, softcap=None, sinks=None) -> torch.Tensor:
    """The prompt's attention probabilities [1, heads, q_len, kv_len] (fp32), as the layer computes them
    (see `masked_scores`). sinks: [heads] learned logits that join every row's softmax and take their share
    of it (GPT-OSS's attention sinks, passed to attention functions as `s_aux`); the rows then sum to less
    than one, as the model's own do."""
    scores = masked_scores(query, key, attention_mask, scaling, softcap)
    if sinks is None:
        return torch.softmax(scores, dim=-1)
    _, heads, q_len, _ = scores.shape
    column = sinks.float().view(1, heads, 1, 1).expand(1, heads, q_len, 1)
    return torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]


def attended(probs: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """The attention output [1, q_len, heads, d] of probabilities [1, heads, q_len, kv_len] over
    value [1, kv_heads, kv_len, d], as the model's attention function returns it."""
    _, heads, q_len, kv_len = probs.shape
    kv_heads, dim = value.shape[1], value.shape[-1]
    out = torch.matmul(probs.to(value.dtype).view(1, kv_heads, -1, kv_len), value)
    return out.view(1, heads, q_len, dim).transpose(1, 2).contiguous()


def prompt_attention(module, query, key, value, attention_mask, scaling=None, softcap=None, s_aux=None, **_):
    """The layer's attention output ([1, q_len, heads, d], None), as its attention function returns it,
    and its head-averaged attention rows [q_len, kv_len] (fp32), from one set of probabilities."""
    probs = prompt_probabilities(query, key, attention_mask, scaling, softcap, s_aux)
    return attended(probs, value), None, probs.mean(dim=1)[0]


def through_attention_functions(model_class: type) -> bool:
    """Whether the family's attention calls transformers' attention functions (then a trace computes only
    the prompt's rows inside them); transformers' own test of the same, for families such as Falcon that
    compute attention inline and return their weights only when asked (`output_attentions=True`)."""
    can_set = getattr(model_class, "_can_set_attn_implementation", None)
    return can_set is None or bool(can_set())


@contextmanager
def eager_attention(model):
    """The model on eager attention, so its attention modules return their weights (and masks are built for
    it); a family computing attention inline reads the setting itself and cannot be switched by transformers."""
    previous = model.config._attn_implementation
    _use_attention(model, "eager")
    try:
        yield
    finally:
        _use_attention(model, previous)


def _use_attention(model, implementation: str) -> None:
    if through_attention_functions(type(model)):
        model.set_attn_implementation(implementation)
    else:
        model.config._attn_implementation = implementation


@contextmanager
def returned_weights(model, layers: list[int], prompt_len: int):
    """Record the head-averaged rows of the last `prompt_len` queries from the attention weights
    [1, heads, q_len, kv_len] that the attention modules of `layers` return (the caller makes them
    return weights); the forward raises StopForward after the last of them."""
    rows: dict[int, torch.Tensor] = {}
    last = max(layers)

    def make_hook(index):
        def hook(module, args, output):
            weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
            if not torch.is_tensor(weights):
                raise DecoderError(f"model type {model.config.model_type!r}: layer {index}'s attention returned no "
                                   f"weights under eager attention, so its rows cannot be traced")
            rows[index] = weights[0, :, -prompt_len:].float().mean(dim=0)
            if index == last:
                raise StopForward
        return hook

    with hooked(attentions(model), make_hook, before=False, only=layers):
        yield rows


def prompt_mask(attention_mask, prompt_len: int):
    """The mask's rows [..., prompt_len, kv_len] of the last `prompt_len` queries (a 4-d mask has one row per
    query; None, the causal mask, stays None)."""
    if attention_mask is None or attention_mask.dim() < 4:
        return attention_mask
    return attention_mask[..., -prompt_len:, :]


@contextmanager
def recording_attention(model, layers: list[int], prompt_len: int):
    """Record the head-averaged attention rows of the last `prompt_len` queries (the prompt's) at `layers`
    (decoder indices) during a forward, in O(prompt x keys) memory however many queries run before them (the
    hidden-prefix formulation runs the memory's too). Where only the prompt runs, a traced layer's output comes
    from the same probabilities (`prompt_attention`); where more run, from the model's own attention function.
    A family that computes attention inline is traced from its own eager attention, whose weights it returns.

    Yields a dict layer -> [q_len, kv_len]; the forward raises StopForward after
    the last of them, so the caller runs it inside `until_stopped`.
    """
    if not through_attention_functions(type(model)):
        with eager_attention(model), returned_weights(model, layers, prompt_len) as rows:
            yield rows
        return
    rows: dict[int, torch.Tensor] = {}
    wanted, last = set(layers), max(layers)

    def traced(inner, module, query, key, value, attention_mask, **kwargs):
        idx = module.layer_idx
        if idx not in wanted:
            return inner(module, query, key, value, attention_mask, **kwargs)
        probs = prompt_probabilities(query[:, :, -prompt_len:], key, prompt_mask(attention_mask, prompt_len),
                                     kwargs.get("scaling"), kwargs.get("softcap"), kwargs.get("s_aux"))
        rows[idx] = probs.mean(dim=1)[0]
        if idx == last:
            raise StopForward                           # nothing reads this layer's output
        if query.shape[2] == prompt_len:
            return attended(probs, value), None
        return inner(module, query, key, value, attention_mask, **kwargs)   # the memory's rows: not recorded

    with attention_calls(model, traced):
        yield rows
    missing = sorted(wanted - rows.keys())
    if missing:
        raise DecoderError(f"model type {model.config.model_type!r}: layers {missing} computed their attention "
                           f"without an attention function the harness can watch, so their rows cannot be traced")


# per attention implementation, what each wrap installed now fixes in a step a CUDA graph captures (`attention_calls`)
BAKES: dict[str, list] = {}


@contextmanager
def attention_calls(model, wrap, bakes=None):
    """Every attention-function call of the model's layers goes through
    wrap(inner, module, query, key, value, attention_mask, **kwargs), `inner` being the function the model
    would have called: the wrap already around it (so that wraps nest), else the model's own; the one way this
    project changes how attention is computed (tracing, recomputation, parallel reading, grouped heads). Families
    computing attention inline (see `through_attention_functions`) are not reached. bakes: the plain Python values
    the wrap computes with (its name first), which a captured decoding step keeps as they were at its capture;
    None where they are not stated, and no graph captured under the wrap is replayed for another read (`baked`)."""
    hash(bakes)                                 # a graph's layout is a dictionary key: refused here, not on a GPU
    impl = model.config._attn_implementation
    had_local = impl in ALL_ATTENTION_FUNCTIONS._local_mapping
    previous = ALL_ATTENTION_FUNCTIONS._local_mapping.get(impl)

    def wrapped(module, *args, **kwargs):
        return wrap(previous if had_local else _inner(impl, module), module, *args, **kwargs)

    ALL_ATTENTION_FUNCTIONS[impl] = wrapped
    stated = BAKES.setdefault(impl, [])
    stated.append(bakes)
    try:
        yield
    finally:
        stated.pop()
        if had_local:
            ALL_ATTENTION_FUNCTIONS[impl] = previous
        else:
            del ALL_ATTENTION_FUNCTIONS[impl]


def baked(model) -> tuple | None:
    """What the wraps around the model's attention calls now fix in a captured step, outermost last; None where
    one does not say."""
    stated = tuple(BAKES.get(model.config._attn_implementation, ()))
    return None if None in stated else stated


def _inner(impl: str, module):
    """The attention function the model calls where no wrap is installed."""
    if impl in ALL_ATTENTION_FUNCTIONS._global_mapping:
        return ALL_ATTENTION_FUNCTIONS._global_mapping[impl]
    return sys.modules[type(module).__module__].eager_attention_forward


def until_stopped(fn, *args, **kwargs) -> None:
    try:
        fn(*args, **kwargs)
    except StopForward:
        pass


def densities(rows: torch.Tensor, spans: list[tuple[int, int]], query_mode: str) -> torch.Tensor:
    """Eq. 2: per-fragment mean attention, from rows [p, S] of one layer.

    spans: [start, end) memory positions per fragment (the sink at 0 is excluded).
    query_mode: 'last' (the prompt's last token) or 'mean' (all prompt tokens, App. B.2).
    """
    one_of("query_mode", query_mode, QueryMode)
    a = rows[-1] if query_mode == "last" else rows.mean(dim=0)
    return torch.stack([a[s:e].mean() if e > s else a.new_zeros(()) for s, e in spans])   # empty: none


def ranks(values: torch.Tensor) -> torch.Tensor:
    """1-based rank of each fragment, densest first (ties keep the earlier fragment first)."""
    order = torch.argsort(-values, stable=True)
    out = torch.empty_like(order)
    out[order] = torch.arange(1, len(values) + 1, device=values.device)
    return out
