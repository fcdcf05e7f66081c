"""What a decoder is made of, found from the model itself rather than one attribute path: its stack of
blocks, each block's attention, and (from the config alone, before any weights load) what each layer
keeps per token.

A latent memory keeps per-token keys and values (or layer inputs) of fragments formed alone and reads
them concatenated. A layer that carries a recurrent or convolutional state (linear attention, state-space,
short convolutions), compressed blocks, or an indexer's keys beside its own has no per-token state the store
can concatenate: such decoders are refused, on every backend, with what the layer keeps.
Which state a layer keeps is read from transformers' own per-layer cache types.
"""

from __future__ import annotations

import functools
import inspect
from contextlib import contextmanager

import torch
from transformers import MODEL_FOR_CAUSAL_LM_MAPPING
from transformers.cache_utils import (DYNAMIC_LAYER_TYPE_MAPPING, DynamicLayer, DynamicSlidingWindowLayer,
                                      get_layer_types_and_kwargs)

PER_TOKEN = (DynamicLayer, DynamicSlidingWindowLayer)    # cache layers that hold one key and value per token
SHARED = "dummy"                                         # transformers' type of a layer that reads another's cache


class DecoderError(ValueError):
    """A decoder whose layers cannot be latent memory (or whose stack cannot be found)."""


def cache_keyword(module) -> str:
    """The keyword a model's (or decoder's) forward takes its key/value cache by: `cache` in transformers that
    renamed it, `past_key_values` before (5.0 up to the rename; the old name warns from 5.24, goes in 5.40)."""
    return _cache_keyword_of(type(module))


@functools.cache
def _cache_keyword_of(model_class) -> str:
    """Read once per class: every prefill and decoding step asks."""
    return "cache" if "cache" in cache_keywords(model_class) else "past_key_values"


def cache_keywords(model_class) -> set[str]:
    """The key/value cache keywords a model class's forward takes (none: it keeps no cache, RWKV say)."""
    return {"cache", "past_key_values"} & set(inspect.signature(model_class.forward).parameters)


def num_layers(config) -> int:
    """How many decoder layers a model's config declares (its text decoder's, for a multimodal config)."""
    return config.get_text_config().num_hidden_layers


def layer_types(config) -> list[str]:
    """Each decoder layer's cache type as transformers assigns it (full/sliding/chunked attention,
    linear_attention, conv, hybrid, dummy for a layer reading another layer's keys and values)."""
    try:
        return get_layer_types_and_kwargs(config.get_text_config(decoder=True))[0]
    except (ValueError, AttributeError, TypeError, KeyError) as err:
        raise DecoderError(f"model type {config.model_type!r}: its config's layer types cannot be read "
                           f"({str(err).splitlines()[0] if str(err) else type(err).__name__})") from None


def kept(layer_type: str) -> str:
    """What a layer of this cache type keeps instead of one key and value per token, in words (from the cache
    class transformers maps it to; a family's own cache class registers itself when its code is imported)."""
    cache = DYNAMIC_LAYER_TYPE_MAPPING.get(layer_type)
    if "index" in layer_type:                       # DeepSeek-V3.2's sparse attention and its kin
        return "per-token keys plus a sparse-attention indexer's own keys, which the store does not keep yet"
    if cache is not None and any("LinearAttention" in kind.__name__ for kind in cache.__mro__):
        return "a recurrent or convolutional state, not per-token keys and values"
    return "a cache of its own kind (e.g. compressed blocks of tokens), not one key and value per token"


def check(config) -> None:
    """Before any weights load: the model takes a key/value cache, and every layer keeps per-token keys and values
    (or reads another's)."""
    model_class = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(config), None)
    if model_class is not None and not cache_keywords(model_class):
        raise DecoderError(
            f"model type {config.model_type!r} has layers that latent memory cannot hold: its forward takes no "
            f"key/value cache (neither `cache` nor `past_key_values`), so there are no per-token keys and values "
            f"to store and concatenate (RWKV keeps a recurrent state instead), and neither backend can run it; "
            f"decoders whose layers are all attention run (Llama, Qwen, Mistral, Gemma, ...)")
    types = layer_types(config)
    stateful = sorted({t for t in types if t != SHARED and not (
        DYNAMIC_LAYER_TYPE_MAPPING.get(t) in PER_TOKEN)})
    if stateful:
        what = "; ".join(f"{t} (layers {_ranges([i for i, x in enumerate(types) if x == t])}) keeps {kept(t)}"
                         for t in stateful)
        raise DecoderError(
            f"model type {config.model_type!r} has layers that latent memory cannot hold: {what}. A fragment's "
            f"state must be stored and concatenated with another's, so neither backend can run it; decoders "
            f"whose layers are all attention run (Llama, Qwen, Mistral, Gemma, ...)")


def shared_layers(config) -> list[int]:
    """Layers that read another layer's keys and values instead of computing their own."""
    return [i for i, t in enumerate(layer_types(config)) if t == SHARED]


def _ranges(indices: list[int]) -> str:
    """'0-2, 5' for [0, 1, 2, 5]."""
    out, start = [], None
    for i, index in enumerate(indices):
        start = index if start is None else start
        if i + 1 == len(indices) or indices[i + 1] != index + 1:
            out.append(f"{start}" if start == index else f"{start}-{index}")
            start = None
    return ", ".join(out)


def layers(model) -> torch.nn.ModuleList:
    """The decoder's stack of blocks: the outermost list of `num_hidden_layers` modules in it (`.layers`,
    Falcon's `.h`; lists inside a block, such as experts, come after it)."""
    decoder, count = model.get_decoder(), model.config.get_text_config().num_hidden_layers
    for module in decoder.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == count:
            return module
    raise DecoderError(f"model type {model.config.model_type!r}: the decoder its get_decoder() returns "
                       f"({type(decoder).__name__}) holds no list of its {count} layers, so its stack of blocks "
                       f"cannot be found")


def attention(layer) -> torch.nn.Module:
    """A decoder block's attention: its one child module of an attention class (`self_attn`, Falcon's
    `self_attention`)."""
    found = [m for m in layer.children() if type(m).__name__.endswith("Attention")]
    if len(found) != 1:
        raise DecoderError(f"{type(layer).__name__} has {len(found)} attention modules, expected one "
                           f"({', '.join(type(m).__name__ for m in layer.children())})")
    return found[0]


def attentions(model) -> list[torch.nn.Module]:
    """Every decoder layer's attention, in order."""
    return [attention(layer) for layer in layers(model)]


def embeddings(model) -> torch.nn.Module:
    """The token embeddings the decoder reads."""
    return model.get_input_embeddings()


@contextmanager
def hooked(modules: list[torch.nn.Module], make_hook, before: bool = True, only: list[int] | None = None):
    """Hook make_hook(index) on modules[index] (every index, or those in `only`) for the forwards run inside,
    always removed: before its forward (hook(module, args, kwargs), may return new (args, kwargs)) or after
    it (hook(module, args, output)). The one way this project hooks a model."""
    indices = range(len(modules)) if only is None else only
    handles = [modules[i].register_forward_pre_hook(make_hook(i), with_kwargs=True) if before
               else modules[i].register_forward_hook(make_hook(i)) for i in indices]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
