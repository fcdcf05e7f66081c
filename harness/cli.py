"""The `memdefrag` command: a Hydra app composing a method plugin with a task plugin."""

from __future__ import annotations

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from harness import shards
from harness.errors import ConfigError
from harness.runner import run


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def app(cfg: DictConfig):
    try:
        return run(cfg, HydraConfig.get().runtime.output_dir)
    except ConfigError as err:
        print(f"memdefrag: error: {err}", file=sys.stderr)
        sys.exit(2)


def merge(argv: list[str]) -> None:
    """`memdefrag merge SWEEP_DIR...`: every complete set of shards below each folder, merged."""
    import argparse

    parser = argparse.ArgumentParser(prog="memdefrag merge", description=merge.__doc__)
    parser.add_argument("folders", nargs="+")
    args = parser.parse_args(argv)
    try:
        for folder in args.folders:
            for run in shards.merge_sweep(folder):
                print(f"merged: {run}")
    except ConfigError as err:
        print(f"memdefrag merge: error: {err}", file=sys.stderr)
        sys.exit(2)


def main() -> None:
    """The Hydra app, or a subcommand named first."""
    if len(sys.argv) > 1 and sys.argv[1] == "merge":
        merge(sys.argv[2:])
    else:
        app()
