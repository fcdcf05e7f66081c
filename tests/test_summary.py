"""Sweep tables count finished groups only, so an interrupted run reports what it really has."""

import json

from harness.summary import sweep_table


def write_run(folder, method, records, dataset="synthetic"):
    run = folder / f"{method}_{dataset}"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(f"task:\n  dataset: {dataset}\n")
    (run / "predictions.jsonl").write_text("".join(json.dumps({"method": method, **r}) + "\n" for r in records))


def test_partial_groups_are_left_out(tmp_path):
    write_run(tmp_path, "vanilla", [{"group": 0, "step": 1, "correct": True}, {"group": 0, "step": 5, "correct": False},
                                    {"group": 1, "step": 1, "correct": False}, {"group": 1, "step": 5, "correct": False},
                                    {"group": 2, "step": 1, "correct": True}])       # group 2 was interrupted
    table = sweep_table(tmp_path)
    assert list(table.columns) == ["vanilla"]
    assert table["vanilla"].tolist() == [50.0, 0.0, 2]                  # steps 1, 5, then finished groups
    assert table.index.tolist() == [("synthetic", "1"), ("synthetic", "5"), ("synthetic", "groups")]


def test_runs_under_forgetting_get_their_own_column(tmp_path):
    write_run(tmp_path, "top2", [{"group": 0, "step": 10, "correct": True}], "nqa")
    (tmp_path / "top2_nqa").rename(tmp_path / "a")
    write_run(tmp_path, "top2", [{"group": 0, "step": 10, "correct": False, "forgetting": "random"}], "nqa")
    table = sweep_table(tmp_path)
    assert list(table.columns) == ["top2", "top2+random"]
    assert table.loc[("nqa", "10")].tolist() == [100.0, 0.0]
