"""Positional distortion (paper Sec. 2.2-2.3, Fig. 2, App. C.1): how accuracy and the target's
attention density fall together as the memory grows.

Retention with the first fragment as the target, stored in order (no shuffle), asked after
every update; before each question every layer's density of the target is traced (one
forward). Per layer, Pearson and Spearman correlation between the per-step mean density and
the per-step accuracy. `method=vanilla` is the latent memory, `method=text` the counterpart
without distortion.
"""

from __future__ import annotations

import math

import pandas as pd
import torch

from evals.datasets import Dataset
from evals.retention import Retention
from methods.attention.decoder import num_layers
from methods.attention.tracing import QueryMode, densities


class Distortion(Retention):
    tables = ("fig:distortion",)

    def __init__(self, dataset: Dataset = "nqa", data_dir: str | None = None, groups: int = 20,
                 updates: int = 20, seed: int = 42, max_context_tokens: int = 512):
        super().__init__(dataset, data_dir, groups, updates, eval_steps=None, shuffle=False, seed=seed,
                         max_context_tokens=max_context_tokens)

    def observe(self, session, target_id, group) -> dict:
        """The target's density at every layer, per query mode."""
        layers = list(range(num_layers(session.model.config)))
        prompt_ids = session.prompt_ids(group.target.question)
        rows = session.trace(session.memory, prompt_ids, layers)
        index = session.memory.ids().index(target_id)
        spans = session.memory.spans()
        return {"density": {mode: torch.stack([densities(rows[l], spans, mode)[index] for l in layers]).tolist()
                            for mode in QueryMode}}

    def metrics(self, records: list[dict]) -> pd.DataFrame:
        return correlations(records)


def density_by_step(records: list[dict], mode: str) -> pd.DataFrame:
    """Mean target density: steps x layers."""
    frame = pd.DataFrame([r["density"][mode] for r in records], index=[r["step"] for r in records])
    return frame.groupby(level=0).mean()


def accuracy_by_step(records: list[dict]) -> pd.Series:
    """Share of correct answers per step."""
    return pd.DataFrame(records).groupby("step")["correct"].mean()


def fisher_interval(r: float, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The 95 % interval of a Pearson r over n points (Fisher's z); nan where n <= 3 or r is nan."""
    if n <= 3 or math.isnan(r):
        return float("nan"), float("nan")
    centre, spread = math.atanh(max(min(r, 1 - 1e-12), -1 + 1e-12)), z / math.sqrt(n - 3)
    return math.tanh(centre - spread), math.tanh(centre + spread)


def correlations(records: list[dict]) -> pd.DataFrame:
    """Per query mode and layer: Pearson r (with its Fisher interval over the steps) and Spearman r between
    per-step density and accuracy, best first.

    `accuracy_levels` counts the distinct per-step accuracies: with two (a model at the floor after
    step 1, say) every r is decided by one step and says little.
    """
    from scipy import stats         # here, not at the top: every command imports this module, few correlate

    accuracy = accuracy_by_step(records)
    rows = []
    for mode in QueryMode:
        density = density_by_step(records, mode)
        for layer in density.columns:
            pair = (density[layer].to_numpy(), accuracy.loc[density.index].to_numpy())
            constant = any((values == values[0]).all() for values in pair)
            pearson = float("nan") if constant else stats.pearsonr(*pair).statistic
            rows.append({"query_mode": mode, "layer": int(layer), "pearson": pearson,
                         **dict(zip(("pearson low", "pearson high"), fisher_interval(pearson, len(density)))),
                         "spearman": float("nan") if constant else stats.spearmanr(*pair).statistic,
                         "steps": len(density), "accuracy_levels": accuracy.nunique()})
    return pd.DataFrame(rows).sort_values(["query_mode", "pearson", "layer"], ascending=[True, False, True],
                                          na_position="last").reset_index(drop=True)
