"""Weights & Biases logging: offline by default, into the run's own folder; never stops a run."""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)


class NullLogger:
    def __init__(self, **_):
        pass

    def log_run(self, metrics, records, info) -> None:
        pass


class WandbLogger:
    """Logs the resolved config, accuracy per step, per-question table, runtime and peak memory."""

    def __init__(self, run_dir: str, run_config: dict, mode: str = "offline", project: str = "memdefrag",
                 group: str | None = None, tags: list[str] | None = None):
        self.run_dir, self.run_config, self.mode = run_dir, run_config, mode
        self.project, self.group, self.tags = project, group, tags or []

    def log_run(self, metrics, records, info) -> None:
        try:
            import wandb

            os.environ.setdefault("WANDB_SILENT", "true")
            run = wandb.init(project=self.project, dir=self.run_dir, mode=self.mode, config=self.run_config,
                             group=self.group, tags=self.tags, reinit="finish_previous")
            for row in metrics.to_dict("records"):
                run.log({k: v for k, v in row.items() if v == v})      # NaN-free
            columns = [k for k, v in records[0].items() if not isinstance(v, (dict, list))] if records else []
            run.log({"predictions": wandb.Table(columns=columns,
                                                data=[[r[c] for c in columns] for r in records])})
            run.summary.update({"seconds": info["seconds"], "peak_memory": info.get("peak_memory", {})})
            run.finish()
        except Exception as err:  # noqa: BLE001 - logging must never cost the results
            log.warning("W&B logging failed, results are on disk anyway: %s", err)
