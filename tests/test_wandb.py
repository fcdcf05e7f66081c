"""Live W&B tracking (offline): each group is logged as it ends, a resumed run continues the same W&B run,
and a broken W&B never stops a run."""

import json

import pytest

from harness.errors import Interrupted
from harness.results import folder as results
from harness.running.runner import run
from harness.running.loggers import RUN_ID_FILE
from tests.conftest import tiny_run_config

RUN = ("logger=wandb", "logger.mode=offline", "task.groups=4", "task.updates=2", "method=vanilla")


def offline_runs(folder):
    return sorted((folder / "wandb").glob("offline-run-*"))


def run_id_of(offline_run) -> str:
    """W&B names an offline run `offline-run-<time>-<id>`, adding `-<n>` when a run with that name started in the
    same second: a resumed run can."""
    return offline_run.name.split("-")[3]


def logged_groups(run_folder) -> list[int]:
    """The groups whose records a W&B run logged as they ended (its group tables, offline)."""
    groups = []
    for table in sorted((run_folder / "files" / "media" / "table").glob("group_records_*.table.json")):
        data = json.loads(table.read_text())
        groups += sorted({row[data["columns"].index("group")] for row in data["data"]})
    return groups


def tables(run_folder) -> list[str]:
    return sorted(t.name.split("_")[0] for t in (run_folder / "files" / "media" / "table").glob("*.table.json"))


def test_a_resumed_run_continues_its_wandb_run(tmp_path, tiny_checkpoint, monkeypatch):
    ended = results.ResultFolder.end_group

    def killed_after_two(self, group, seconds):
        if len(self.done) == 2:
            raise KeyboardInterrupt                              # the run stops after two groups
        ended(self, group, seconds)

    monkeypatch.setattr(results.ResultFolder, "end_group", killed_after_two)
    with pytest.raises(Interrupted, match="2 of 4 groups finished"):
        run(tiny_run_config(tiny_checkpoint, *RUN), str(tmp_path))
    run_id = (tmp_path / RUN_ID_FILE).read_text().strip()
    [first] = offline_runs(tmp_path)
    assert run_id_of(first) == run_id and logged_groups(first) == [0, 1]        # logged as they ended
    monkeypatch.setattr(results.ResultFolder, "end_group", ended)
    run(tiny_run_config(tiny_checkpoint, *RUN), str(tmp_path))                  # resumes groups 2 and 3
    assert (tmp_path / RUN_ID_FILE).read_text().strip() == run_id
    runs = offline_runs(tmp_path)
    assert len(runs) == 2 and all(run_id_of(r) == run_id for r in runs)        # one W&B run, synced as one
    [resumed] = [r for r in runs if r != first]
    assert logged_groups(resumed) == [2, 3] and "predictions" in tables(resumed)


def test_a_broken_wandb_never_stops_a_run(tmp_path, tiny_checkpoint, monkeypatch, caplog):
    import wandb

    monkeypatch.setattr(wandb, "init", lambda **kwargs: (_ for _ in ()).throw(RuntimeError("W&B is down")))
    metrics = run(tiny_run_config(tiny_checkpoint, *RUN), str(tmp_path))
    assert len(metrics) and (tmp_path / "run.json").is_file()
    assert "W&B logging failed and is off for this run, results are on disk anyway: W&B is down" in caplog.text
