"""The latent memory store: an ordered list of fragments behind one sink.

Per-fragment storage is separate from the container; container operations are
loops over fragments. Position p = 0 of a memory is the sink (the paper's bos),
fragments follow in the current order at positions 1..N.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import torch


@dataclass
class Fragment:
    """One stored knowledge fragment of T tokens.

    keys, values: [layers, kv_heads, T, head_dim], position-free (taken before RoPE), or None.
    states:       [layers, T, hidden], the input of every decoder layer, or None.
    self_info:    [T] nats, -log p(token | its own preceding tokens); inf where unknown.
    token_ids and self_info are [layers, T] once layers have evicted different positions.
    """

    fid: int
    text: str
    token_ids: torch.Tensor
    self_info: torch.Tensor
    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None
    states: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.token_ids.shape[-1])

    @property
    def num_layers(self) -> int | None:
        stored = self.keys if self.keys is not None else self.states
        return None if stored is None else int(stored.shape[0])

    def take(self, positions: torch.Tensor) -> "Fragment":
        """The fragment restricted to `positions`: [T'] sorted, the same at every layer,
        or [layers, T'], each layer its own (then token ids and self-information become per layer)."""
        def pick(t, dim):
            return None if t is None else _select(t, positions, dim)
        per_token = [t[..., positions] if positions.dim() == 1 else
                     t.expand(positions.shape[0], -1).gather(1, positions)
                     for t in (self.token_ids, self.self_info)]
        return replace(self, token_ids=per_token[0], self_info=per_token[1],
                       keys=pick(self.keys, 2), values=pick(self.values, 2), states=pick(self.states, 1))


def _select(t: torch.Tensor, positions: torch.Tensor, dim: int) -> torch.Tensor:
    """Positions [T'] along `dim` of every layer, or [layers, T'] (layer i keeps row i) of t [layers, ...]."""
    if positions.dim() == 1:
        return t.index_select(dim, positions)
    view = [1] * t.dim()
    view[0], view[dim] = positions.shape
    size = list(t.shape)
    size[dim] = positions.shape[1]
    return t.gather(dim, positions.view(view).expand(size))


@dataclass
class LatentMemory:
    """Fragments in their current order behind one sink (a 1-token fragment)."""

    sink: Fragment | None = None
    fragments: list[Fragment] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.fragments)

    @property
    def n_tokens(self) -> int:
        """Stored memory positions N (the sink excluded)."""
        return sum(len(f) for f in self.fragments)

    def append(self, fragment: Fragment) -> None:
        self.fragments.append(fragment)

    def ids(self) -> list[int]:
        return [f.fid for f in self.fragments]

    def length_of(self, fid: int) -> int:
        """Retained tokens of fragment `fid` (0 once forgotten entirely)."""
        return sum(len(f) for f in self.fragments if f.fid == fid)

    def spans(self) -> list[tuple[int, int]]:
        """[start, end) memory positions of each fragment; the sink holds position 0."""
        out, start = [], 1
        for f in self.fragments:
            out.append((start, start + len(f)))
            start += len(f)
        return out

    def arranged(self, order: list[int]) -> "LatentMemory":
        """A view with fragments at indices `order` (earliest first); a subset filters."""
        if len(set(order)) != len(order) or any(not 0 <= i < len(self) for i in order):
            raise ValueError(f"order {order} is not a selection of distinct indices in [0, {len(self)})")
        return LatentMemory(self.sink, [self.fragments[i] for i in order])

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
        return torch.cat(parts) if parts else None

    def stacked(self, name: str, dim: int) -> torch.Tensor:
        """Sink and fragments' tensor `name` concatenated along their token dim."""
        parts = [getattr(f, name) for f in [self.sink, *self.fragments]]
        if any(p is None for p in parts):
            raise ValueError(f"this memory was formed without '{name}'; form it for this backend")
        return torch.cat(parts, dim=dim)

    def save(self, path: str | Path) -> None:
        torch.save({"sink": _as_dict(self.sink), "fragments": [_as_dict(f) for f in self.fragments]}, path)

    @classmethod
    def load(cls, path: str | Path) -> "LatentMemory":
        data = torch.load(path, weights_only=True)
        sink = Fragment(**data["sink"]) if data["sink"] else None
        return cls(sink, [Fragment(**d) for d in data["fragments"]])


def _as_dict(fragment: Fragment | None) -> dict | None:
    return None if fragment is None else {f.name: getattr(fragment, f.name) for f in fields(fragment)}
