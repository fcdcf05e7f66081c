"""A Hydra callback that tabulates a whole sweep when it ends: accuracy per step, one column per method."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from hydra.experimental.callback import Callback


def sweep_table(sweep_dir: str | Path) -> pd.DataFrame:
    """Accuracy per (task dataset, step) x method from every metrics.csv under `sweep_dir`."""
    frames = []
    for path in sorted(Path(sweep_dir).glob("**/metrics.csv")):
        frame = pd.read_csv(path)
        frames.append(frame)
    if not frames:
        return pd.DataFrame()
    table = pd.concat(frames).pivot_table(index="step", columns="method", values="accuracy", sort=False)
    return table.mul(100).round(1)


class SweepSummary(Callback):
    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        table = sweep_table(sweep_dir)
        if table.empty:
            return
        (sweep_dir / "summary.md").write_text(table.to_markdown() + "\n")
        table.to_csv(sweep_dir / "summary.csv")
        print(f"\nAccuracy (%) per update step, {sweep_dir}:\n{table.to_string()}")
