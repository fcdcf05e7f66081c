"""Rotary positions as each model applies them, given at query time to keys stored without them.

No layout is assumed. A short probe forward watches the function every Hugging Face RoPE
family calls inside its attention (`apply_rotary_pos_emb` of its modeling module, called as
f(q, k, cos, sin) or once per tensor as f(x, cos, sin)) and learns, per layer: which rotated
tensor is the key (the one that reaches the cache), which rotary table it was given (matched
against the decoder's rotary embeddings, once per layer type where a family has several, e.g.
Gemma-3's sliding and global layers), how many leading key dims it rotates (partial rotary done
outside the function, e.g. StableLM), and which axis holds the heads (Gemma-4: the second).
Stored keys are what that function was given (the unrotated rest of the head appended); they get
positions by the same function, with tables for the new positions. A layer whose cached keys are
not one such rotation (e.g. keys shared across layers) is refused.
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


def rotated_parameters(function) -> list[str]:
    """The rotary function's parameters it rotates and returns in order: those before `cos`."""
    names = list(inspect.signature(function).parameters)
    return names[: names.index("cos")]


def has_rotary_function(model_class) -> bool:
    """Whether a model class's family applies rotary positions through the function we watch."""
    return hasattr(sys.modules[model_class.__module__], ROTARY_FUNCTION)


@dataclass
class Rotated:
    """One tensor the rotary function gave positions to, in one layer's attention."""

    layer: int
    slot: int                   # its place among the function's tensors (q, k) or (x,); calls in a layer in order
    given: torch.Tensor         # [1, heads, T, rot] (heads_axis 1) or [1, T, heads, rot] (heads_axis 2)
    result: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    heads_axis: int


def by_layer(rotated: list[Rotated], n_layers: int) -> list[list[Rotated]]:
    """What was rotated inside each layer's attention, in call order (anything outside one is left out)."""
    grouped: list[list[Rotated]] = [[] for _ in range(n_layers)]
    for r in rotated:
        if 0 <= r.layer < n_layers:
            grouped[r.layer].append(r)
    return grouped


@contextmanager
def watching_rotary(model):
    """Record every tensor the model's rotary function rotates during a forward, with its layer.

    Families call it as f(q, k, cos, sin) or once per tensor as f(x, cos, sin); either way the
    tensors before `cos` are rotated and returned in order."""
    module = modeling_module(model)
    original = getattr(module, ROTARY_FUNCTION, None)
    if original is None:
        raise RotaryError(f"model type {model.config.model_type!r} has no rotary positions")
    signature, tensors = inspect.signature(original), rotated_parameters(original)
    seen: list[Rotated] = []
    layer = [-1]

    def watched(*args, **kwargs):
        result = original(*args, **kwargs)
        given = signature.bind(*args, **kwargs)
        given.apply_defaults()
        arguments = given.arguments
        results = result if isinstance(result, tuple) else (result,)
        for slot, name in enumerate(tensors):
            seen.append(Rotated(layer[0], slot, arguments[name].detach(), results[slot].detach(),
                                arguments["cos"].detach(), arguments["sin"].detach(),
                                arguments.get("unsqueeze_dim", 1)))
        return result

    def entering(index):
        return lambda module, args, kwargs: layer.__setitem__(0, index)

    handles = [l.self_attn.register_forward_pre_hook(entering(i), with_kwargs=True)
               for i, l in enumerate(decoder_of(model).layers)]
    setattr(module, ROTARY_FUNCTION, watched)
    try:
        yield seen
    finally:
        setattr(module, ROTARY_FUNCTION, original)
        for h in handles:
            h.remove()


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
    """How a model gives keys their positions: per layer, which rotated tensor is the key (the one
    its cache holds), the table it uses and the width rotated."""

    def __init__(self, model):
        self.model, self.apply = model, getattr(modeling_module(model), ROTARY_FUNCTION, None)
        self.candidates = _candidates(model)
        self.key_of, self.key_slot, self.table_of, self.rot_dims = self._learn()
        self.n_tensors = len(rotated_parameters(self.apply))
        has_axis = "unsqueeze_dim" in inspect.signature(self.apply).parameters
        self.heads_second = {"unsqueeze_dim": 1} if has_axis else {}   # stored: [L, heads, T, d]

    @classmethod
    def of(cls, model) -> "Rotary":
        """The model's Rotary, learned once and kept on the model."""
        if getattr(model, "_memdefrag_rotary", None) is None:
            model._memdefrag_rotary = cls(model)
        return model._memdefrag_rotary

    @torch.no_grad()
    def _learn(self) -> tuple[list[int], int, list[int], list[int]]:
        n_layers = len(decoder_of(self.model).layers)
        ids = torch.arange(3, 3 + PROBE_TOKENS, device=self.model.device).view(1, -1)
        cache = DynamicCache()
        with watching_rotary(self.model) as seen:
            self.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        kind = self.model.config.model_type
        shapes = sorted({(layer.keys.shape[1], layer.keys.shape[-1]) for layer in cache.layers})
        if len(shapes) > 1:
            raise RotaryError(f"model type {kind!r}: its layers' keys differ in (heads, width) {shapes}; the "
                              f"memory store holds one shape for every layer")
        positions = torch.arange(PROBE_TOKENS, device=self.model.device).view(1, -1)
        tables = [c(seen[0].cos.new_zeros(1), positions) for c in self.candidates] if seen else []
        key_of, slots, table_of, rot_dims = [], set(), [], []
        for layer, mine in enumerate(by_layer(seen, n_layers)):
            stored = cache.layers[layer].keys[0] if layer < len(cache.layers) else None
            keys = [i for i, r in enumerate(mine) if stored is not None and r.heads_axis in (1, 2)
                    and self.heads_first(r.result, r.heads_axis).shape[:2] == stored.shape[:2]
                    and torch.equal(stored[..., : r.result.shape[-1]], self.heads_first(r.result, r.heads_axis))]
            match = [t for t, (cos, sin) in enumerate(tables) if keys and cos.shape == mine[keys[0]].cos.shape
                     and torch.equal(cos, mine[keys[0]].cos) and torch.equal(sin, mine[keys[0]].sin)]
            if len(keys) != 1 or not match:
                raise RotaryError(f"model type {kind!r}: layer {layer}'s cached keys could not be traced to one "
                                  f"rotation by the decoder's rotary embedding (e.g. keys shared across layers)")
            key_of.append(keys[0])
            slots.add(mine[keys[0]].slot)
            table_of.append(match[0])
            rot_dims.append(mine[keys[0]].result.shape[-1])
        if len(slots) != 1:
            raise RotaryError(f"model type {kind!r} passes its keys to the rotary function in different places")
        return key_of, slots.pop(), table_of, rot_dims

    @staticmethod
    def heads_first(tensor: torch.Tensor, heads_axis: int) -> torch.Tensor:
        """[heads, T, d] of one sequence's tensor, whichever axis held its heads."""
        return tensor[0] if heads_axis == 1 else tensor[0].transpose(0, 1)

    def unrotated(self, seen: list[Rotated], cache) -> list[torch.Tensor]:
        """Every layer's position-free key [kv_heads, T, head_dim] from a watched forward: what the
        rotary function was given, then the rest of the head as cached (never rotated)."""
        keys = []
        for layer, (mine, cached) in enumerate(zip(by_layer(seen, len(cache.layers)), cache.layers)):
            key = mine[self.key_of[layer]]
            rot = self.heads_first(key.given, key.heads_axis)
            rest = cached.keys[0, :, :, rot.shape[-1]:]
            keys.append(torch.cat([rot, rest], dim=-1) if rest.shape[-1] else rot.contiguous())
        return keys

    def tables(self, total: int, like: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each table's cos/sin at positions 0..total-1: [1, total, rot] each."""
        positions = torch.arange(total, device=like.device).view(1, -1)
        return [c(like, positions) for c in self.candidates]

    def _rotate(self, keys: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """keys [L, kv, T, rot] given positions by the model's own function, heads on axis 1."""
        if self.n_tensors == 1:
            return self.apply(keys, cos, sin, **self.heads_second)
        tensors = [keys[:1, :1]] * self.n_tensors                    # cheap stand-ins for the query
        tensors[self.key_slot] = keys
        return self.apply(*tensors, cos, sin, **self.heads_second)[self.key_slot]

    def place(self, out: torch.Tensor, keys: torch.Tensor, tables, start: int) -> None:
        """Write keys [L, kv, T, d] (layers 0..L-1) into out [L, kv, T, d] at positions start..start+T-1."""
        end = start + keys.shape[2]
        for table in sorted(set(self.table_of[: len(keys)])):
            layers = [i for i, t in enumerate(self.table_of[: len(keys)]) if t == table]
            rot = self.rot_dims[layers[0]]
            cos, sin = (t[:, start:end] for t in tables[table])
            group = keys[layers] if len(layers) < len(keys) else keys
            rotated = self._rotate(group[..., :rot], cos, sin)
            if rot < keys.shape[-1]:
                rotated = torch.cat([rotated, group[..., rot:]], dim=-1)
            if len(layers) < len(keys):
                out[layers] = rotated
            else:
                out.copy_(rotated)
