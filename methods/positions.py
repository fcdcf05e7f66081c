"""Rotary positions as each model applies them, given at query time to keys stored without them.

No layout is assumed. A short probe forward watches the function every Hugging Face RoPE
family calls inside its attention (`apply_rotary_pos_emb` of its modeling module) and learns,
per layer: which rotary table it was given (matched against the decoder's rotary embeddings,
once per layer type where a family has several, e.g. Gemma-3's sliding and global layers), how
many leading key dims it rotates (partial rotary done outside the function, e.g. StableLM), and
which axis holds the heads. Stored keys are what that function received (the unrotated rest of
the head appended); they get positions by the same function, with tables for the new positions.
"""

from __future__ import annotations

import inspect
import sys
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from transformers import DynamicCache

ROTARY_FUNCTION = "apply_rotary_pos_emb"
PROBE_TOKENS = 8


class RotaryError(ValueError):
    """The model's positions are not rotary ones this project can re-place (fast backend unusable)."""


def decoder_of(model):
    """The stack of decoder layers, rotary embedding and embeddings of a causal LM."""
    return model.get_decoder()


def modeling_module(model):
    """The module that defines the model's attention (and its rotary function)."""
    return sys.modules[type(decoder_of(model).layers[0].self_attn).__module__]


def has_rotary_function(model_class) -> bool:
    """Whether a model class's family applies rotary positions through the function we watch."""
    return hasattr(sys.modules[model_class.__module__], ROTARY_FUNCTION)


@dataclass
class RotaryCall:
    """One call of the rotary function on a key: the key as given, its tables, and the result."""

    key: torch.Tensor           # [1, kv_heads, T, rot] or [1, T, kv_heads, rot] (heads_axis 2)
    cos: torch.Tensor
    sin: torch.Tensor
    heads_axis: int
    rotated: torch.Tensor


@contextmanager
def watching_rotary(model):
    """Record every call of the model's rotary function during a forward, in layer order."""
    module = modeling_module(model)
    original = getattr(module, ROTARY_FUNCTION, None)
    if original is None:
        raise RotaryError(f"model type {model.config.model_type!r} has no rotary positions")
    signature = inspect.signature(original)
    calls: list[RotaryCall] = []

    def watched(q, k, cos, sin, *args, **kwargs):
        q_out, k_out = original(q, k, cos, sin, *args, **kwargs)
        given = signature.bind(q, k, cos, sin, *args, **kwargs)
        given.apply_defaults()
        axis = given.arguments.get("unsqueeze_dim", 1)      # the axis cos/sin gain: the heads'
        calls.append(RotaryCall(k.detach(), cos.detach(), sin.detach(), axis, k_out.detach()))
        return q_out, k_out

    setattr(module, ROTARY_FUNCTION, watched)
    try:
        yield calls
    finally:
        setattr(module, ROTARY_FUNCTION, original)


def _candidates(model) -> list:
    """Every rotary table the decoder can make: (x, position_ids) -> (cos, sin), one per layer type
    where an embedding takes one."""
    found, config = [], model.config.get_text_config()
    for module in dict.fromkeys(m for m in decoder_of(model).modules() if "Rotary" in type(m).__name__):
        if "layer_type" in inspect.signature(module.forward).parameters:
            for layer_type in dict.fromkeys(getattr(config, "layer_types", None) or []):
                found.append(lambda x, p, m=module, t=layer_type: m(x, p, layer_type=t))
        else:
            found.append(module)
    return found


class Rotary:
    """How a model gives keys their positions: per layer, the table it uses and the rotated width."""

    def __init__(self, model):
        self.model, self.apply = model, getattr(modeling_module(model), ROTARY_FUNCTION, None)
        self.candidates = _candidates(model)
        self.table_of, self.rot_dims = self._learn()

    @classmethod
    def of(cls, model) -> "Rotary":
        """The model's Rotary, learned once and kept on the model."""
        if getattr(model, "_memdefrag_rotary", None) is None:
            model._memdefrag_rotary = cls(model)
        return model._memdefrag_rotary

    @torch.no_grad()
    def _learn(self) -> tuple[list[int], list[int]]:
        n_layers = len(decoder_of(self.model).layers)
        ids = torch.arange(3, 3 + PROBE_TOKENS, device=self.model.device).view(1, -1)
        cache = DynamicCache()
        with watching_rotary(self.model) as calls:
            self.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        kind = self.model.config.model_type
        if len(calls) != n_layers:
            raise RotaryError(f"model type {kind!r} applies rotary positions {len(calls)} times in "
                              f"{n_layers} layers; the fast backend needs exactly one per layer")
        positions = torch.arange(PROBE_TOKENS, device=self.model.device).view(1, -1)
        tables = [c(calls[0].cos.new_zeros(1), positions) for c in self.candidates]
        table_of, rot_dims = [], []
        for layer, call in enumerate(calls):
            match = [i for i, (cos, sin) in enumerate(tables)
                     if cos.shape == call.cos.shape and torch.equal(cos, call.cos) and torch.equal(sin, call.sin)]
            rotated = self.heads_first(call.rotated, call.heads_axis)
            stored = cache.layers[layer].keys[0]
            if not match or not torch.equal(stored[..., : rotated.shape[-1]], rotated):
                raise RotaryError(f"model type {kind!r}: layer {layer}'s rotary positions could not be traced to "
                                  f"the decoder's rotary embedding and the keys it caches")
            table_of.append(match[0])
            rot_dims.append(rotated.shape[-1])
        return table_of, rot_dims

    @staticmethod
    def heads_first(key: torch.Tensor, heads_axis: int) -> torch.Tensor:
        """[kv_heads, T, d] of one sequence's key, whichever axis held its heads."""
        return key[0] if heads_axis == 1 else key[0].transpose(0, 1)

    def unrotated(self, calls: list[RotaryCall], cache) -> list[torch.Tensor]:
        """Every layer's position-free key [kv_heads, T, head_dim] from a watched forward: what the
        rotary function received, then the rest of the head as cached (never rotated)."""
        keys = []
        for call, layer in zip(calls, cache.layers):
            rot = self.heads_first(call.key, call.heads_axis)
            rest = layer.keys[0, :, :, rot.shape[-1]:]
            keys.append(torch.cat([rot, rest], dim=-1) if rest.shape[-1] else rot.contiguous())
        return keys

    def tables(self, total: int, like: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each table's cos/sin at positions 0..total-1: [1, total, rot] each."""
        positions = torch.arange(total, device=like.device).view(1, -1)
        return [c(like, positions) for c in self.candidates]

    def place(self, out: torch.Tensor, keys: torch.Tensor, tables, start: int) -> None:
        """Write keys [L, kv, T, d] (layers 0..L-1) into out [L, kv, T, d] at positions start..start+T-1."""
        end = start + keys.shape[2]
        for table in sorted(set(self.table_of[: len(keys)])):
            layers = [i for i, t in enumerate(self.table_of[: len(keys)]) if t == table]
            rot = self.rot_dims[layers[0]]
            cos, sin = (t[:, start:end] for t in tables[table])
            group = keys[layers] if len(layers) < len(keys) else keys
            rotated = self.apply(group[:1, :1, :, :rot], group[..., :rot], cos, sin)[1]
            if rot < keys.shape[-1]:
                rotated = torch.cat([rotated, group[..., rot:]], dim=-1)
            if len(layers) < len(keys):
                out[layers] = rotated
            else:
                out.copy_(rotated)
