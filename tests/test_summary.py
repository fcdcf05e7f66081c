"""Sweep tables count finished groups only, and name each run by what sets it apart."""

import json

from omegaconf import OmegaConf

from harness.results.summary import run_labels, sweep_table


def write_run(folder, name, records, dataset="synthetic", method="vanilla", forgetting="unbounded", **method_fields):
    run = folder / name
    run.mkdir(parents=True)
    config = {"task": {"_target_": "evals.retention.Retention", "dataset": dataset}, "model": {"name": "tiny"},
              "method": {"label": method, **method_fields},
              "forgetting": {"label": forgetting}}
    (run / "config.yaml").write_text(OmegaConf.to_yaml(config))
    (run / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_partial_groups_are_left_out(tmp_path):
    write_run(tmp_path, "a", [{"group": 0, "step": 1, "correct": True}, {"group": 0, "step": 5, "correct": False},
                              {"group": 1, "step": 1, "correct": False}, {"group": 1, "step": 5, "correct": False},
                              {"group": 2, "step": 1, "correct": True}])      # group 2 was interrupted
    table = sweep_table(tmp_path)
    assert list(table.columns) == ["vanilla"]
    assert table["vanilla"].tolist() == [50.0, 0.0, 2]                  # steps 1, 5, then finished groups
    assert table.index.tolist() == [("synthetic", "1"), ("synthetic", "5"), ("synthetic", "groups")]


def test_the_sweeps_csv_gives_each_accuracy_its_n_and_interval(tmp_path):
    from types import SimpleNamespace

    import pandas as pd

    from harness.results.summary import SweepSummary

    write_run(tmp_path, "a", [{"group": g, "step": 1, "correct": g < 5} for g in range(10)])
    SweepSummary().on_multirun_end(SimpleNamespace(hydra=SimpleNamespace(sweep=SimpleNamespace(dir=str(tmp_path)))))
    row = pd.read_csv(tmp_path / "summary.csv").iloc[0]
    assert (row["run"], row["step"], row["accuracy"], row["n"]) == ("vanilla", 1, 50.0, 10)
    assert (round(row["low"], 2), round(row["high"], 2)) == (23.66, 76.34)          # Wilson, Newcombe (1998)


def test_the_sweeps_markdown_names_its_rows_by_dataset_and_step_not_by_tuples(tmp_path):
    from types import SimpleNamespace

    from harness.results.summary import SweepSummary

    write_run(tmp_path, "a", [{"group": g, "step": 3, "correct": g < 1} for g in range(2)], dataset="own")
    SweepSummary().on_multirun_end(SimpleNamespace(hydra=SimpleNamespace(sweep=SimpleNamespace(dir=str(tmp_path)))))
    lines = (tmp_path / "summary.md").read_text().splitlines()
    assert lines[0].split() == ["|", "dataset", "|", "step", "|", "vanilla", "|"] and "('own'" not in lines[2]
    assert lines[2].split() == ["|", "own", "|", "3", "|", "50", "|"]


def test_runs_are_named_by_forgetting_and_by_what_varies(tmp_path):
    write_run(tmp_path, "a", [{"group": 0, "step": 10, "correct": True}], "nqa", "top2", query_mode="last")
    write_run(tmp_path, "b", [{"group": 0, "step": 10, "correct": False}], "nqa", "top2", "random", query_mode="last")
    write_run(tmp_path, "c", [{"group": 0, "step": 10, "correct": True}], "nqa", "top2", "random", query_mode="mean")
    write_run(tmp_path, "d", [{"group": 1, "step": 10, "correct": True}], "nqa", "top2", "random", query_mode="mean")
    write_run(tmp_path, "merged/c", [{"group": 0, "step": 10, "correct": False}], "nqa", "top2", "random",
              query_mode="mean")                                        # a merged copy: not counted again
    table = sweep_table(tmp_path)
    assert list(table.columns) == ["top2", "top2+random query_mode=last", "top2+random query_mode=mean"]
    assert table.loc[("nqa", "10")].tolist() == [100.0, 0.0, 100.0]
    assert table.loc[("nqa", "groups")].tolist() == [1, 1, 2]           # shards c and d are one run


def test_labels_leave_out_settings_a_run_does_not_have():
    assert run_labels([{"method": {"label": "vanilla"}}, {"method": {"label": "top1", "query_mode": "mean"}},
                       {"method": {"label": "top1", "query_mode": "last"}}]) == \
        ["vanilla", "top1 query_mode=mean", "top1 query_mode=last"]


def test_a_label_that_names_its_knobs_gets_no_override_strings():
    """What varies is appended only where two runs would share a label."""
    ape = [{"method": {"label": f"ape T={t} S={t}", "temperature": t, "scale": t, "select": None}} for t in (0.9, 1.0)]
    epic = [{"method": {"label": "epic k=32", "k": 32}, "formation": f} for f in ("shared_sink", "own_bos")]
    assert run_labels([*ape, *epic]) == ["ape T=0.9 S=0.9", "ape T=1.0 S=1.0", "epic k=32 formation=shared_sink",
                                         "epic k=32 formation=own_bos"]


def test_a_sweep_of_a_task_without_steps_is_summarised_from_its_metrics(tmp_path):
    from types import SimpleNamespace

    from harness.results.summary import SweepSummary

    for name, method, score in (("0_vanilla", "vanilla", 10.0), ("1_top2", "memdefrag_top2", 30.0)):
        write_run(tmp_path, name, [{"group": 0, "subset": "fictional_document", "f1": score}], method=method)
        (tmp_path / name / "metrics.csv").write_text(f"method,subset,f1\n{method},fictional_document,{score}\n")
    SweepSummary().on_multirun_end(SimpleNamespace(hydra=SimpleNamespace(sweep=SimpleNamespace(dir=str(tmp_path)))))
    summary = (tmp_path / "summary.md").read_text()
    assert "| vanilla        | fictional_document |   10 |" in summary and "memdefrag_top2" in summary


def test_a_sweep_of_questions_without_steps_is_summarised_by_its_metrics(tmp_path):
    """LoCoMo's records are judged (`correct`) but asked once, at no step: its sweep gets every run's metrics."""
    from types import SimpleNamespace

    from harness.results.summary import SweepSummary

    write_run(tmp_path, "a", [{"group": 0, "category": 4, "correct": True}])
    (tmp_path / "a" / "metrics.csv").write_text("method,category,f1\nvanilla,4,50.0\n")
    SweepSummary().on_multirun_end(SimpleNamespace(hydra=SimpleNamespace(sweep=SimpleNamespace(dir=str(tmp_path)))))
    assert "| vanilla  |          4 |   50 |" in (tmp_path / "summary.md").read_text()
