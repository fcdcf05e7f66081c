"""What a report is made of: the runs found under a results folder and the sections built from them."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from harness.errors import ConfigError
from harness.plugins import declared_tables
from harness.results import read_config, read_run_info
from harness.summary import run_folders

DEFAULT_MODEL = "smollm2"     # the paper tables' backbone here; other models get sections of their own
RELEASED = {"YuWangX/memoryllm-8b": "MemoryLLM-8B", "YuWangX/mplus-8b": "M+-8B"}   # baselines whose accuracy counts
BASELINE_STUDIES = ("memoryllm_comparison", "mplus_comparison")


@dataclass
class Run:
    folder: Path
    config: dict
    info: dict

    @property
    def tables(self) -> tuple[str, ...]:
        """The tables its task declares it makes."""
        return declared_tables(self.config["task"]["_target_"])

    @property
    def model(self) -> str:
        return self.config["model"]["name"]

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


def runs_under(root: Path) -> list[Run]:
    """The runs below `root` (one still running, or killed, counts for what it answered; its run.json is
    read when written). A folder whose config.yaml cannot be read is left out, one line on stderr says
    which; none at all is refused, before anything is written."""
    runs, skipped = [], []
    for folder in run_folders(root):
        try:
            runs.append(Run(folder, OmegaConf.to_container(read_config(folder)),
                            read_run_info(folder) if (folder / "run.json").is_file() else {}))
        except (OSError, ValueError):                    # the config (a ConfigError) or run.json unreadable
            skipped.append(str(folder))
    if skipped:
        print(f"memdefrag report: left out {len(skipped)} run folders whose config.yaml or run.json cannot be read: "
              f"{', '.join(skipped)}", file=sys.stderr)
    if not runs:
        raise ConfigError(f"{root} holds no run (a folder with config.yaml and predictions.jsonl): nothing to "
                          f"report, nothing written")
    return runs
