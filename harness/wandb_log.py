"""Weights & Biases logging: offline by default, into the run's own folder; never stops a run."""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)


class NullLogger:
    def __init__(self, **_):
        pass

    def log_run(self, metrics, records, info) -> None:
        pass


class WandbLogger:
    """Logs the resolved config, metrics per step as curves, the per-question table, runtime, peak
    memory and the run folder's figures; runs of one sweep share a group, tags name method, task, model.

    group/tags: null/[] take the sweep's folder name and the run's own labels (given by the runner).
    """

    def __init__(self, run_dir: str, run_config: dict, mode: str = "offline", project: str = "memdefrag",
                 group: str | None = None, tags: list[str] | None = None, default_group: str | None = None,
                 default_tags: list[str] | None = None):
        self.run_dir, self.run_config, self.mode = run_dir, run_config, mode
        self.project, self.group = project, group or default_group
        self.tags = list(tags or []) + list(default_tags or [])

    def log_run(self, metrics, records, info) -> None:
        try:
            import wandb

            os.environ.setdefault("WANDB_SILENT", "true")
            run = wandb.init(project=self.project, dir=self.run_dir, mode=self.mode, config=self.run_config,
                             group=self.group, tags=self.tags, reinit="finish_previous")
            step_key = next((k for k in ("step", "layer") if k in metrics), None)
            if step_key:
                run.define_metric("*", step_metric=step_key)
            for row in metrics.to_dict("records"):
                run.log({k: v for k, v in row.items() if v == v and not isinstance(v, str)})   # NaN-free
            columns = [k for k, v in records[0].items() if not isinstance(v, (dict, list))] if records else []
            run.log({"predictions": wandb.Table(columns=columns,
                                                data=[[r[c] for c in columns] for r in records])})
            run.summary.update({"seconds": info["seconds"], "peak_memory": info.get("peak_memory", {})})
            for figure in sorted(Path(self.run_dir).glob("*.png")):
                run.log({figure.stem: wandb.Image(str(figure))})
            run.finish()
        except Exception as err:  # noqa: BLE001 - logging must never cost the results
            log.warning("W&B logging failed, results are on disk anyway: %s", err)
