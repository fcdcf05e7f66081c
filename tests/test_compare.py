"""`memdefrag compare`: runs paired by config, each kind of difference found and reported, exit 0/1/2."""

import json
import shutil

import pytest
from omegaconf import OmegaConf

from harness.report.compare import Tolerance, compare, compare_runs
from tests.conftest import command

RECORDS = [{"group": g, "step": s, "output": f"answer {g} {s}", "correct": s == 1, "target_rank": 1 + g,
            "seconds": {"trace": 0.1, "generate": 1.0}} for g in (0, 1) for s in (1, 2)]


def a_run(folder, method="vanilla", records=RECORDS, threads=1, accuracy=(0.5, 0.5)):
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(OmegaConf.to_yaml({"method": {"label": method}, "threads": threads,
                                                           "model": {"name": "tiny"}, "task": {
                                                               "_target_": "evals.retention.Retention",
                                                               "groups": 2, "data_dir": str(folder)}}))
    (folder / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (folder / "metrics.csv").write_text("method,step,accuracy\n" + "".join(
        f"{method},{step},{value}\n" for step, value in zip((1, 2), accuracy)))
    return folder


def edited(field, value, where=0):
    records = [dict(r, seconds=dict(r["seconds"])) for r in RECORDS]
    records[where][field] = value
    return records


def compared(tmp_path, b_records=RECORDS, **b):
    a_run(tmp_path / "a" / "vanilla")
    a_run(tmp_path / "b" / "vanilla", records=b_records, **b)
    [report], unpaired = compare(tmp_path / "a", tmp_path / "b", ignore=("task.data_dir",))
    assert unpaired == []
    return report


def test_equal_runs_are_equal_even_with_other_threads_and_paths(tmp_path):
    report = compared(tmp_path, threads=2)
    assert report.equal and report.time_ratio["total"] == pytest.approx(1.0)


def test_a_gpus_record_of_the_phases_that_raised_its_memory_peak_is_not_an_answer_that_moved(tmp_path):
    """`peak_mb` (methods/phase_peaks.py) is the machine's, as `seconds` is: a CUDA run against the CPU's records."""
    report = compared(tmp_path, edited("peak_mb", {"formation": {"start": 10.0, "peak": 20.0}}))
    assert report.equal and report.changed == []


def test_a_changed_output_is_reported_with_both_texts(tmp_path):
    report = compared(tmp_path, edited("output", "another answer"))
    assert not report.equal
    assert report.changed == [{"question": {"group": 0, "step": 1}, "field": "output", "a": "answer 0 1",
                               "b": "another answer"}]


def test_a_correctness_flip_is_its_own_kind(tmp_path):
    report = compared(tmp_path, edited("correct", False))
    assert report.flips == [{"question": {"group": 0, "step": 1}, "field": "correct", "a": True, "b": False}]


def test_two_runs_of_one_config_on_a_side_are_each_compared(tmp_path):
    """A holds the same config twice, one run with a changed answer: both are compared, so the change shows."""
    a_run(tmp_path / "a" / "first")
    a_run(tmp_path / "a" / "second", records=edited("output", "changed"))
    a_run(tmp_path / "b" / "vanilla")
    reports, unpaired = compare(tmp_path / "a", tmp_path / "b", ignore=("task.data_dir",))
    assert unpaired == [] and sorted(r.name for r in reports) == ["first vs vanilla", "second vs vanilla"]
    assert [r.equal for r in sorted(reports, key=lambda r: r.name)] == [True, False]


def test_whether_the_flips_are_more_than_chance_is_tested(tmp_path):
    """Eight questions B alone gets right against none the other way: McNemar's exact p = 2 / 2^8."""
    records = [{"group": g, "step": 1, "output": "x", "correct": False} for g in range(10)]
    a_run(tmp_path / "a" / "vanilla", records=records)
    a_run(tmp_path / "b" / "vanilla", records=[dict(r, correct=r["group"] < 8) for r in records])
    [report], _ = compare(tmp_path / "a", tmp_path / "b", ignore=("task.data_dir",))
    assert report.chance == {"right_only_in_a": 0, "right_only_in_b": 8, "mcnemar_p": pytest.approx(2 / 2 ** 8)}
    one = compared(tmp_path / "one", edited("correct", False))
    assert one.chance["right_only_in_a"] == 1 and one.chance["mcnemar_p"] == 1.0
    from harness.report.compare import markdown
    assert "McNemar's exact p 0.0078, more than chance" in markdown([report], [])


def test_a_density_rank_change_beyond_the_tolerance(tmp_path):
    assert compared(tmp_path, edited("target_rank", 1 + 1e-9)).equal                  # float noise
    report = compared(tmp_path / "x", edited("target_rank", 3))
    assert [(c["field"], c["a"], c["b"]) for c in report.changed] == [("target_rank", 1, 3)]


def test_a_question_answered_on_one_side_only(tmp_path):
    report = compared(tmp_path, RECORDS[:-1])
    assert report.missing == [{"question": {"group": 1, "step": 2}, "in": "A"}]


def test_a_metric_delta_per_step(tmp_path):
    report = compared(tmp_path, accuracy=(0.5, 0.75))
    assert report.metrics == [{"row": {"method": "vanilla", "step": 2}, "metric": "accuracy", "a": 0.5, "b": 0.75,
                               "delta": 0.25}]


def test_time_ratios_fail_only_past_the_allowed_slowdown(tmp_path):
    slower = [dict(r, seconds={"trace": 0.3, "generate": 1.0}) for r in RECORDS]
    a_run(tmp_path / "a" / "vanilla")
    a_run(tmp_path / "b" / "vanilla", records=slower)
    [report], _ = compare(tmp_path / "a", tmp_path / "b", ("task.data_dir",))
    assert report.equal and report.time_ratio["trace"] == pytest.approx(3.0)
    [report], _ = compare(tmp_path / "a", tmp_path / "b", ("task.data_dir",), Tolerance(max_slowdown=1.1))
    assert not report.equal and report.slow


def test_runs_pair_by_config_and_a_run_without_a_pair_is_named(tmp_path):
    a_run(tmp_path / "a" / "0_vanilla")
    a_run(tmp_path / "a" / "1_top2", method="memdefrag_top2")
    a_run(tmp_path / "b" / "x", method="memdefrag_top2")                    # another folder name, same config
    reports, unpaired = compare(tmp_path / "a", tmp_path / "b", ("task.data_dir",))
    assert [r.name for r in reports] == ["1_top2"] and reports[0].equal
    assert unpaired == [("0_vanilla", str(tmp_path / "a" / "0_vanilla"), None)]


def test_the_command_exits_0_equal_1_different_2_bad_input_and_writes_both_reports(tmp_path, monkeypatch, capsys):
    a_run(tmp_path / "a" / "vanilla")
    shutil.copytree(tmp_path / "a", tmp_path / "same")
    a_run(tmp_path / "b" / "vanilla", records=edited("output", "another answer"))
    code, out, _ = command(["memdefrag", "compare", tmp_path / "a", tmp_path / "same", "--ignore", "task.data_dir"],
                           monkeypatch, capsys)
    assert code == 0 and out.startswith("# memdefrag compare: 1 of 1 paired runs equal")
    code, out, _ = command(["memdefrag", "compare", tmp_path / "a", tmp_path / "b", "--ignore", "task.data_dir",
                            "--json", tmp_path / "r.json", "--markdown", tmp_path / "r.md"], monkeypatch, capsys)
    assert code == 1 and out == ""
    assert "1 outputs changed" in (tmp_path / "r.md").read_text()
    machine = json.loads((tmp_path / "r.json").read_text())
    assert machine["equal"] is False and machine["pairs"][0]["changed"][0]["b"] == "another answer"
    for bad, message in (([tmp_path / "nowhere", tmp_path / "b"], "no such folder"),
                         ([tmp_path / "a", tmp_path / "b", "--tol", "-1"], "--tol -1.0 must be >= 0"),
                         ([tmp_path / "a", tmp_path / "b", "--tol-scored", "-0.5"], "--tol-scored -0.5 must be >= 0"),
                         ([tmp_path / "a", tmp_path / "b", "--json", tmp_path / "no" / "r.json"], "does not exist"),
                         ([tmp_path / "a"], "the following arguments are required: b")):
        code, _, err = command(["memdefrag", "compare", *bad], monkeypatch, capsys)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and message in lines[0], lines


def test_what_another_model_scores_is_compared_within_its_own_tolerance(tmp_path):
    """BERTScore moves with its model's library when no answer moved: 1e-4 on it, 1e-6 on everything else."""
    for side, score, f1 in (("a", 9.9527321, 0.5), ("b", 9.9527418, 0.5)):
        (tmp_path / side).mkdir()
        (tmp_path / side / "config.yaml").write_text(
            "method: {label: vanilla}\ntask: {_target_: evals.retention.Retention}\nmodel: {name: tiny}\n")
        (tmp_path / side / "predictions.jsonl").write_text(json.dumps(
            {"group": 0, "id": "x", "output": "same", "bertscore": score, "f1": f1}) + "\n")
    report = compare_runs("pair", tmp_path / "a", tmp_path / "b", Tolerance())
    assert report.equal
    report = compare_runs("pair", tmp_path / "a", tmp_path / "b", Tolerance(scored=1e-6))
    assert [c["field"] for c in report.changed] == ["bertscore"]


def test_an_older_run_is_read_as_this_version_writes_it_before_it_is_compared(tmp_path):
    """A run written before a record field existed (a retriever's `ranked_by`) against a newer one: the field a
    migration would add is added to the older run's records as they are read (the folder left as it is), so the
    pair is equal, not a difference `memdefrag migrate` would have removed."""
    a = a_run(tmp_path / "a" / "vanilla")
    b = a_run(tmp_path / "b" / "vanilla", records=[dict(r, ranked_by="bm25") for r in RECORDS])
    for folder in (a, b):
        config = OmegaConf.load(folder / "config.yaml")
        config.method.ranker = "bm25"
        (folder / "config.yaml").write_text(OmegaConf.to_yaml(config))
    written = (a / "predictions.jsonl").read_text()
    [report], _ = compare(tmp_path / "a", tmp_path / "b", ignore=("task.data_dir",))
    assert report.equal and (a / "predictions.jsonl").read_text() == written
