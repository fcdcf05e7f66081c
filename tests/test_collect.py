"""`memdefrag collect`: runs copied under the labels their tables print, the report rebuilt, another run's
results never overwritten."""

import pytest

from harness.report.collect import collect
from harness.errors import ConfigError
from harness.results.folder import folder_name
from tests.conftest import command
from tests.test_report import fake_run

STEPS = [{"group": 0, "step": s, "correct": s == 1, "target_rank": 1, "seconds": {"formation": 0.5}} for s in (1, 5)]


def test_runs_land_under_their_table_labels_and_the_report_is_rebuilt(tmp_path, monkeypatch, capsys):
    sweep = tmp_path / "sweep"
    fake_run(sweep / "0", "Retention", "vanilla", STEPS, dataset="nqa")
    fake_run(sweep / "1", "Retention", "memdefrag_top2", STEPS, "informativeness", dataset="nqa")
    fake_run(sweep / "2", "Retention", "memdefrag_top2", STEPS, "informativeness", dataset="squad",
             compression={"label": "self_information", "rate": 0.5})
    results = tmp_path / "results"
    code, out, err = command(["memdefrag", "collect", sweep, "retention", "--into", results], monkeypatch, capsys)
    assert code == 0, err
    assert sorted(p.relative_to(results / "retention").as_posix() for p in (results / "retention").glob("*/*")) == [
        "nqa/memdefrag_top2+informativeness", "nqa/vanilla", "squad/memdefrag_top2+informativeness+self_information@0.5"]
    assert (results / "retention" / "nqa" / "vanilla" / "predictions.jsonl").read_text() == \
        (sweep / "0" / "predictions.jsonl").read_text()
    assert "collected: " in out and (results / "README.md").is_file()


def test_a_place_taken_by_other_settings_is_refused_before_anything_is_copied(tmp_path):
    fake_run(tmp_path / "old" / "0", "Retention", "vanilla", STEPS, dataset="nqa")
    collect(tmp_path / "old", "retention", tmp_path / "results")
    fake_run(tmp_path / "new" / "0", "Retention", "vanilla", STEPS, dataset="nqa", study="other")
    fake_run(tmp_path / "new" / "1", "Retention", "none", STEPS, dataset="nqa")
    with pytest.raises(ConfigError, match="holds a run with other settings"):
        collect(tmp_path / "new", "retention", tmp_path / "results")
    assert not (tmp_path / "results" / "retention" / "nqa" / "none").exists()
    collect(tmp_path / "old", "retention", tmp_path / "results")          # the same run again: refreshed


def test_a_run_told_apart_from_one_already_there_gets_a_plain_name_of_its_own(tmp_path):
    """EPIC under formation=own_bos beside the EPIC already collected: its own folder, named by its label's plain
    words and a digest of the label (`epic k=32 formation=own_bos`), no '=' or space; the run already there is
    found again where it lies."""
    fake_run(tmp_path / "old" / "0", "Retention", "epic k=32", STEPS, dataset="synthetic")
    assert collect(tmp_path / "old", "peers", tmp_path / "results") == [
        tmp_path / "results" / "peers" / "synthetic" / "epic-4518ce4f"]
    fake_run(tmp_path / "new" / "0", "Retention", "epic k=32", STEPS, dataset="synthetic")
    config = tmp_path / "new" / "0" / "config.yaml"
    config.write_text(config.read_text().replace("formation: shared_sink", "formation: own_bos"))
    assert collect(tmp_path / "new", "peers", tmp_path / "results") == [
        tmp_path / "results" / "peers" / "synthetic" / "epic-68f6384e"]
    assert collect(tmp_path / "old", "peers", tmp_path / "results") == [
        tmp_path / "results" / "peers" / "synthetic" / "epic-4518ce4f"]


@pytest.mark.parametrize("label, name", [
    ("vanilla", "vanilla"), ("memdefrag_top2+informativeness+self_information@0.5",
                             "memdefrag_top2+informativeness+self_information@0.5"),
    ("ape T=0.9 S=0.9+informativeness", "ape+informativeness-2b096ba6"),
    ("memdefrag_top2+informativeness memory_capacity=7900 prompt=chat categories=None protocol=locomo "
     "questions=[2, 2, 2, 10, 2] trace_layers=False", "memdefrag_top2+informativeness-56e058b8"),
    ("T=1", "run-407cabe5")])
def test_a_folder_name_is_plain_short_and_its_own_name(label, name):
    """A label's plain words kept, the rest a digest of the label; the older name (spaces as '+') gives the same."""
    assert folder_name(label) == name == folder_name(name) == folder_name(label.replace(" ", "+"))


def test_shards_of_one_run_are_sent_to_merge(tmp_path):
    for index in (0, 1):
        fake_run(tmp_path / "sweep" / str(index), "Retention", "vanilla", STEPS, dataset="nqa")
        config = tmp_path / "sweep" / str(index) / "config.yaml"
        config.write_text(config.read_text() + f"shard: {index}/2\n")
    with pytest.raises(ConfigError, match=r"are shards of one run: join them with `memdefrag merge .*sweep`"):
        collect(tmp_path / "sweep", "retention", tmp_path / "results")


@pytest.mark.filterwarnings("error")      # a warning would be a second line on the terminal
def test_nothing_to_collect_is_one_clear_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, _, err = command(["memdefrag", "collect", tmp_path, "retention"], monkeypatch, capsys)
    assert code == 2 and err.count("\n") == 1 and "holds no run" in err
