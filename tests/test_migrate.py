"""`memdefrag migrate` and the report's one-line refusals: older run folders read as this version writes them, a
column never split on a setting only some runs recorded, a task's own tables found without editing the report."""

import shutil
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from harness.errors import ConfigError
from harness.report.migrate import migrate_all, with_ranker
from harness.results.folder import RunLock
from harness.report.document import write
from tests.conftest import command
from tests.test_plugins import Passkey as IncompletePasskey
from tests.test_report import fake_run

STEPS = [{"group": g, "step": s, "correct": g == 0, "target_rank": 1, "memory_tokens": 10 * s, "seconds": {"trace": 1}}
         for g in (0, 1) for s in (1, 5)]


def old_run(folder, method="vanilla", **config):
    """A run folder as an early version wrote it: no forgetting, no memory_capacity, metrics without intervals."""
    fake_run(folder, "Retention", method, STEPS, **config)
    written = OmegaConf.to_container(OmegaConf.load(folder / "config.yaml"))
    del written["forgetting"], written["compression"], written["study"]
    (folder / "config.yaml").write_text(OmegaConf.to_yaml(written))
    pd.DataFrame({"method": [method] * 2, "step": [1, 5], "accuracy": [0.5, 0.5], "n": [2, 2]}).to_csv(
        folder / "metrics.csv", index=False)


def test_an_old_run_gets_the_settings_it_had_and_its_intervals_and_a_second_migration_changes_nothing(tmp_path):
    old_run(tmp_path / "r" / "vanilla")
    fake_run(tmp_path / "r" / "text", "Retention", "text", STEPS)
    assert migrate_all(tmp_path)[0] == {tmp_path / "r" / "vanilla": ["config.yaml", "metrics.csv"],
                                     tmp_path / "r" / "text": ["config.yaml"]}
    config = OmegaConf.load(tmp_path / "r" / "vanilla" / "config.yaml")
    assert config.model.memory_capacity == 12800 and config.model.prompt == "chat"    # what every model had then
    assert config.forgetting.label == "unbounded" and config.compression.label == "none" and config.study is None
    metrics = pd.read_csv(tmp_path / "r" / "vanilla" / "metrics.csv")
    assert list(metrics["accuracy"]) == [0.5, 0.5] and metrics["accuracy_low"].between(0, 0.5).all()
    assert migrate_all(tmp_path)[0] == {}


def test_a_retrievers_older_records_say_what_ranked_them():
    ranked, unranked = {"target_rank": 2}, {"target_rank": None, "ranked_by": "bm25"}
    assert with_ranker({"method": {"ranker": "bm25"}}, [ranked, unranked, {}]) == [
        {"target_rank": 2, "ranked_by": "bm25"}, unranked, {}]
    assert with_ranker({"method": {"ranker": "density"}}, [ranked]) == [ranked] == with_ranker({"method": {}}, [ranked])


def test_the_committed_results_need_no_migration(tmp_path):
    """Every committed run folder is in the current format: the report reads them all alike."""
    results = shutil.copytree(Path(__file__).resolve().parents[1] / "results", tmp_path / "results",
                              ignore=shutil.ignore_patterns("figures", "tables", "*.md"))
    assert [str(f.relative_to(results)) for f in migrate_all(results)[0]] == []


def test_the_report_refuses_a_column_split_on_a_setting_only_some_runs_recorded(tmp_path):
    fake_run(tmp_path / "a", "Retention", "vanilla", STEPS, model={"name": "smollm2", "rope_scale": 2})
    fake_run(tmp_path / "b", "Retention", "vanilla", [{**r, "group": r["group"] + 2} for r in STEPS])
    with pytest.raises(ConfigError, match=r"^tab:retention: column vanilla would split on model.rope_scale, which "
                                          r".*/a records and .*/b does not: declare the value runs had before "
                                          r"model.rope_scale existed in harness.results.folder.LATER_MODEL_SETTINGS"):
        write(tmp_path)


def test_the_same_method_is_one_column_where_a_setting_differs_only_between_datasets(tmp_path):
    for dataset, capacity in (("nqa", 12800), ("synthetic", 3200)):
        fake_run(tmp_path / dataset, "Retention", "memdefrag_top2", STEPS, "informativeness", dataset=dataset,
                 model={"name": "smollm2", "memory_capacity": capacity})
    table = write(tmp_path).read_text().split("(`tab:retention_comparison`)")[1].split("\n## ")[0]
    assert "| memdefrag_top2+informativeness |" in table.replace("  ", "") and "memory_capacity" not in table


class Passkey(IncompletePasskey):
    """tests/test_plugins.py's newcomer task made whole (run_group): its class declares its table, and the report
    shows it unedited."""

    tables = {"tab:passkey": "Passkey retrieval, accuracy (%)"}

    def metrics(self, records):
        return pd.DataFrame({"accuracy": [sum(r["correct"] for r in records) / len(records)]})     # a share

    def run_group(self, session, group):
        yield from ()


def test_a_task_declares_its_own_table(tmp_path):
    fake_run(tmp_path / "p", "Retention", "vanilla", [{"group": 0, "correct": True}])
    config = OmegaConf.load(tmp_path / "p" / "config.yaml")
    config.task = {"_target_": f"{__name__}.Passkey", "dataset": "passkey"}
    (tmp_path / "p" / "config.yaml").write_text(OmegaConf.to_yaml(config))
    (tmp_path / "p" / "metrics.csv").write_text("method,accuracy\nvanilla,0\n")    # as an older version wrote it
    section = write(tmp_path).read_text().split("## Passkey retrieval, accuracy (%) (`tab:passkey`)")[1]
    assert "Command: `memdefrag task=passkey`" in section
    table = section.split("\n## ")[0]
    assert "|   accuracy (%) |" in table and "| vanilla  |            100 | smollm2 | passkey   |" in table   # in %


def test_a_tasks_share_prints_in_percent_with_its_interval_as_every_table_does():
    """metrics.csv holds accuracy as a share (0.5); its table prints 50.0 and its Wilson interval, as the summary
    and tab:retention do."""
    from harness.report.sections import in_percent

    metrics = pd.DataFrame({"step": [1, 3], "accuracy": [0.5, 1.0], "accuracy_low": [0.095, 0.439],
                            "accuracy_high": [0.905, 1.0], "n": [2, 3]})
    assert in_percent(metrics).to_dict("list") == {"step": [1, 3], "accuracy (%)": ["50.0 [9.5, 90.5]",
                                                                                    "100.0 [43.9, 100.0]"], "n": [2, 3]}
    assert in_percent(metrics.drop(columns=["accuracy_low", "accuracy_high"]))["accuracy (%)"].tolist() == \
        ["50.0", "100.0"]


@pytest.mark.filterwarnings("error")      # a warning would be a second line on the terminal
def test_migrate_is_a_command_of_its_own(tmp_path, monkeypatch, capsys):
    old_run(tmp_path / "r" / "vanilla")
    code, out, _ = command(["memdefrag", "migrate", tmp_path], monkeypatch, capsys)
    assert code == 0 and out.endswith("1 of 1 run folders migrated\n")
    code, _, err = command(["memdefrag", "migrate", tmp_path / "none"], monkeypatch, capsys)
    assert code == 2 and err.count("\n") == 1 and "no such folder" in err


def test_a_folder_named_by_its_settings_gets_its_plain_name_and_a_second_migration_changes_nothing(tmp_path):
    """As older versions named them (`epic+k=32+formation=own_bos`): renamed to the label's plain words and a digest
    of the name, the files as they were; a plain name stays."""
    fake_run(tmp_path / "peers" / "epic+k=32+formation=own_bos", "Retention", "epic k=32", STEPS)
    fake_run(tmp_path / "locomo" / "vanilla+questions=[2,+2]", "Retention", "vanilla", STEPS)
    fake_run(tmp_path / "peers" / "vanilla", "Retention", "vanilla", STEPS)
    files = {p.relative_to(tmp_path).parts[::2]: p.read_text() for p in tmp_path.glob("*/*/*")}
    changed = migrate_all(tmp_path)[0]
    assert {f.relative_to(tmp_path).as_posix(): c[0] for f, c in changed.items()} == {
        "peers/epic-68f6384e": "renamed from epic+k=32+formation=own_bos",
        "locomo/vanilla-69901919": "renamed from vanilla+questions=[2,+2]",
        "peers/vanilla": "config.yaml"}
    assert {p.relative_to(tmp_path).parts[::2]: p.read_text() for p in tmp_path.glob("*/*/*")
            if p.name == "predictions.jsonl"} == {k: v for k, v in files.items() if k[1] == "predictions.jsonl"}
    assert migrate_all(tmp_path)[0] == {}


def test_a_plain_name_taken_or_a_folder_being_written_is_refused_before_anything_moves(tmp_path):
    fake_run(tmp_path / "epic+k=32", "Retention", "epic k=32", STEPS)
    fake_run(tmp_path / "vanilla+seed=43", "Retention", "vanilla", STEPS)
    fake_run(tmp_path / "epic-4518ce4f", "Retention", "epic k=64", STEPS)
    with pytest.raises(ConfigError, match=r"^.*/epic\+k=32: its plain name epic-4518ce4f is taken \(by .*/epic-4518ce4f"
                                          r"\): move one of them away, then migrate again$"):
        migrate_all(tmp_path)
    (tmp_path / "epic-4518ce4f" / "predictions.jsonl").unlink()      # no run there now: the name is free
    shutil.rmtree(tmp_path / "epic-4518ce4f")
    writer = RunLock(tmp_path / "vanilla+seed=43")
    with pytest.raises(ConfigError, match=r"vanilla\+seed=43 is being written by another run \(pid \d+"):
        migrate_all(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epic+k=32", "vanilla+seed=43"]
    writer.release()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epic+k=32", "vanilla+seed=43"]
    migrate_all(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epic-4518ce4f", "vanilla-2d6df079"]


def test_hydra_names_a_run_folder_plainly(tmp_path):
    """The run and sweep folders Hydra makes for a method whose label names its settings (`ape T=0.9 S=0.9`)."""
    from hydra import compose, initialize_config_module

    with initialize_config_module("conf", version_base="1.3"):
        config = compose("config", overrides=["method=ape"], return_hydra_config=True)
    assert config.method.label == "ape T=0.9 S=0.9"
    assert config.hydra.sweep.subdir == "ape-d8c38b7f_unbounded_synthetic"
    assert config.hydra.run.dir.endswith("_ape-d8c38b7f_unbounded_synthetic") and not set("[], =") & set(
        config.hydra.run.dir)


@pytest.mark.parametrize("written", ['{"seconds": {"tot', "[1, 2]"])
def test_a_run_json_that_cannot_be_read_is_named_in_one_line(written, tmp_path, monkeypatch, capsys):
    fake_run(tmp_path / "r", "Retention", "vanilla", [{"group": 0, "step": 1, "correct": True,
                                                       "beyond_window": 0}], info={"threads": 1})
    (tmp_path / "r" / "run.json").write_text(written)
    code, _, err = command(["memdefrag", "migrate", tmp_path], monkeypatch, capsys)
    assert code == 2 and err.count("\n") == 1 and f"{tmp_path / 'r' / 'run.json'}" in err, err
    assert (tmp_path / "r" / "run.json").read_text() == written
