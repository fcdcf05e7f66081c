"""What a report is made of: the runs found under a results folder and the sections built from them."""

from __future__ import annotations

import hashlib
import os
import re
import sys
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from evals.stats import bootstrap_mean, wilson, with_interval
from harness.errors import ConfigError
from harness.plugins.contracts import declared_tables
from harness.results.folder import Finished, as_of_now, finished, flattened, read_config, read_run_info
from harness.results.summary import IMPLIED, complete_groups, run_folders, run_labels
from methods.window import BEYOND_CELL, marked

DEFAULT_MODEL = "smollm2"     # the paper tables' backbone here; other models get sections of their own
RELEASED = {"YuWangX/memoryllm-8b": "MemoryLLM-8B", "YuWangX/mplus-8b": "M+-8B"}   # baselines whose accuracy counts
BASELINE_STUDIES = ("memoryllm_comparison", "mplus_comparison")
# Retention's groups differ in their target only (evals.retention, as the authors' evaluation builds them)
SHARED_DISTRACTORS = ("Every group of a seed stores the same distractors, each group in its own order: an interval "
                      "covers the targets drawn, for that one set of distractors.")


@dataclass
class Run:
    folder: Path
    config: dict
    info: dict

    @cached_property
    def finished(self) -> Finished:
        """The groups it finished, their seconds and records (harness.results.folder.finished), read once per
        report."""
        return finished(self.folder)

    @property
    def records(self) -> list[dict]:
        return self.finished.records

    @property
    def past_window(self) -> bool:
        """Whether any answer it counts read past its model's trained window (its records' `beyond_window`)."""
        return any((record.get("beyond_window") or 0) > 0 for record in self.records)

    @property
    def tables(self) -> tuple[str, ...]:
        """The tables its task declares it makes."""
        return declared_tables(self.config["task"]["_target_"])

    @property
    def model(self) -> str:
        return self.config["model"]["name"]

    @property
    def device(self) -> str | None:
        """What it ran on: the device's name where run.json records it (`NVIDIA H200`, a CPU's model), else as
        torch names it (`cuda:0`, `cpu`)."""
        return self.info.get("device_name") or self.info.get("device")

    @property
    def study(self) -> str | None:
        """The experiment that made the run, where its tables take only their own runs."""
        return self.config.get("study")

    @property
    def bounded(self) -> bool:
        return self.config.get("forgetting", {}).get("label", "unbounded") != "unbounded"

    @property
    def baseline(self) -> bool:
        """A released MemoryLLM or M+ checkpoint without defragmentation: a row of the paper's comparisons."""
        return self.study in BASELINE_STUDIES and self.config["model"].get("source") in RELEASED \
            and not self.config["method"].get("defragment")


@dataclass
class Section:
    label: str
    title: str
    table: pd.DataFrame | None = None
    missing: str = ""
    figure: str | None = None
    text: str | None = None          # a table already written as Markdown
    after: str = ""                  # Markdown shown after the table
    command: str = ""                # what makes the table's runs


def runs_under(root: Path) -> list[Run]:
    """The runs below `root` (one still running, or killed, counts for the groups it finished; its run.json is
    read when written). A folder whose files cannot be read, or that has finished no group yet, is left out,
    one line on stderr says which and why; none at all is refused, before anything is written."""
    runs, skipped, unanswered = [], [], []
    for folder in run_folders(root):
        try:
            run = Run(folder, OmegaConf.to_container(read_config(folder)),
                      read_run_info(folder) if os.path.lexists(folder / "run.json") else {})
            (runs if run.records else unanswered).append(run)
        except (OSError, ValueError) as err:     # config.yaml, run.json or a record file unreadable (a ConfigError)
            skipped.append(str(err) if str(folder) in str(err) else f"{folder}: {err}")
    if skipped:
        print(f"memdefrag report: left out {len(skipped)} run folders that cannot be read as runs: "
              f"{'; '.join(skipped)}", file=sys.stderr)
    if unanswered:
        print(f"memdefrag report: left out {len(unanswered)} run folders with no finished group yet: "
              f"{', '.join(str(run.folder) for run in unanswered)}", file=sys.stderr)
    if not runs:
        raise ConfigError(f"{root} holds no run with an answer (a folder with config.yaml and a record in "
                          f"predictions.jsonl): nothing to report, nothing written")
    return runs


def file_part(name: str) -> str:
    """`name` (a model's, which may be a path or a hub id) as a part of a table's label and file name: each
    character other than a letter, digit or underscore made an underscore, then 8 hex digits of the name's sha256
    where any was (`a/b` and `a-b` are two models, not one table)."""
    part = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    return part if part == name else f"{part}_{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def named(run: Run, name: str) -> str:
    """`name` (the run's label, or its dataset where a table crosses datasets with methods) as a table shows it:
    marked where the run read past its model's trained window (methods.window.marked), so that no number read
    there passes for one read inside it."""
    return marked(name, run.past_window)


def labelled(runs: list[Run], table: str, leave: tuple[str, ...] = ()) -> list[str]:
    """Each run's row (run_columns(), named): its label, marked where it read past its model's trained window."""
    return [named(run, label) for run, label in zip(runs, run_columns(runs, table, leave))]


def run_columns(runs: list[Run], table: str, leave: tuple[str, ...] = (), per_device: bool = False) -> list[str]:
    """Each run's column (harness.results.summary.run_labels) among the runs of its own model and dataset, so that a
    setting that differs only between datasets (N_max, say) splits no column; `leave`: task settings left out
    (`seed`: runs of several seeds pool into one row). In a table whose rows are per device, the model's folder
    splits no column either: each device's runs read a checkpoint saved where its lease put it. Refused, naming the
    setting, where runs that would share a column split on a setting only some of them recorded (a run folder
    older than the setting: `memdefrag migrate` fills it in)."""
    def config(run: Run) -> dict:
        model = {k: v for k, v in run.config["model"].items() if not (per_device and k == "source")}
        return {**run.config, "model": model,
                "task": {k: v for k, v in run.config["task"].items() if k not in leave}}

    labels = {}
    for key in dict.fromkeys((r.model, r.config["task"]["dataset"]) for r in runs):
        same = [r for r in runs if (r.model, r.config["task"]["dataset"]) == key]
        refuse_one_sided(table, same, [config(r) for r in same])
        labels |= {id(r): label for r, label in zip(same, run_labels([config(r) for r in same]))}
    refuse_repeated_groups(table, runs, [labels[id(r)] for r in runs], per_device)
    return [labels[id(r)] for r in runs]


def refuse_repeated_groups(table: str, runs: list[Run], rows: list[str], per_device: bool = False) -> None:
    """A ConfigError naming both folders where two runs of one row (of one model and dataset; and device, in a
    table whose rows are per device) answered the same group of the same seed: a rerun beside the run it repeats,
    whose questions would count twice. Shards of a run answer groups of their own, and pool."""
    answered: dict[tuple, Run] = {}
    for run, row in zip(runs, rows):
        seed, device = run.config["task"].get("seed"), run.device if per_device else None
        for group in dict.fromkeys(record.get("group") for record in run.records):
            first = answered.setdefault((run.model, run.config["task"]["dataset"], device, row, seed, group), run)
            if first is not run:
                raise ConfigError(f"{table}: row {row} would count group {group} (seed {seed}) twice: both "
                                  f"{first.folder} and {run.folder} answered it; move one of them out of the "
                                  f"results (a rerun kept beside the run it repeats, or a copy)")


def rows_and_caption(runs: list[Run], among: list[Run], titled: tuple[str, ...] = ()) -> tuple[list[str], str]:
    """One table's rows named by what differs between them (harness.results.summary.run_labels over these runs alone: the
    method, then a setting only where two rows share a method), and its caption's part: what they share of what
    differs between the runs of `among` (every table of its kind), as `name=value`. Left to the title: a setting
    that follows from the model (one value per model among them), the method's own (its label names them), and
    those `titled`."""
    flats = [flattened(as_of_now(r.config)) for r in among]
    mine = [flattened(as_of_now(r.config)) for r in runs]

    def varies(key: str, flat: list[dict]) -> bool:
        return len({repr(f.get(key)) for f in flat}) > 1

    def of_the_model(key: str) -> bool:
        return all(not varies(key, [f for f, r in zip(flats, among) if r.model == model]) for model in
                   {r.model for r in among})

    left = (*IMPLIED, "method", *titled)
    keys = sorted(k for k in set().union(*flats) if not any(k == i or k.startswith(i + ".") for i in left)
                  and varies(k, flats) and not of_the_model(k) and not varies(k, mine))
    return run_labels([r.config for r in runs]), " ".join(f"{k.rsplit('.', 1)[-1]}={mine[0].get(k)}" for k in keys)


def settings_apart(runs: list[Run], groups: list[str], fields: dict) -> tuple[list[str], dict[str, dict[str, list]]]:
    """What `runs` were made under, by `fields` (name -> the run's value; None said as `unrecorded`): the fields
    every run shares, as `name value`, and each other field's values per group (a table's row or column, `groups`
    naming each run's), in the order first met."""
    values: dict[str, dict[str, list]] = {name: {} for name in fields}
    for run, group in zip(runs, groups):
        for name, of in fields.items():
            value = "unrecorded" if of(run) is None else str(of(run))
            seen = values[name].setdefault(group, [])
            if value not in seen:
                seen.append(value)
    shared, differing = [], {}
    for name, per_group in values.items():
        distinct = {value for seen in per_group.values() for value in seen}
        if len(distinct) == 1:
            shared.append(f"{name} {distinct.pop()}")
        else:
            differing[name] = per_group
    return shared, differing


def refuse_one_sided(table: str, runs: list[Run], configs: list[dict]) -> None:
    """A ConfigError where runs sharing a column's name differ in a setting that only some of them recorded."""
    names = [run_labels([c])[0] for c in configs]
    for name in dict.fromkeys(names):
        mine = [(run, flattened(as_of_now(c))) for run, c, n in zip(runs, configs, names) if n == name]
        for key in sorted(set().union(*(flat for _, flat in mine))):
            if any(key == i or key.startswith(i + ".") for i in IMPLIED):
                continue
            having = [run for run, flat in mine if key in flat]
            if len(having) < len(mine) and len({repr(flat.get(key)) for _, flat in mine}) > 1:
                lacking = next(run for run, flat in mine if key not in flat)
                group = key.split(".")[0] if "." in key else None
                where = {None: "LATER_SETTINGS", "model": "LATER_MODEL_SETTINGS"}.get(
                    group, "LATER_PLUGIN_SETTINGS (by its _target_)")
                raise ConfigError(f"{table}: column {name} would split on {key}, which {having[0].folder} records "
                                  f"and {lacking.folder} does not: declare the value runs had before {key} existed "
                                  f"in harness.results.folder.{where} (`memdefrag migrate` then records it), or move one "
                                  f"of the two runs out of the results")


def step_records(runs: list[Run], table: str) -> pd.DataFrame:
    """Every answer of the runs that answer questions per step, with its dataset, its run's column (run_columns()),
    model and seed (a question of a claim is its seed, group and step: harness.report.claims);
    each record's own `beyond_window` says whether the cell that counts it is marked (step_table)."""
    found = [(run, run.records) for run in runs if run.records and {"correct", "step"} <= run.records[0].keys()]
    labels = run_columns([run for run, _ in found], table)
    return pd.DataFrame([{**record, "dataset": run.config["task"]["dataset"], "run": label, "model": run.model,
                          "seed": run.config["task"].get("seed")}
                         for (run, records), label in zip(found, labels) for record in records])


def past_window(records: pd.DataFrame) -> str:
    """A cell's mark (methods.window.BEYOND_CELL, after a space) where any answer it counts read past its model's
    trained window (its record's `beyond_window`); '' where none did."""
    beyond = records["beyond_window"] if "beyond_window" in records else pd.Series(dtype=float)
    return f" {BEYOND_CELL}" if (beyond.fillna(0) > 0).any() else ""


def step_table(records: pd.DataFrame, value: str = "correct") -> pd.DataFrame:
    """(dataset, step) x run over the finished groups: accuracy (%) with its 95 % Wilson interval, or the mean of
    another per-question `value` with its 95 % bootstrap interval over groups, each marked where an answer it counts
    read past the window (past_window); a last row per dataset: the groups each run finished. Datasets in
    alphabetical order, columns in the order the runs come."""
    records = complete_groups(records)
    cells: dict = {}
    for (dataset, step, run), frame in records.groupby(["dataset", "step", "run"], sort=False):
        values = frame[value].dropna()
        if values.empty:
            continue
        if value == "correct":
            cell = with_interval(values.mean(), *wilson(int(values.sum()), len(values)))
        else:
            mean, low, high = bootstrap_mean(values.to_numpy(float), frame.loc[values.index, "group"].to_numpy())
            cell = f"{mean:.2f} [{low:.2f}, {high:.2f}]"
        cells[(dataset, str(step)), run] = cell + past_window(frame)
    for (dataset, run), frame in records.groupby(["dataset", "run"], sort=False):
        cells[(dataset, "groups"), run] = str(frame["group"].nunique())
    datasets = sorted(set(records["dataset"]))
    rows = [(d, str(s)) for d in datasets for s in sorted(records.loc[records["dataset"] == d, "step"].unique())]
    rows = sorted(rows + [(d, "groups") for d in datasets], key=lambda row: (datasets.index(row[0]), row[1] == "groups"))
    columns = list(dict.fromkeys(records["run"]))
    table = pd.DataFrame([[cells.get((row, run), "") for run in columns] for row in rows], columns=columns,
                         index=pd.MultiIndex.from_tuples(rows, names=["dataset", "step"]))
    return table.loc[:, (table != "").any()]


def with_bounds(table: pd.DataFrame, digits: int = 2) -> pd.DataFrame:
    """Each column with `<column> low` and `<column> high` beside it shown as `value [low, high]`, those gone."""
    table = table.copy()
    for column in [c for c in table.columns if f"{c} low" in table.columns and f"{c} high" in table.columns]:
        table[column] = [f"{v:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]" for v, low, high in
                         zip(table[column], table[f"{column} low"], table[f"{column} high"])]
        table = table.drop(columns=[f"{column} low", f"{column} high"])
    return table


SHARES = ("accuracy",)      # what a task's metrics.csv holds as a share, 0-1 (evals.retention, docs' Passkey)


def in_percent(metrics: pd.DataFrame) -> pd.DataFrame:
    """A task's metrics as every table prints them: each share (SHARES) in % (`accuracy (%)`), with its interval
    in brackets where metrics.csv has its bounds (`<share>_low`, `<share>_high`): `50.0 [9.5, 90.5]`."""
    for share in [c for c in SHARES if c in metrics]:
        bounds = [f"{share}_low", f"{share}_high"]
        cells = ([with_interval(*values) for values in zip(*(metrics[c] for c in (share, *bounds)))]
                 if set(bounds) <= set(metrics) else ["" if pd.isna(v) else f"{100 * v:.1f}" for v in metrics[share]])
        metrics = metrics.drop(columns=bounds, errors="ignore").assign(**{share: cells}).rename(
            columns={share: f"{share} (%)"})
    return metrics


def bench_table(path: Path, root: Path) -> str:
    """A memdefrag-bench table (its --out file) as the report shows it, named by its path below `root`, with a
    column saying that each timing is one number, no interval (the bench keeps the fastest of its repeats, not
    their spread), and a line under the header of a table older than the bench's window check."""
    lines = path.read_text().strip().splitlines()
    if "past_window" not in next((line for line in lines if line.startswith("|")), ""):      # the header row
        lines.insert(1, "\nWritten before the bench checked its reads against the model's trained window (no "
                        "`past_window` column): a row whose memory_tokens, with the prompt and the answer, pass the "
                        "model's positions read past it, and its output is timed, not judged.")
    repeats = re.search(r"best of (\d+) questions", lines[0])
    note = "n = 1, no interval" + (f" (the fastest of {repeats[1]})" if repeats and repeats[1] != "1" else "")
    header, rule, *rows = [i for i, line in enumerate(lines) if line.startswith("|")]
    lines[header] += " interval |"
    lines[rule] += ":---|"
    for row in rows:
        lines[row] += f" {note} |"
    return f"`{path.relative_to(root)}`: " + "\n".join(lines)
