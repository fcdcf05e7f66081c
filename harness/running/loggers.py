"""Weights & Biases logging, live: offline by default, into the run's own folder; never stops a run.

The run is opened before the first group, each finished group's records and the metrics so far are logged
as it ends, and the final metrics, the per-question table, runtime, peak memory and figures when the run
ends. The W&B run id is kept in the run folder (`wandb_run_id`), so a resumed run continues the same W&B
run. Any W&B failure is logged once and turns the logger off for the rest of the run.
"""

from __future__ import annotations

import logging
import os
import secrets
from enum import StrEnum
from pathlib import Path

log = logging.getLogger(__name__)
RUN_ID_FILE = "wandb_run_id"
WandbMode = StrEnum("WandbMode", ["offline", "online", "disabled"])   # offline: sync later with `wandb sync`


class NullLogger:
    """Logs nothing (logger=none): the results are on disk either way."""

    def __init__(self, **_):
        pass

    def start(self) -> None:
        pass

    def log_group(self, records, metrics, done: int) -> None:
        pass

    def finish(self, metrics, records, info) -> None:
        pass


class WandbLogger:
    """Logs the resolved config, each group's records and the running metrics as the run goes, then the final
    metrics per step as curves, the per-question table, runtime, peak memory and the run folder's figures;
    runs of one sweep share a group, tags name method, task, model.

    group/tags: null/[] take the sweep's folder name and the run's own labels (given by the runner).
    """

    def __init__(self, mode: WandbMode = "offline", project: str = "memdefrag", group: str | None = None,
                 tags: list[str] | None = None, *, run_dir: str, run_config: dict, default_group: str | None = None,
                 default_tags: list[str] | None = None):
        self.run_dir, self.run_config, self.mode = Path(run_dir), run_config, mode
        self.project, self.group = project, group or default_group
        self.tags = list(tags or []) + list(default_tags or [])
        self.run = None

    def _safely(self, action, *args) -> None:
        """Run a W&B call; on any failure say so once and log nothing more (the results are on disk)."""
        if self.run is None and action != self._start:
            return
        try:
            action(*args)
        except Exception as err:  # noqa: BLE001 - logging must never cost the results
            log.warning("W&B logging failed and is off for this run, results are on disk anyway: %s", err)
            self.run = None

    def start(self) -> None:
        self._safely(self._start)

    def log_group(self, records, metrics, done: int) -> None:
        """A finished group's records and metrics() over all `done` groups finished so far (computed only
        where it is logged)."""
        self._safely(self._log_group, records, metrics, done)

    def finish(self, metrics, records, info) -> None:
        self._safely(self._finish, metrics, records, info)

    def _start(self) -> None:
        import wandb

        os.environ.setdefault("WANDB_SILENT", "true")
        id_file = self.run_dir / RUN_ID_FILE
        run_id = id_file.read_text().strip() if id_file.is_file() else secrets.token_hex(4)
        self.run = wandb.init(project=self.project, dir=str(self.run_dir), mode=self.mode, config=self.run_config,
                              group=self.group, tags=self.tags, id=run_id, resume="allow",
                              reinit="finish_previous")
        id_file.write_text(run_id + "\n")
        self.run.define_metric("groups_done")
        self.run.define_metric("running/*", step_metric="groups_done")

    def _log_group(self, records, metrics, done: int) -> None:
        import wandb

        columns = [k for k, v in records[0].items() if not isinstance(v, (dict, list))] if records else []
        row = {"groups_done": done,
               "group_records": wandb.Table(columns=columns, data=[[r.get(c) for c in columns] for r in records])}
        for record in metrics().to_dict("records"):
            where = "/".join(f"{k}={record[k]}" for k in ("step", "layer", "subset") if k in record)
            row.update({f"running/{where}/{k}": v for k, v in record.items()
                        if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and k != "step"})
        self.run.log(row)

    def _finish(self, metrics, records, info) -> None:
        import wandb

        columns = [k for k, v in records[0].items() if not isinstance(v, (dict, list))] if records else []
        self.run.log({"predictions": wandb.Table(columns=columns, data=[[r.get(c) for c in columns] for r in records])})
        step_key = next((k for k in ("step", "layer") if k in metrics), None)
        if step_key:
            self.run.define_metric("final/*", step_metric=f"final/{step_key}")
        for row in metrics.to_dict("records"):                     # the final metrics per step, as curves
            self.run.log({f"final/{k}": v for k, v in row.items() if v == v and not isinstance(v, str)})
        self.run.summary.update({"seconds": info["seconds"], "peak_memory": info.get("peak_memory", {})})
        for figure in sorted(self.run_dir.glob("*.png")):
            self.run.log({figure.stem: wandb.Image(str(figure))})
        self.run.finish()
        self.run = None
