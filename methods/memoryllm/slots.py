"""A fixed pool of memory slots per layer (MemoryLLM, M+), read as a per-layer prefix like the latent memory.

Every slot remembers the fragment (injection) it came from, at every layer, also after random drops that
differ per layer; at each layer a fragment's slots stay together and fragments keep one order across
layers (drops keep the order, injections append). So a fragment's slots can be traced and moved as a whole
at every layer, though its number of slots may differ between layers. Position 0 is the sink (MemoryLLM's
bos embedding), the pool follows at 1..M; a view may lead with slots of no fragment (M+'s long-term memory
retrieved for a question), which stay first and are never moved.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import torch

LEAD = -(2**62)     # the origin of a leading slot that belongs to no fragment


@dataclass
class SlotMemory:
    """sink: [L, 1, hidden] or None; states: [L, M, hidden] (None until the first injection);
    origin: [L, M] the fragment id of every slot; order: fragment ids in their current order."""

    sink: torch.Tensor | None = None
    states: torch.Tensor | None = None
    origin: torch.Tensor | None = None
    order: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.order)

    @property
    def n_tokens(self) -> int:
        return 0 if self.states is None else int(self.states.shape[1])

    sink_length = 1             # the position before the pool (the sink's, where the model has one)

    @property
    def prefix_length(self) -> int:
        return self.sink_length + self.n_tokens

    def ids(self) -> list[int]:
        return list(self.order)

    def length_of(self, fid: int) -> int:
        """Slots of fragment `fid`, averaged over layers (0 once forgotten everywhere)."""
        return 0 if self.origin is None else round((self.origin == fid).sum().item() / self.origin.shape[0])

    def spans(self, layer: int = 0) -> list[tuple[int, int]]:
        """[start, end) positions of each fragment at `layer` (empty where it has no slot there)."""
        counts = [(self.origin[layer] == fid).sum().item() for fid in self.order]
        first = 1 + (self.origin[layer] == LEAD).sum().item()
        ends = torch.tensor(counts, device="cpu").cumsum(0).add(first).tolist()
        return list(zip([first, *ends[:-1]], ends))

    def stacked(self, name: str, dim: int) -> torch.Tensor:
        """[L, 1+M, hidden]: the sink, then the pool (what every layer reads before the prompt)."""
        if name != "states":
            raise ValueError(f"a slot pool holds states, not '{name}': read it with backend=hidden_prefix")
        parts = [t for t in (self.sink, self.states) if t is not None]
        return torch.cat(parts, dim=dim)

    def arranged(self, order: list[int]) -> "SlotMemory":
        """A view with fragments at indices `order`, every layer's slots moved fragment by fragment (a
        fragment's own slots keep their order); a subset filters, where it leaves every layer as long."""
        if len(set(order)) != len(order) or any(not 0 <= i < len(self) for i in order):
            raise ValueError(f"order {order} is not a selection of distinct indices in [0, {len(self)})")
        fids = [self.order[i] for i in order]
        rank = torch.full_like(self.origin, len(fids))
        rank[self.origin == LEAD] = -1
        for position, fid in enumerate(fids):
            rank[self.origin == fid] = position
        picked = torch.argsort(rank, dim=1, stable=True)
        kept = (rank < len(fids)).sum(dim=1)
        if len(set(kept.tolist())) > 1:
            raise ValueError("this selection leaves the layers with different numbers of slots")
        return replace(self, **self.taken(picked[:, : int(kept[0])]), order=fids)

    def taken(self, positions: torch.Tensor) -> dict:
        """Every per-slot field at per-layer `positions` [L, M'] (a subclass adds its own)."""
        index = positions.unsqueeze(-1).expand(-1, -1, self.states.shape[-1]).to(self.states.device)
        return {"states": self.states.gather(1, index), "origin": self.origin.gather(1, positions)}

    def reorder(self, order: list[int]) -> None:
        """Rearrange in place; `order` must be a permutation of range(len(self))."""
        if sorted(order) != list(range(len(self))):
            raise ValueError(f"order {order} is not a permutation of range({len(self)})")
        view = self.arranged(order)
        for f in fields(self):
            setattr(self, f.name, getattr(view, f.name))

    def keep(self, positions: torch.Tensor) -> None:
        """Keep the slots at sorted `positions`: [M'] at every layer alike, or [L, M'] per layer; a
        fragment left without a slot at every layer is forgotten."""
        if positions.dim() == 1:
            positions = positions.expand(self.states.shape[0], -1)
        for name, value in self.taken(positions).items():
            setattr(self, name, value)
        present = set(self.origin.unique().tolist())
        self.order = [fid for fid in self.order if fid in present]

    def append(self, fid: int, states: torch.Tensor) -> None:
        """A fragment's slots [L, n, hidden] after the pool, at every layer."""
        origin = torch.full(states.shape[:2], fid, dtype=torch.long, device="cpu")
        self.states = states if self.states is None else torch.cat([self.states, states.to(self.states)], dim=1)
        self.origin = origin if self.origin is None else torch.cat([self.origin, origin], dim=1)
        self.order.append(fid)
