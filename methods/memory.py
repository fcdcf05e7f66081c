"""The latent memory store: an ordered list of fragments behind one sink.

Per-fragment storage is separate from the container; container operations are
loops over fragments. The memory's first positions are its sink (the paper's bos: one token; or a shared
prefix, see methods.formation), fragments follow in the current order.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import torch


@dataclass
class Fragment:
    """One stored knowledge fragment of T tokens.

    keys, values: [layers, kv_heads, T, head_dim], position-free (taken before RoPE), or None; values may
                  differ from keys in heads and width (multi-head latent attention caches a latent and a
                  rotated part); a `Layered` where layers differ in heads or width (Gemma-4's global layers).
    states:       [layers, T, hidden], the input of every decoder layer, or None.
    self_info:    [T] nats, -log p(token | its own preceding tokens); inf where unknown.
    token_ids and self_info are [layers, T] once layers have evicted different positions.
    """

    fid: int
    text: str
    token_ids: torch.Tensor
    self_info: torch.Tensor
    keys: torch.Tensor | Layered | None = None
    values: torch.Tensor | Layered | None = None
    states: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.token_ids.shape[-1])

    @property
    def num_layers(self) -> int | None:
        stored = self.keys if self.keys is not None else self.states
        return None if stored is None else int(len(stored))

    def take(self, positions: torch.Tensor) -> "Fragment":
        """The fragment restricted to `positions`: [T'] sorted, the same at every layer,
        or [layers, T'], each layer its own (then token ids and self-information become per layer)."""
        def pick(t, dim):
            return None if t is None else t.select(positions, dim) if isinstance(t, Layered) else \
                _select(t, positions, dim)
        per_token = [t[..., positions] if positions.dim() == 1 else
                     t.expand(positions.shape[0], -1).gather(1, positions)
                     for t in (self.token_ids, self.self_info)]
        return replace(self, token_ids=per_token[0], self_info=per_token[1],
                       keys=pick(self.keys, 2), values=pick(self.values, 2), states=pick(self.states, 1))


def _select(t: torch.Tensor, positions: torch.Tensor, dim: int) -> torch.Tensor:
    """Positions [T'] along `dim` of every layer, or [layers, T'] (layer i keeps row i) of t [layers, ...]; the
    positions go to t's device without the host waiting, and a selection of a pinned tensor is pinned."""
    positions = positions.to(t.device, non_blocking=True)
    if positions.dim() == 1:
        out = t.index_select(dim, positions)
    else:
        view = [1] * t.dim()
        view[0], view[dim] = positions.shape
        size = list(t.shape)
        size[dim] = positions.shape[1]
        out = t.gather(dim, positions.view(view).expand(size))
    return pinned(out) if t.is_pinned() else out


def pinned(t: torch.Tensor | Layered) -> torch.Tensor | Layered:
    """A host tensor (or each group of a Layered) in page-locked memory where a CUDA device can copy from it
    without the host waiting (placement overlaps compute); as it is on a machine without one."""
    if isinstance(t, Layered):
        return Layered(t.layers, tuple(map(pinned, t.parts)))
    return t.pin_memory() if torch.cuda.is_available() else t


@dataclass(frozen=True)
class Layered:
    """Per-layer tensors whose heads or width differ between layers (Gemma-4's wider global heads): one
    tensor [layers of the group, heads, T, d] per group of layers sharing a shape; `layers` holds each
    group's layer indices, ascending."""

    layers: tuple[tuple[int, ...], ...]
    parts: tuple[torch.Tensor, ...]

    @classmethod
    def of(cls, per_layer: list[torch.Tensor], groups: list[list[int]]) -> torch.Tensor | "Layered":
        """Layer tensors [heads, T, d] stacked by group: one tensor [L, heads, T, d] when there is one group."""
        if len(groups) == 1:
            return torch.stack(per_layer)
        return cls(tuple(map(tuple, groups)), tuple(torch.stack([per_layer[i] for i in g]) for g in groups))

    def __len__(self) -> int:
        return sum(len(g) for g in self.layers)

    def select(self, positions: torch.Tensor, dim: int) -> "Layered":
        """`_select` on every group (positions [layers, T'] give each group its layers' rows)."""
        return Layered(self.layers, tuple(_select(part, positions if positions.dim() == 1 else positions[list(g)],
                                                  dim) for g, part in zip(self.layers, self.parts)))


def parts(t: torch.Tensor | Layered) -> tuple[torch.Tensor, ...]:
    """A store tensor's groups of same-shaped layers: (t,) when every layer has one shape."""
    return t.parts if isinstance(t, Layered) else (t,)


@dataclass
class LatentMemory:
    """Fragments in their current order behind one sink (a fragment of one token, or of a shared prefix).
    formed_by: the model and formation its fragments were formed with (Former.stamp; None where unknown), which a
    session reading it checks against its own."""

    sink: Fragment | None = None
    fragments: list[Fragment] = field(default_factory=list)
    formed_by: str | None = None

    def __len__(self) -> int:
        return len(self.fragments)

    @property
    def n_tokens(self) -> int:
        """Stored memory positions N (the sink excluded)."""
        return sum(len(f) for f in self.fragments)

    @property
    def sink_length(self) -> int:
        """Positions the sink holds, before the first fragment's (1 until the first fragment gives it)."""
        return 1 if self.sink is None else len(self.sink)

    @property
    def prefix_length(self) -> int:
        """Positions the memory takes before a prompt read in order after it: the sink's, then N."""
        return self.sink_length + self.n_tokens

    def append(self, fragment: Fragment) -> None:
        self.fragments.append(fragment)

    def ids(self) -> list[int]:
        return [f.fid for f in self.fragments]

    def length_of(self, fid: int) -> int:
        """Retained tokens of fragment `fid` (0 once forgotten entirely)."""
        return sum(len(f) for f in self.fragments if f.fid == fid)

    def spans(self, layer: int = 0) -> list[tuple[int, int]]:
        """[start, end) memory positions of each fragment, the same at every layer; the sink holds the first."""
        out, start = [], self.sink_length
        for f in self.fragments:
            out.append((start, start + len(f)))
            start += len(f)
        return out

    def arranged(self, order: list[int]) -> "LatentMemory":
        """A view with fragments at indices `order` (earliest first); a subset filters."""
        if len(set(order)) != len(order) or any(not 0 <= i < len(self) for i in order):
            raise ValueError(f"order {order} is not a selection of distinct indices in [0, {len(self)})")
        return LatentMemory(self.sink, [self.fragments[i] for i in order], self.formed_by)

    def reorder(self, order: list[int]) -> None:
        """Rearrange in place; `order` must be a permutation of range(len(self))."""
        if sorted(order) != list(range(len(self))):
            raise ValueError(f"order {order} is not a permutation of range({len(self)})")
        self.fragments = [self.fragments[i] for i in order]

    def keep(self, index: int, positions: torch.Tensor) -> None:
        """Evict from fragment `index` every token not in `positions` (coherent across layers)."""
        self.fragments[index] = self.fragments[index].take(positions)

    def text_ids(self) -> torch.Tensor | None:
        """The memory as plain tokens, sink then fragments in order (None when empty): what text
        memory places before the prompt, with no positional distortion."""
        parts = [f.token_ids for f in [self.sink, *self.fragments] if f is not None]
        if any(p.dim() != 1 for p in parts):
            raise ValueError("this memory's layers keep different tokens (forgotten per layer): it has no one "
                             "text to read; read it with a latent method")
        return torch.cat(parts) if parts else None

    def stacked(self, name: str, dim: int) -> torch.Tensor:
        """Sink and fragments' tensor `name` concatenated along their token dim."""
        parts = [getattr(f, name) for f in [self.sink, *self.fragments]]
        if any(p is None for p in parts):
            raise ValueError(f"this memory was formed without '{name}'; form it for this backend")
        return torch.cat(parts, dim=dim)

    def save(self, path: str | Path) -> None:
        """Write the memory whole or not at all: a temporary file beside `path`, then a rename."""
        path = Path(path)
        partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
        try:
            torch.save({"format": FILE_FORMAT, "version": FILE_VERSION, "sink": _as_dict(self.sink),
                        "fragments": [_as_dict(f) for f in self.fragments], "formed_by": self.formed_by}, partial)
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)

    @classmethod
    def load(cls, path: str | Path) -> "LatentMemory":
        """A saved memory, checked (format, version, fields, shapes, dtypes); MemoryFileError names the
        file and the fault. Loading never runs code from the file (weights_only)."""
        try:
            data = torch.load(path, weights_only=True)
        except FileNotFoundError:
            raise
        except Exception as err:  # noqa: BLE001 - torch raises many types for a file that is not its own
            cause = str(err).splitlines()[0] if str(err) else "empty or truncated"
            raise MemoryFileError(f"{path}: not a memory saved by LatentMemory.save ({cause})") from None
        try:
            return _validated(data)
        except (KeyError, TypeError, ValueError) as err:
            raise MemoryFileError(f"{path}: {err.args[0] if err.args else err}") from None


FILE_FORMAT, FILE_VERSION = "memdefrag.LatentMemory", 1


class MemoryFileError(ValueError):
    """A memory file that cannot be read back: the message names the file and what is wrong."""


def _as_dict(fragment: Fragment | None) -> dict | None:
    def saved(value):
        return {"layers": [list(g) for g in value.layers], "parts": list(value.parts)} \
            if isinstance(value, Layered) else value
    return None if fragment is None else {f.name: saved(getattr(fragment, f.name)) for f in fields(fragment)}


def _read_layered(value, where: str):
    """A saved Layered (layer groups and their tensors) back, or the value as it is."""
    if not isinstance(value, dict):
        return value
    groups, tensors = value.get("layers"), value.get("parts")
    if set(value) != {"layers", "parts"} or not isinstance(groups, list) or not isinstance(tensors, list) \
            or len(groups) != len(tensors) or not all(isinstance(g, list) and all(isinstance(i, int) for i in g)
                                                      for g in groups):
        raise ValueError(f"{where}: layer groups must be {{'layers': [[int, ...], ...], 'parts': [tensor, ...]}}")
    return Layered(tuple(map(tuple, groups)), tuple(tensors))


def _validated(data) -> LatentMemory:
    """The memory in a loaded file, or ValueError saying what is wrong with it."""
    if not isinstance(data, dict) or data.get("format") != FILE_FORMAT:
        raise ValueError("not a memory saved by LatentMemory.save (no memdefrag format mark)")
    if data.get("version") != FILE_VERSION:
        raise ValueError(f"format version {data.get('version')!r}; this memdefrag reads version {FILE_VERSION}")
    if data.get("sink") is None:
        raise ValueError("it has no sink (position 0); a saved memory always has one")
    if not isinstance(data.get("fragments"), list):
        raise ValueError("'fragments' is not a list")
    formed_by = data.get("formed_by")              # absent in files saved before it was recorded
    if formed_by is not None and not isinstance(formed_by, str):
        raise ValueError(f"'formed_by' is {type(formed_by).__name__}, not a string")
    memory = LatentMemory(_fragment(data["sink"], "sink"),
                          [_fragment(d, f"fragment {i}") for i, d in enumerate(data["fragments"])], formed_by)
    _consistent([memory.sink, *memory.fragments])
    return memory


def _fragment(entry, where: str) -> Fragment:
    """One fragment from its saved fields, its own shapes checked."""
    names = {f.name for f in fields(Fragment)}
    if not isinstance(entry, dict) or set(entry) != names:
        found = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
        raise ValueError(f"{where}: fields {found}, expected {sorted(names)}")
    fragment = Fragment(**{k: _read_layered(v, f"{where}: {k}") for k, v in entry.items()})
    if not isinstance(fragment.fid, int) or not isinstance(fragment.text, str):
        raise ValueError(f"{where}: fid must be an integer and text a string")
    ids, info = fragment.token_ids, fragment.self_info
    if not (isinstance(ids, torch.Tensor) and isinstance(info, torch.Tensor)) or ids.dim() not in (1, 2) \
            or ids.shape != info.shape or ids.dtype != torch.long or not info.is_floating_point():
        raise ValueError(f"{where}: token_ids (integers) and self_info (floats) must be tensors of one shape "
                         f"[T] or [layers, T]")
    length = len(fragment)
    for name, token_dim, dims in (("keys", 2, 4), ("values", 2, 4), ("states", 1, 3)):
        for t in parts(getattr(fragment, name)) if getattr(fragment, name) is not None else ():
            if not isinstance(t, torch.Tensor) or t.dim() != dims or not t.is_floating_point() \
                    or t.shape[token_dim] != length:
                raise ValueError(f"{where}: {name} must be a float tensor of {dims} dims holding its {length} "
                                 f"tokens at dim {token_dim}, got {getattr(t, 'shape', type(t).__name__)}")
    if (fragment.keys is None) != (fragment.values is None) or \
            (fragment.keys is not None and _layout(fragment.keys) != _layout(fragment.values)):
        raise ValueError(f"{where}: keys and values must both be present, for the same layers")
    return fragment


def _layout(t: torch.Tensor | Layered) -> tuple:
    """Which layers a store tensor holds, in which groups."""
    return t.layers if isinstance(t, Layered) else (len(t),)


def _consistent(fragments: list[Fragment]) -> None:
    """Every fragment stores the same tensors, with the same layers, heads, widths and dtype."""
    for name, shared in (("keys", (0, 1, 3)), ("values", (0, 1, 3)), ("states", (0, 2))):
        present = [getattr(f, name) for f in fragments]
        if all(t is None for t in present):
            continue
        if any(t is None for t in present):
            raise ValueError(f"some fragments have {name} and some do not")
        sizes = {(_layout(t),) + tuple((tuple(p.shape[d] for d in shared), p.dtype) for p in parts(t))
                 for t in present}
        if len(sizes) > 1:
            raise ValueError(f"{name} differ across fragments in layers, heads, width or dtype: "
                             f"{sorted(map(str, sizes))}")
    layered = {f.token_ids.shape[0] for f in fragments if f.token_ids.dim() == 2}
    stored = {f.num_layers for f in fragments} - {None}
    if layered and (len(layered) > 1 or (stored and layered != stored)):
        raise ValueError(f"per-layer token ids for {sorted(layered)} layers, tensors for {sorted(stored)}")
