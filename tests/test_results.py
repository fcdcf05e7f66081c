"""Result folders resume: finished groups are kept, a group cut short is dropped, settings must match."""

import json

import pytest
from omegaconf import OmegaConf

from harness.errors import ConfigError
from harness.results import ResultFolder

CFG = OmegaConf.create({"method": {"label": "vanilla"}, "task": {"groups": 3}, "threads": 1})


def answer(group, step):
    return {"group": group, "step": step, "correct": True}


def interrupted_run(folder):
    run = ResultFolder(folder, CFG)
    run.add(answer(0, 1))
    run.add(answer(0, 2))
    run.end_group(0, 1.5)
    run.add(answer(1, 1))                                         # group 1 was cut short ...
    run._predictions.write('{"group": 1, "st')                     # ... by a kill -9 in mid-line
    run._predictions.flush()


def test_a_rerun_keeps_finished_groups_and_drops_the_cut_one(tmp_path):
    interrupted_run(tmp_path)
    resumed = ResultFolder(tmp_path, OmegaConf.merge(CFG, {"threads": 2}))      # threads may change
    assert resumed.done == {0: 1.5} and resumed.records == [answer(0, 1), answer(0, 2)]
    resumed.add(answer(1, 1))
    resumed.add(answer(1, 2))
    resumed.end_group(1, 2.0)
    lines = [json.loads(line) for line in (tmp_path / "predictions.jsonl").read_text().splitlines()]
    assert lines == [answer(0, 1), answer(0, 2), answer(1, 1), answer(1, 2)]
    assert ResultFolder(tmp_path, CFG).done == {0: 1.5, 1: 2.0}


def test_a_rerun_with_other_settings_is_refused(tmp_path):
    interrupted_run(tmp_path)
    with pytest.raises(ConfigError, match=r"holds a run with other settings \(method\)"):
        ResultFolder(tmp_path, OmegaConf.merge(CFG, {"method": {"label": "text"}}))
    assert ResultFolder(tmp_path, CFG, resume=False).done == {}
