"""Tracer-layer probing (paper Sec. 3, Table 1, App. B.2): at which layers does attention
density find the target fragment?

A group stores its target and n-1 unrelated contexts; the target is then placed at
every position in turn and, from one forward per placement, every layer's density
ranks the fragments. Run it with `method=vanilla` (latent memory, positions
distorted) or `method=text` (the same fragments as plain tokens: no distortion, App. C.2).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

import pandas as pd

from evals.datasets import Dataset
from evals.retention import Group, Retention
from evals.stats import bootstrap_mean, grouped_wilson
from methods.errors import ConfigError
from methods.attention.decoder import num_layers
from methods.attention.tracing import QueryMode, densities, ranks

TOP = (1, 2, 3, 4, 5)


def band(num_layers: int) -> list[int]:
    """The paper's candidate tracer layers (App. F): floor(L/3)..ceil(L/2)."""
    return list(range(num_layers // 3, -(-num_layers // 2) + 1))


class Probe:
    """fragments: n per group (the target and n-1 distractors); positions: target positions
    (1-based) to probe, null = all n; one_position_per_group: group g probes only the
    (g mod len(positions))-th of them, for a probe whose placements are expensive (text memory
    on CPU) that still covers every position evenly over many groups; layers: 'all', 'band'
    (floor(L/3)..ceil(L/2)) or a list; select_by: which row of the table `memdefrag tracer-sweep`
    records (best_row); the rest as in the retention task."""

    tables = ("tab:retrieval_layers",)
    def __init__(self, dataset: Dataset = "nqa", data_dir: str | None = None, groups: int = 50,
                 fragments: int = 20, positions: list[int] | None = None, one_position_per_group: bool = False,
                 layers: str | list[int] = "all", seed: int = 42, max_context_tokens: int = 512,
                 select_by: str = "mean_rank"):
        if isinstance(layers, str):
            allowed = layers in ("all", "band")
        else:
            layers = list(layers) if isinstance(layers, Iterable) else layers
            allowed = isinstance(layers, list) and all(type(x) is int for x in layers)
        if not allowed:
            raise ConfigError(f"task.layers={layers!r} must be 'all', 'band' or a list of layer indices")
        self.layers = layers
        if fragments < 2:
            raise ConfigError(f"task.fragments={fragments} must be >= 2 (a target and a distractor)")
        self.positions = sorted(set(positions)) if positions else range(1, fragments + 1)  # lazy: counted later
        if self.positions[0] < 1 or self.positions[-1] > fragments:
            raise ConfigError(f"task.positions={list(positions)} must lie in 1..task.fragments={fragments}")
        self.fragments, self.one_position_per_group = fragments, one_position_per_group
        if select_by not in CRITERIA:
            raise ConfigError(f"task.select_by={select_by!r} must be one of {list(CRITERIA)}")
        self.select_by = select_by
        self.source = Retention(dataset, data_dir, groups, updates=fragments, seed=seed,
                                max_context_tokens=max_context_tokens)
        self.source.updates_option = "task.fragments"

    def check(self) -> None:
        self.source.check()

    def describe(self) -> dict:
        return self.source.describe()

    def check_model(self, model_config, tokenizer) -> None:
        """The probed layers exist in this model."""
        self.layers_of(num_layers(model_config))

    def groups(self, tokenizer) -> list[Group]:
        return self.source.groups(tokenizer)

    def run_group(self, session, group: Group) -> Iterator[dict]:
        """One record per target position: the target's rank at every layer, per query mode."""
        first, *distractors = group.texts()
        target = session.store(first)
        for text in distractors:
            session.store(text, reuse=True)
        prompt_ids = session.prompt_ids(group.target.question)
        layers = self.layers_of(num_layers(session.model.config))
        others = [i for i, fid in enumerate(session.memory.ids()) if fid != target]
        positions = self.positions
        if self.one_position_per_group:
            positions = [positions[group.index % len(positions)]]
        for position in positions:
            start = time.perf_counter()
            index = position - 1
            order = others[:index] + [session.memory.ids().index(target)] + others[index:]
            view = session.memory.arranged(order)
            rows = session.trace(view, prompt_ids, layers)
            yield {
                "group": group.index, "position": position, "fragments": len(order),
                "memory_tokens": view.n_tokens, "memory": "latent" if session.method.needs_latent else "text",
                "layers": layers,
                "ranks": {mode: [int(ranks(densities(rows[layer], view.spans(), mode))[index]) for layer in layers]
                          for mode in QueryMode},
                "seconds": {"trace": time.perf_counter() - start},
            }

    def layers_of(self, num_layers: int) -> list[int]:
        if self.layers == "all":
            return list(range(num_layers))
        if self.layers == "band":
            return band(num_layers)
        if not self.layers or any(not 0 <= int(layer) < num_layers for layer in self.layers):
            raise ConfigError(f"task.layers={list(self.layers)} must be layer indices in 0..{num_layers - 1} "
                              f"(this model has {num_layers} decoder layers)")
        return sorted({int(layer) for layer in self.layers})

    def metrics(self, records: list[dict]) -> pd.DataFrame:
        return tracing_table(records)


CRITERIA = ("mean_rank", *(f"top{k}" for k in TOP))


def best_row(table: pd.DataFrame, select_by: str = "mean_rank") -> pd.Series:
    """The tracing table's best (layer, query mode): the lowest mean rank (the paper's App. F), or the highest
    Top-k tracing accuracy, which is what a Top-k method reads and can differ where a layer ranks the target
    middling everywhere (ties: the lower mean rank, then the lower layer)."""
    if select_by == "mean_rank":
        return table.sort_values(["mean_rank", "layer"]).iloc[0]
    return table.sort_values([select_by, "mean_rank", "layer"], ascending=[False, True, True]).iloc[0]


def tracing_table(records: list[dict]) -> pd.DataFrame:
    """Per query mode and layer: mean rank of the target with its 95 % bootstrap interval over groups (a group's
    probes share its target and its memory), and Top-k tracing accuracy (%) with its Wilson interval over the
    effective number of probes (stats.grouped_wilson, for the same reason), best first."""
    groups = [r.get("group", i) for i, r in enumerate(records)]
    rows = []
    for mode in QueryMode:
        ranks = pd.DataFrame([r["ranks"][mode] for r in records],      # probes x layers
                             columns=records[0].get("layers", range(len(records[0]["ranks"][mode]))))
        for layer in ranks.columns:
            mean, low, high = bootstrap_mean(ranks[layer].to_numpy(float), groups)
            tops = {}
            for k in TOP:
                found = (ranks[layer] <= k).to_numpy()
                bounds = grouped_wilson(found, groups)
                tops |= {f"top{k}": 100 * found.mean(), f"top{k} low": 100 * bounds[0],
                         f"top{k} high": 100 * bounds[1]}
            rows.append({"query_mode": mode, "layer": int(layer), "mean_rank": mean, "mean_rank low": low,
                         "mean_rank high": high, **tops, "probes": len(records)})
    table = pd.DataFrame(rows)
    return table.sort_values(["query_mode", "mean_rank", "layer"]).reset_index(drop=True)
