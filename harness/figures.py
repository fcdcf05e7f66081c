"""Figures from sweep tables: accuracy per update step, one line per run, one panel per dataset."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")                      # files only; no display on a cluster node
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402


def accuracy_curves(table: pd.DataFrame, path: str | Path, title: str = "") -> None:
    """Plot a sweep table (harness.summary.sweep_table: accuracy % per dataset and step) to `path`."""
    datasets = table.index.get_level_values("dataset").unique()
    fig, axes = plt.subplots(1, len(datasets), figsize=(5 * len(datasets), 3.6), squeeze=False, sharey=True)
    for ax, dataset in zip(axes[0], datasets):
        panel = table.xs(dataset, level="dataset").drop(index="groups", errors="ignore")
        panel.index = panel.index.astype(int)
        for run in panel.columns:
            series = panel[run].dropna()
            ax.plot(series.index, series.values, marker="o", label=run)
        ax.set(title=f"{title} {dataset}".strip(), xlabel="update step", ylabel="accuracy (%)")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
