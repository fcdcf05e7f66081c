"""Tabulating sweeps: accuracy per step, one column per method, from the per-question records.

Reading predictions.jsonl (written as each question is answered) rather than the
final metrics lets an interrupted run count for the groups it finished.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

from evals.stats import wilson
from harness.errors import ConfigError, OneLineParser
from harness.results.folder import ResultFolder, as_of_now, finished, flattened, read_config


# settings a run's label already says, or that do not make it another run (ResultFolder.FREE among them)
IMPLIED = ("method._target_", "method.k", "method.label", "forgetting", "compression", "task.dataset",
           "task.eval_steps", "task.groups", "shard", "study", *ResultFolder.FREE)


def phase_totals(records) -> dict[str, float]:
    """Seconds spent per phase (formation, forgetting, trace, prefill, decode, ...) over records, summed."""
    totals = Counter()
    for record in records:
        totals.update(record.get("seconds", {}))
    return dict(totals)


def run_folders(*roots: str | Path) -> list[Path]:
    """Run folders below `roots`: those holding a predictions.jsonl, even one that cannot be read (a link to nothing,
    which a glob passes over: the readers name it); shards count as runs, copies under merged/ are skipped."""
    return [path.parent for root in roots
            for path in sorted(folder / "predictions.jsonl" for folder in Path(root).glob("**/"))
            if os.path.lexists(path) and "merged" not in path.relative_to(root).parts]


def records_of(folders: list[Path]) -> pd.DataFrame:
    """Every answer of the runs in `folders` that answer questions per step (not e.g. probes),
    labelled with its dataset and run: method, forgetting, and any other setting that varies; the groups each run
    finished (harness.results.folder.finished). A folder whose config.yaml or records cannot be read is left out,
    with one line on stderr saying why."""
    runs = []
    for folder in folders:
        try:
            config, records = OmegaConf.to_container(read_config(folder)), finished(folder).records
        except ConfigError as err:
            print(f"memdefrag: summary: {err}; its run is left out", file=sys.stderr)
            continue
        if records and {"correct", "step"} <= records[0].keys():
            runs.append((config, records))
    labels = run_labels([config for config, _ in runs])
    rows = [{**record, "dataset": config["task"]["dataset"], "run": label}
            for (config, records), label in zip(runs, labels) for record in records]
    return pd.DataFrame(rows)


def run_labels(configs: list[dict]) -> list[str]:
    """`method[+forgetting][+compressor@rate]` (a method's label names its own knobs, e.g. `ape T=0.9 S=0.9`), then,
    only where runs would share that label, `name=value` for each setting that differs between those runs."""
    flats = [flattened(as_of_now(c)) for c in configs]      # settings added since: their value then
    labels = []
    for config in configs:
        forgetting = config.get("forgetting", {}).get("label", "unbounded")
        label = config["method"]["label"] + ("" if forgetting == "unbounded" else f"+{forgetting}")
        compression = config.get("compression", {"label": "none"})
        if compression["label"] != "none":
            label += f"+{compression['label']}@{compression['rate']:g}"
        labels.append(label)
    out = []
    for label, flat in zip(labels, flats):
        same = [f for f, other in zip(flats, labels) if other == label]
        keys = set().union(*same)
        varying = sorted(k for k in keys if not any(k == i or k.startswith(i + ".") for i in IMPLIED)
                         and len({repr(f.get(k)) for f in same}) > 1)
        out.append(" ".join([label, *(f"{k.rsplit('.', 1)[-1]}={flat[k]}" for k in varying if k in flat)]))
    return out


def complete_groups(records: pd.DataFrame) -> pd.DataFrame:
    """Only the groups a run finished (every one of its evaluated steps answered)."""
    steps = records.groupby(["dataset", "run"])["step"].nunique()
    answered = records.groupby(["dataset", "run", "group"])["step"].transform("nunique")
    expected = records.set_index(["dataset", "run"]).index.map(steps)
    return records[answered.to_numpy() == expected.to_numpy()]


def sweep_table(*roots: str | Path) -> pd.DataFrame:
    """Accuracy (%) per (dataset, step) x run of the runs below `roots`; see accuracy_table."""
    return accuracy_table(records_of(run_folders(*roots)))


def accuracy_table(records: pd.DataFrame, value: str = "correct") -> pd.DataFrame:
    """Accuracy (%) per (dataset, step) x run, and a last row per dataset: the groups each run finished.
    value: another per-question field to average instead (e.g. target_rank)."""
    if records.empty:
        return records
    records = complete_groups(records)
    table = records.pivot_table(index=["dataset", "step"], columns="run", values=value, aggfunc="mean")
    table = table.mul(100 if value == "correct" else 1).round(1 if value == "correct" else 2)
    groups = records.groupby(["dataset", "run"])["group"].nunique().unstack("run")
    rows = [table.loc[d].loc[step].rename((d, str(step))) for d in groups.index for step in table.loc[d].index]
    rows += [groups.loc[d].rename((d, "groups")) for d in groups.index]
    rows.sort(key=lambda row: (list(groups.index).index(row.name[0]), row.name[1] == "groups"))
    out = pd.DataFrame(rows)
    out.index = pd.MultiIndex.from_tuples(out.index, names=["dataset", "step"])
    out.columns.name = None
    return out


def intervals(records: pd.DataFrame) -> pd.DataFrame:
    """One row per (dataset, run, step) of the finished groups: accuracy (%), n and its 95 % Wilson interval (%)."""
    counts = complete_groups(records).groupby(["dataset", "run", "step"])["correct"].agg(["sum", "size"])
    bounds = [wilson(int(k), int(n)) for k, n in zip(counts["sum"], counts["size"])]
    return pd.DataFrame({"accuracy": 100 * counts["sum"] / counts["size"], "n": counts["size"],
                         "low": [100 * low for low, _ in bounds], "high": [100 * high for _, high in bounds]},
                        index=counts.index).reset_index()


def metrics_of(*roots: str | Path) -> pd.DataFrame:
    """Every finished run's metrics.csv below `roots`, one after the other (tasks that ask no steps)."""
    frames = [pd.read_csv(folder / "metrics.csv") for folder in run_folders(*roots)
              if (folder / "metrics.csv").is_file()]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def markdown(table: pd.DataFrame) -> str:
    """A summary table as Markdown: each level of its index a column of its own (dataset, step), not a tuple."""
    return (table.reset_index() if isinstance(table.index, pd.MultiIndex) else table).to_markdown(index=False)


class SweepSummary(Callback):
    def on_multirun_end(self, config, **kwargs) -> None:
        """Accuracy per step where the runs ask at steps; otherwise every run's metrics, one table."""
        sweep_dir = Path(config.hydra.sweep.dir)
        records = records_of(run_folders(sweep_dir))
        table, what = accuracy_table(records), "Accuracy (%) per update step (finished groups last)"
        tidy = None if table.empty else intervals(records)      # the CSV: each accuracy with n and its interval
        if table.empty:
            table, what = metrics_of(sweep_dir), "Metrics per run"
        if table.empty:
            return
        (sweep_dir / "summary.md").write_text(markdown(table) + "\n")
        (table if tidy is None else tidy).to_csv(sweep_dir / "summary.csv", index=tidy is None)
        print(f"\n{what}, {sweep_dir}:\n{table.to_string()}")


def main(argv: list[str] | None = None) -> None:
    """`python -m harness.results.summary RESULTS... --markdown F --plot F`: one table over result folders."""
    from harness.results.figures import accuracy_curves

    parser = OneLineParser(description=main.__doc__)
    parser.add_argument("folders", nargs="+", help="result or sweep folders (searched recursively)")
    parser.add_argument("--markdown", help="write the table here")
    parser.add_argument("--plot", help="write accuracy curves here (PNG)")
    args = parser.parse_args(argv)
    table = sweep_table(*args.folders)
    print(table.to_string())
    if args.markdown:
        Path(args.markdown).write_text(markdown(table) + "\n")
    if args.plot:
        accuracy_curves(table, args.plot)


if __name__ == "__main__":
    main()
