"""Sweep tables count finished groups only, so an interrupted run reports what it really has."""

import json

from harness.summary import sweep_table


def write_run(folder, method, records):
    run = folder / f"0_{method}_synthetic"
    run.mkdir(parents=True)
    (run / "predictions.jsonl").write_text("".join(json.dumps({"method": method, **r}) + "\n" for r in records))


def test_partial_groups_are_left_out(tmp_path):
    write_run(tmp_path, "vanilla", [{"group": 0, "step": 1, "correct": True}, {"group": 0, "step": 5, "correct": False},
                                    {"group": 1, "step": 1, "correct": False}, {"group": 1, "step": 5, "correct": False},
                                    {"group": 2, "step": 1, "correct": True}])       # group 2 was interrupted
    table = sweep_table(tmp_path)
    assert list(table.columns) == ["vanilla (2)"]
    assert table.loc[("synthetic", 1), "vanilla (2)"] == 50.0
    assert table.loc[("synthetic", 5), "vanilla (2)"] == 0.0
