"""Rotary positions as each model applies them, given at query time to keys stored without them.

No layout is assumed. A short probe forward watches the functions every Hugging Face RoPE family
calls inside its attention (the `apply_rotary*` functions of its modeling module that take `cos` and
`sin`: f(q, k, cos, sin), once per tensor f(x, cos, sin), DeepSeek's interleaved variant) and learns,
per cache layer and per cached tensor (keys, or values where a family caches its rotated part there, as
multi-head latent attention does): which rotated tensor it is, by which function and rotary table
(matched against the decoder's rotary embeddings, once per layer type where a family has several, e.g.
Gemma-3's sliding and global layers), how many leading dims are rotated (partial rotary done outside the
function, e.g. StableLM) and which axis holds the heads (Gemma-4: the second). A layer that applies no
rotation (SmolLM3's and Llama-4's NoPE layers, Cohere2's global layers) keeps its cached tensors as they
are: they carry no position. Stored tensors are what the function was given (the unrotated rest of the
head appended); they get positions by the same function, with tables for the new positions. A layer
that rotates but whose cached tensors are not one such rotation is refused.
"""

from __future__ import annotations

import inspect
import sys
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import torch
from transformers import DynamicCache

from methods.attention.decoder import attention, attentions, cache_keyword, hooked, layers
from methods.memory import Layered
from methods.window import rope_settings, rope_type

ROTARY_PREFIX = "apply_rotary"
PROBE_TOKENS = 8


class RotaryError(ValueError):
    """The model's positions are not rotary ones this project can re-place (fast backend unusable)."""


def modeling_module(model):
    """The module that defines the model's attention (and its rotary functions)."""
    return sys.modules[type(attention(layers(model)[0])).__module__]


def rotated_parameters(function) -> list[str]:
    """The rotary function's parameters it rotates and returns in order: those before its tables (`cos` and
    `sin`, in either order: GPT-J's is f(tensor, sin, cos))."""
    names = list(inspect.signature(function).parameters)
    return names[: min(names.index("cos"), names.index("sin"))]


def rotary_functions(module) -> dict:
    """name -> function, for each rotary function of a modeling module that takes `cos` and `sin`."""
    found = {}
    for name, function in vars(module).items():
        if name.startswith(ROTARY_PREFIX) and inspect.isfunction(function):
            parameters = inspect.signature(function).parameters
            if "cos" in parameters and "sin" in parameters:
                found[name] = function
    return found


def has_rotary_function(model_class) -> bool:
    """Whether a model class's family applies rotary positions through a function we watch."""
    return bool(rotary_functions(sys.modules[model_class.__module__]))


@dataclass
class Rotated:
    """One tensor a rotary function gave positions to, in one layer's attention."""

    layer: int
    function: str               # the rotary function's name in the modeling module
    slot: int                   # its place among the function's tensors (q, k) or (x,); calls in a layer in order
    given: torch.Tensor | None  # [batch, heads, T, rot] (heads_axis 1) or [batch, T, heads, rot] (heads_axis 2)
    result: torch.Tensor | None     # the tensors are None where the watch was told not to keep them
    cos: torch.Tensor | None
    sin: torch.Tensor | None
    heads_axis: int


@dataclass(frozen=True)
class Rotation:
    """How one cached tensor of one layer gets its positions (layers with equal rotations are placed together;
    `call`, where in the layer's rotary calls the tensor was seen, does not tell them apart)."""

    function: str               # which rotary function
    slot: int                   # which of its tensors
    table: int                  # which rotary table (index into Rotary.candidates)
    dims: int                   # how many leading dims of the head it rotates
    call: int = field(default=0, compare=False)


def by_layer(rotated: list[Rotated], n_layers: int) -> list[list[Rotated]]:
    """What was rotated inside each layer's attention, in call order (anything outside one is left out)."""
    grouped: list[list[Rotated]] = [[] for _ in range(n_layers)]
    for r in rotated:
        if 0 <= r.layer < n_layers:
            grouped[r.layer].append(r)
    return grouped


@contextmanager
def watching_rotary(model, reads: set[tuple[int, int]] | None = None):
    """Record every tensor the model's rotary functions rotate during a forward, with its layer.

    Families call them as f(q, k, cos, sin) or once per tensor as f(x, cos, sin); either way the
    tensors before `cos` are rotated and returned in order. reads: the (layer, call) whose given tensor is kept
    (`Rotary.reads`); the others are recorded without their tensors, so that a forward does not hold every layer's
    queries, before and after their rotation, to its end. Every tensor is kept where None (learning what rotates)."""
    module = modeling_module(model)
    originals = rotary_functions(module)
    if not originals:
        raise RotaryError(no_rotary_function(model.config, module.__name__))
    seen: list[Rotated] = []
    layer = [-1]
    calls: dict[int, int] = {}             # layer -> its calls recorded so far

    def watch(name, original):
        signature, tensors = inspect.signature(original), rotated_parameters(original)

        def watched(*args, **kwargs):
            result = original(*args, **kwargs)
            given = signature.bind(*args, **kwargs)
            given.apply_defaults()
            arguments = given.arguments
            results = result if isinstance(result, tuple) else (result,)
            for slot, tensor in enumerate(tensors):
                call = calls[layer[0]] = calls.get(layer[0], -1) + 1
                if reads is None:
                    kept = (arguments[tensor], results[slot], arguments["cos"], arguments["sin"])
                else:
                    kept = (arguments[tensor] if (layer[0], call) in reads else None, None, None, None)
                seen.append(Rotated(layer[0], name, slot, *(t if t is None else t.detach() for t in kept),
                                    arguments.get("unsqueeze_dim", 1)))
            return result
        return watched

    def entering(index):
        return lambda module, args, kwargs: layer.__setitem__(0, index)

    for name, original in originals.items():
        setattr(module, name, watch(name, original))
    try:
        with hooked(attentions(model), entering):
            yield seen
    finally:
        for name, original in originals.items():
            setattr(module, name, original)


# rotary types whose frequencies transformers chooses per forward from its longest position (`dynamic_rope_update`):
# keys placed with one table and a prompt's forward over a longer read would rotate by different frequencies
LENGTH_DEPENDENT_ROTARY = ("dynamic", "longrope")


def length_dependent_rotary(config) -> dict | None:
    """The first rotary settings of the config's (per layer type, where it has several) whose frequencies depend
    on how long a forward is, or None."""
    return next((chosen for chosen in rope_settings(config.get_text_config())
                 if rope_type(chosen) in LENGTH_DEPENDENT_ROTARY), None)


def no_rotary_function(config, module_name: str) -> str:
    """Why the fast backend cannot place a family whose module has no rotary function; an ALiBi family (a function
    named for it) is told apart, since ALiBi keys would need no re-placing: the placement watches rotary functions
    only, and runs ALiBi where its family has one (Falcon's `alibi=true`)."""
    alibi = any("alibi" in name.lower() and inspect.isfunction(f) for name, f in vars(sys.modules[module_name]).items())
    how = ("adds ALiBi's bias in its attention, which this backend's placement, built on a family's rotary "
           "function (it runs ALiBi where the family has one, as Falcon's alibi=true), does not watch") if alibi else \
        "applies its positions some other way (absolute embeddings, complex frequencies) that it cannot re-place"
    return (f"re-places keys through the family's rotary function (apply_rotary*(..., cos, sin)); model type "
            f"{config.model_type!r} ({module_name}) defines none: it {how}")


def _candidates(model) -> list:
    """Every rotary table the decoder can make: (x, position_ids) -> (cos, sin), one per layer type
    where an embedding takes one."""
    found, config = [], model.config.get_text_config()
    for module in dict.fromkeys(m for m in model.get_decoder().modules() if "Rotary" in type(m).__name__):
        if "layer_type" in inspect.signature(module.forward).parameters:
            for layer_type in dict.fromkeys(getattr(config, "layer_types", None) or []):
                found.append(lambda x, p, m=module, t=layer_type: m(x, p, layer_type=t))
        else:
            found.append(module)
    return found


def heads_first(tensor: torch.Tensor, heads_axis: int) -> torch.Tensor:
    """[batch, heads, T, d] of a tensor, whichever axis held its heads."""
    return tensor if heads_axis == 1 else tensor.transpose(1, 2)


class Rotary:
    """How a model gives its cached tensors their positions: per cache layer, for keys and values, the
    Rotation that places it, or None where the layer applies no position to it."""

    def __init__(self, model):
        self._model = weakref.ref(model)       # the model keeps its Rotary: no cycle, so a job's model is freed
        self.functions = {name: (function, len(rotated_parameters(function)),        # (f, tensors it rotates,
                                 {"unsqueeze_dim": 1} if "unsqueeze_dim" in inspect.signature(function).parameters
                                 else {})                                            # heads on axis 1)
                          for name, function in rotary_functions(modeling_module(model)).items()}
        self.candidates = _candidates(model)
        self.how: list[dict[int, Rotation]] = self._learn()

    @property
    def model(self):
        return self._model()

    @classmethod
    def of(cls, model) -> "Rotary":
        """The model's Rotary, learned once and kept on the model."""
        if getattr(model, "_memdefrag_rotary", None) is None:
            model._memdefrag_rotary = cls(model)
        return model._memdefrag_rotary

    @property
    def reads(self) -> set[tuple[int, int]]:
        """The (layer, call) of every rotation `unrotated` reads: what a formation's watch keeps."""
        return {(index, rotation.call) for index, how in enumerate(self.how) for rotation in how.values()}

    @property
    def table_of(self) -> list[int | None]:
        """Each layer's key table (None: its keys carry no position)."""
        return [how[0].table if 0 in how else None for how in self.how]

    @table_of.setter
    def table_of(self, tables: list[int]) -> None:
        """Give each layer's keys another table (tests: a wrong table must be caught)."""
        self.how = [{**how, 0: replace(how[0], table=table)} if 0 in how else how for how, table in zip(self.how, tables)]

    @torch.no_grad()
    def _learn(self) -> list[dict[int, Rotation]]:
        n_layers = len(layers(self.model))
        ids = torch.arange(3, 3 + PROBE_TOKENS, device=self.model.device).view(1, -1)
        cache = DynamicCache()
        with watching_rotary(self.model) as seen:
            self.model(input_ids=ids, **{cache_keyword(self.model): cache}, use_cache=True, logits_to_keep=1)
        kind = self.model.config.model_type
        if len(cache.layers) != n_layers:
            raise RotaryError(f"model type {kind!r}: {n_layers - len(cache.layers)} of its {n_layers} layers keep no "
                              f"keys and values of their own (they read another layer's)")
        shapes: dict[tuple, list[int]] = {}
        for index, layer in enumerate(cache.layers):
            shapes.setdefault(tuple((t.shape[1], t.shape[-1]) for t in (layer.keys, layer.values)), []).append(index)
        self.groups = list(shapes.values())
        positions = torch.arange(PROBE_TOKENS, device=self.model.device).view(1, -1)
        tables = [c(seen[0].cos.new_zeros(1), positions) for c in self.candidates] if seen else []
        how = []
        for index, mine in enumerate(by_layer(seen, n_layers)):
            cached = (cache.layers[index].keys[0], cache.layers[index].values[0])
            found = {slot: self._rotation(mine, tensor, tables) for slot, tensor in enumerate(cached)}
            found = {slot: rotation for slot, rotation in found.items() if rotation is not None}
            if mine and not found:
                raise RotaryError(f"model type {kind!r}: layer {index} rotates, but its cached keys could not be "
                                  f"traced to one rotation by the decoder's rotary embedding (e.g. keys changed "
                                  f"after their rotation, or shared across layers)")
            how.append(found)
        return how

    def _rotation(self, mine: list[Rotated], cached: torch.Tensor, tables) -> Rotation | None:
        """The one rotation in a layer whose result is the leading dims of `cached` [heads, T, d], or None."""
        for call, r in enumerate(mine):
            result = heads_first(r.result, r.heads_axis)[0] if r.heads_axis in (1, 2) else None
            if result is None or result.shape[:2] != cached.shape[:2] or \
                    not torch.equal(cached[..., : result.shape[-1]], result):
                continue
            match = [t for t, (cos, sin) in enumerate(tables) if cos.shape == r.cos.shape
                     and torch.equal(cos, r.cos) and torch.equal(sin, r.sin)]
            if match:
                return Rotation(r.function, r.slot, match[0], result.shape[-1], call)
        return None

    def unrotated(self, seen: list[Rotated], cache) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Every layer's position-free keys and values [batch, heads, T, d] from a watched forward: what the
        rotary function was given, then the rest of the head as cached (never rotated); a tensor the
        layer gave no position as it is cached."""
        out: tuple[list, list] = ([], [])
        for index, (mine, layer) in enumerate(zip(by_layer(seen, len(cache.layers)), cache.layers)):
            for slot, cached in enumerate((layer.keys, layer.values)):
                rotation = self.how[index].get(slot)
                if rotation is None:
                    out[slot].append(cached)
                    continue
                rotated = mine[rotation.call]
                given = heads_first(rotated.given, rotated.heads_axis)
                rest = cached[..., rotation.dims:]
                out[slot].append(torch.cat([given, rest], dim=-1) if rest.shape[-1] else given)
        return out

    def tables(self, total: int, like: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each table's cos/sin at positions 0..total-1: [1, total, rot] each."""
        positions = torch.arange(total, device=like.device).view(1, -1)
        return [c(like, positions) for c in self.candidates]

    def _rotate(self, rotation: Rotation, tensor: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """tensor [L, heads, T, rot] given positions by the model's own function, heads on axis 1."""
        apply, count, extra = self.functions[rotation.function]
        if count == 1:
            return apply(tensor, cos=cos, sin=sin, **extra)
        tensors = [tensor[:1, :1]] * count                          # cheap stand-ins for the query
        tensors[rotation.slot] = tensor
        return apply(*tensors, cos=cos, sin=sin, **extra)[rotation.slot]

    def stacked(self, per_layer: list[torch.Tensor]) -> torch.Tensor | Layered:
        """Layer tensors [heads, T, d] as the store keeps them: one tensor, or one per group of layers that
        share a shape."""
        return Layered.of(per_layer, self.groups)

    def place(self, out: torch.Tensor, stored: torch.Tensor, slot: int, tables, start: int,
              layers: list[int] | None = None) -> None:
        """Write cached tensors `stored` [L, heads, T, d] of `slot` (0 keys, 1 values) of `layers` (default
        0..L-1) into out [L, heads, T, d] at positions start..start+T-1."""
        end, count = start + stored.shape[2], len(stored)
        layers = range(count) if layers is None else layers
        groups: dict[Rotation | None, list[int]] = {}
        for row, index in enumerate(layers):
            groups.setdefault(self.how[index].get(slot), []).append(row)
        for rotation, chosen in groups.items():
            group = stored if len(chosen) == count else stored[chosen]
            if rotation is None:
                placed = group
            else:
                cos, sin = (t[:, start:end] for t in tables[rotation.table])
                placed = self._rotate(rotation, group[..., : rotation.dims], cos, sin)
                if rotation.dims < group.shape[-1]:
                    placed = torch.cat([placed, group[..., rotation.dims:]], dim=-1)
            if len(chosen) == count:
                out.copy_(placed)
            else:
                out[chosen] = placed
