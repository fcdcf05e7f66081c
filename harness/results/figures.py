"""Figures from sweep tables: accuracy per update step, one line per run, one panel per dataset."""

from __future__ import annotations

import functools
from pathlib import Path

import pandas as pd


@functools.cache
def pyplot():
    """matplotlib's pyplot, drawing to files only (no display on a cluster node); imported at the first figure,
    not with every command."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def integer_ticks():
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True)


def accuracy_curves(table: pd.DataFrame, path: str | Path, title: str = "") -> None:
    """Plot a sweep table (harness.results.summary.sweep_table: accuracy % per dataset and step) to `path`."""
    plt = pyplot()
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


def density_heatmap(density: pd.DataFrame, path: str | Path, title: str = "") -> None:
    """Target density per layer (rows) and update step (columns): paper Fig. 2b."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 5))
    image = ax.imshow(density.T.to_numpy(), aspect="auto", origin="lower", cmap="viridis",
                      extent=(density.index.min() - 0.5, density.index.max() + 0.5, -0.5, density.shape[1] - 0.5))
    fig.colorbar(image, ax=ax, label="attention density of the target")
    ax.set(title=title, xlabel="update step", ylabel="layer")
    ax.xaxis.set_major_locator(integer_ticks())
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def accuracy_and_density(accuracy: pd.Series, density: pd.Series, path: str | Path, title: str = "") -> None:
    """Accuracy and the target's density over steps at one layer, on twin axes: paper Fig. 2d."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot(accuracy.index, 100 * accuracy.to_numpy(), marker="o", color="tab:blue", label="accuracy")
    ax.set(xlabel="update step", ylabel="accuracy (%)", title=title)
    ax.xaxis.set_major_locator(integer_ticks())
    twin = ax.twinx()
    twin.plot(density.index, density.to_numpy(), marker="s", color="tab:red", label="density")
    twin.set_ylabel("attention density")
    fig.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def correlation_bars(table: pd.DataFrame, path: str | Path, title: str = "") -> None:
    """Per-layer Pearson and Spearman r between density and accuracy: paper Fig. 2c."""
    plt = pyplot()
    table = table.sort_values("layer")
    fig, ax = plt.subplots(figsize=(8, 3.6))
    width = 0.4
    ax.bar(table["layer"] - width / 2, table["pearson"], width, label="Pearson")
    ax.bar(table["layer"] + width / 2, table["spearman"], width, label="Spearman")
    ax.set(xlabel="layer", ylabel="r", title=title, ylim=(-1, 1))
    ax.axhline(0, color="black", linewidth=0.5)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def accuracy_against_time(table: pd.DataFrame, accuracy: str, path: str | Path, time: str = "s/question",
                          name: str = "variant", interval: tuple[str, str] | None = None,
                          measure: str = "accuracy") -> None:
    """One point per row of `table` (model, `name`, the `time` and `accuracy` columns; its interval's columns,
    `low@n` and `high@n` by default, as an error bar where the table has them), a colour per model: what each
    method buys and costs. measure: what the `accuracy` column holds, for the axis."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    low, high = interval or (accuracy.replace("acc@", "low@"), accuracy.replace("acc@", "high@"))
    for model, rows in table.groupby("model"):
        points = ax.scatter(rows[time], rows[accuracy], label=model)
        if low in rows and high in rows:           # the accuracy's interval as an error bar
            # a constant sample's bootstrap ends, rounded, can lie a hair past its mean: no negative bar
            spread = [(rows[accuracy] - rows[low]).clip(lower=0), (rows[high] - rows[accuracy]).clip(lower=0)]
            ax.errorbar(rows[time], rows[accuracy], yerr=spread, fmt="none", ecolor=points.get_facecolor()[0],
                        alpha=0.5, capsize=2)
        for _, row in rows.iterrows():
            ax.annotate(row[name], (row[time], row[accuracy]), fontsize=6, alpha=0.8,
                        color=points.get_facecolor()[0], xytext=(3, 2), textcoords="offset points")
    ax.set(xlabel=time.replace("s/", "seconds per ").replace("ttft", "time to first token"),
           ylabel=f"{measure} (%), {accuracy}",
           xscale="log" if table[time].nunique() > 1 else "linear")     # one time: no range to take a log over
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
