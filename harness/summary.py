"""Tabulating sweeps: accuracy per step, one column per method, from the per-question records.

Reading predictions.jsonl (written as each question is answered) rather than the
final metrics lets an interrupted run count for the groups it finished.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from hydra.experimental.callback import Callback
from omegaconf import OmegaConf


def records_under(folder: str | Path) -> pd.DataFrame:
    """Every answer of every run below `folder`, labelled with its dataset and run (method, forgetting)."""
    rows = []
    for path in sorted(Path(folder).glob("**/predictions.jsonl")):
        dataset = OmegaConf.load(path.parent / "config.yaml").task.dataset
        rows += [{"forgetting": "unbounded", **json.loads(line), "dataset": dataset}
                 for line in path.read_text().splitlines() if line]
    records = pd.DataFrame(rows)
    if not records.empty:
        bounded = records["forgetting"] != "unbounded"
        records["run"] = records["method"].where(~bounded, records["method"] + "+" + records["forgetting"])
    return records


def complete_groups(records: pd.DataFrame) -> pd.DataFrame:
    """Only the groups a run finished (every one of its evaluated steps answered)."""
    steps = records.groupby(["dataset", "run"])["step"].nunique()
    answered = records.groupby(["dataset", "run", "group"])["step"].transform("nunique")
    expected = records.set_index(["dataset", "run"]).index.map(steps)
    return records[answered.to_numpy() == expected.to_numpy()]


def sweep_table(*folders: str | Path) -> pd.DataFrame:
    """Accuracy (%) per (dataset, step) x run, and a last row per dataset: the groups each run finished."""
    records = pd.concat([records_under(f) for f in folders], ignore_index=True)
    if records.empty:
        return records
    records = complete_groups(records)
    table = records.pivot_table(index=["dataset", "step"], columns="run", values="correct", aggfunc="mean")
    table = table.mul(100).round(1)
    groups = records.groupby(["dataset", "run"])["group"].nunique().unstack("run")
    rows = [table.loc[d].loc[step].rename((d, str(step))) for d in groups.index for step in table.loc[d].index]
    rows += [groups.loc[d].rename((d, "groups")) for d in groups.index]
    rows.sort(key=lambda row: (list(groups.index).index(row.name[0]), row.name[1] == "groups"))
    out = pd.DataFrame(rows)
    out.index = pd.MultiIndex.from_tuples(out.index, names=["dataset", "step"])
    out.columns.name = None
    return out


class SweepSummary(Callback):
    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        table = sweep_table(sweep_dir)
        if table.empty:
            return
        (sweep_dir / "summary.md").write_text(table.to_markdown() + "\n")
        table.to_csv(sweep_dir / "summary.csv")
        print(f"\nAccuracy (%) per update step, {sweep_dir} (finished groups last):\n{table.to_string()}")


def main(argv: list[str] | None = None) -> None:
    """`python -m harness.summary RESULTS... --markdown F --plot F`: one table over result folders."""
    import argparse

    from harness.figures import accuracy_curves

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("folders", nargs="+", help="result or sweep folders (searched recursively)")
    parser.add_argument("--markdown", help="write the table here")
    parser.add_argument("--plot", help="write accuracy curves here (PNG)")
    args = parser.parse_args(argv)
    table = sweep_table(*args.folders)
    print(table.to_string())
    if args.markdown:
        Path(args.markdown).write_text(table.to_markdown() + "\n")
    if args.plot:
        accuracy_curves(table, args.plot)


if __name__ == "__main__":
    main()
