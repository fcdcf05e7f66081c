"""Tabulating sweeps: accuracy per step, one column per method, from the per-question records.

Reading predictions.jsonl (written as each question is answered) rather than the
final metrics lets an interrupted run count for the groups it finished.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from hydra.experimental.callback import Callback


def records_under(folder: str | Path) -> pd.DataFrame:
    rows = []
    for path in sorted(Path(folder).glob("**/predictions.jsonl")):
        dataset = path.parent.name.rsplit("_", 1)[-1]
        rows += [{**json.loads(line), "dataset": dataset} for line in path.read_text().splitlines() if line]
    return pd.DataFrame(rows)


def complete_groups(records: pd.DataFrame) -> pd.DataFrame:
    """Only the groups a method finished (every one of its evaluated steps answered)."""
    steps = records.groupby("method")["step"].nunique()
    answered = records.groupby(["method", "group"])["step"].transform("nunique")
    return records[answered == records["method"].map(steps)]


def sweep_table(folder: str | Path) -> pd.DataFrame:
    """Accuracy (%) per (dataset, step) x method; each method is labelled with its number of groups."""
    records = records_under(folder)
    if records.empty:
        return records
    records = complete_groups(records)
    table = records.pivot_table(index=["dataset", "step"], columns="method", values="correct", aggfunc="mean")
    groups = records.groupby(["dataset", "method"])["group"].nunique().groupby("method").min()
    table = table.mul(100).round(1)
    table.columns = [f"{method} ({groups[method]})" for method in table.columns]
    return table


class SweepSummary(Callback):
    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        table = sweep_table(sweep_dir)
        if table.empty:
            return
        (sweep_dir / "summary.md").write_text(table.to_markdown() + "\n")
        table.to_csv(sweep_dir / "summary.csv")
        print(f"\nAccuracy (%) per update step, {sweep_dir} (groups per method in brackets):\n{table.to_string()}")
