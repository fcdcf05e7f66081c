"""The `memdefrag` command: a Hydra app composing a method plugin with a task plugin."""

from __future__ import annotations

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from harness.errors import ConfigError
from harness.runner import run


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def app(cfg: DictConfig) -> float:
    try:
        return run(cfg, HydraConfig.get().runtime.output_dir)
    except ConfigError as err:
        print(f"memdefrag: error: {err}", file=sys.stderr)
        sys.exit(2)


def main() -> None:
    app()
