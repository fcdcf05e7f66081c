"""`memdefrag report` over result folders as users leave them: a rerun copied beside its run, a line doubled, a group
cut by a kill, record files that are not files, a model named by its path, runs older than a setting: it counts
each question once, only from the groups a run finished, and says in one line what it leaves out."""

import hashlib
import json
import os
import re

import pytest

from harness.errors import ConfigError
from harness.report.document import write
from harness.report.migrate import migrate_all
from harness.report.sections import file_part
from harness.results.folder import digest, finished
from methods.window import BEYOND_MARK
from tests.test_report import fake_run

STEPS = (1, 2)


def answers(group: int, right: bool = True, **fields) -> list[dict]:
    """One group's records of a retention run, a question per step."""
    return [{"group": group, "step": s, "correct": right, "beyond_window": 0, **fields} for s in STEPS]


def vouched(folder, groups: list[int]) -> None:
    """groups.jsonl as a run writes it: each group finished, with its records' count and sha256 as now on disk."""
    lines = [line for line in (folder / "predictions.jsonl").read_text().splitlines()]
    by_group = {g: [line for line in lines if json.loads(line)["group"] == g] for g in groups}
    (folder / "groups.jsonl").write_text("".join(json.dumps({"group": g, "seconds": 1.0, "records": len(mine),
                                                             "sha256": digest(mine)}) + "\n"
                                                 for g, mine in by_group.items()))


def rows(readme: str, table: str) -> list[list[str]]:
    """The cells of a table of the README (its header row first, the rule left out)."""
    lines = next(b for b in readme.split(f"(`{table}`)")[1].split("\n\n") if b.startswith("|")).splitlines()
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines[:1] + lines[2:]]


def column(readme: str, label: str) -> list[str]:
    """The cells of tab:retention's column `label`, step rows then the groups row."""
    header, *cells = rows(readme, "tab:retention")
    return [row[header.index(label)] for row in cells]


def test_a_rerun_beside_the_run_it_repeats_is_refused_naming_both_and_shards_pool(tmp_path):
    """Two folders of one configuration answering the same group would count its questions twice (a tighter
    interval, the same `groups` row): refused, both named. Shards answer groups of their own: pooled."""
    fake_run(tmp_path / "a" / "vanilla", "Retention", "vanilla", answers(0))
    fake_run(tmp_path / "b" / "vanilla", "Retention", "vanilla", answers(1, right=False))
    assert column(write(tmp_path).read_text(), "vanilla")[-1] == "2"
    fake_run(tmp_path / "rerun" / "vanilla", "Retention", "vanilla", answers(1))
    with pytest.raises(ConfigError) as refused:
        write(tmp_path)
    assert str(refused.value) == (
        f"tab:retention: row vanilla would count group 1 (seed 42) twice: both {tmp_path / 'b' / 'vanilla'} and "
        f"{tmp_path / 'rerun' / 'vanilla'} answered it; move one of them out of the results (a rerun kept beside the "
        f"run it repeats, or a copy)")


def test_only_the_groups_a_run_finished_count_and_a_doubled_line_counts_none_of_its_group(tmp_path):
    """groups.jsonl vouches for each finished group's records (count and hash), as a resume reads them: a group
    whose line was doubled, and one a kill cut before its end, are left out, not counted twice or in part."""
    run = tmp_path / "r" / "vanilla"
    fake_run(run, "Retention", "vanilla", answers(0) + answers(1, right=False) + answers(2)[:1])
    vouched(run, [0, 1])
    with open(run / "predictions.jsonl", "a") as doubled:
        doubled.write(json.dumps(answers(1, right=False)[0]) + "\n")
    assert finished(run).damaged == [1] and [r["group"] for r in finished(run).records] == [0, 0]
    cells = column(write(tmp_path).read_text(), "vanilla")
    assert cells[0].startswith("100.0") and cells[-1] == "1"


def test_a_migration_leaves_a_group_cut_by_a_kill_to_run_again(tmp_path):
    """An older run folder (a setting missing from its config) with a group that a kill cut short: migrating
    it rehashes the groups it finished, never the cut one, so a resume still runs that group and a report leaves it
    out."""
    run = tmp_path / "r" / "bm25"
    ranked = {"target_rank": 1}                        # a retriever's records older than `ranked_by`: a hook adds it
    fake_run(run, "Retention", "vanilla", answers(0, **ranked) + answers(1, **ranked),
             method_options={"ranker": "bm25"})
    vouched(run, [0, 1])
    lines = (run / "predictions.jsonl").read_text().splitlines()
    (run / "predictions.jsonl").write_text("\n".join(lines[:3] + [lines[3][:9]]))      # group 1's second cut
    before = (run / "groups.jsonl").read_text().splitlines()
    changed, left = migrate_all(tmp_path)
    assert "predictions.jsonl" in changed[run] and not left
    after = (run / "groups.jsonl").read_text().splitlines()
    assert after[0] != before[0] and after[1] == before[1]       # group 0 rehashed over its annotated records
    assert finished(run).damaged == [1] and all(r["ranked_by"] == "bm25" for r in finished(run).records)


def test_record_files_that_are_not_files_are_left_out_in_one_line_and_the_rest_reported(tmp_path, capsys):
    """predictions.jsonl (or groups.jsonl) as a folder, a pipe (which a read would wait on for ever) or a link to
    nothing (a copy that left its target behind): that run is named on stderr and left out, not passed over in
    silence; the others make the report."""
    fake_run(tmp_path / "ok" / "vanilla", "Retention", "vanilla", answers(0))
    dangling = lambda path: path.symlink_to(path.with_name("gone.jsonl"))  # noqa: E731
    for name, make in (("folder", os.mkdir), ("pipe", os.mkfifo), ("dangling", dangling)):
        fake_run(tmp_path / name / "vanilla", "Retention", "vanilla", answers(0))
        (tmp_path / name / "vanilla" / "predictions.jsonl").unlink()
        make(tmp_path / name / "vanilla" / "predictions.jsonl")
    fake_run(tmp_path / "groups" / "vanilla", "Retention", "vanilla", answers(1))
    os.mkdir(tmp_path / "groups" / "vanilla" / "groups.jsonl")
    capsys.readouterr()
    assert column(write(tmp_path).read_text(), "vanilla")[-1] == "1"
    err = capsys.readouterr().err
    for name in ("folder", "pipe", "dangling", "groups"):
        assert f"{tmp_path / name / 'vanilla'}" in err, err
    assert f"{tmp_path / 'ok'}" not in err


@pytest.mark.parametrize("config", ["", "rate: 1e-3\n", "method: {label: vanilla}\n", "method: vanilla\ntask: x\n",
                                    "method: [vanilla]\ntask: {_target_: evals.retention.Retention}\n"])
def test_a_config_that_names_no_run_is_left_out_in_one_line_by_the_report_and_migrate(tmp_path, capsys, config):
    """An empty config.yaml, another tool's, or one lacking a run's method, task or model: report and migrate name
    it on stderr and leave its folder as it is (a traceback before); the other runs make the report."""
    fake_run(tmp_path / "ok" / "vanilla", "Retention", "vanilla", answers(0))
    other = tmp_path / "other" / "vanilla"
    fake_run(other, "Retention", "vanilla", answers(1))
    (other / "config.yaml").write_text(config)
    before = {p.name: p.read_bytes() for p in other.iterdir() if p.is_file()}
    capsys.readouterr()
    assert column(write(tmp_path).read_text(), "vanilla")[-1] == "1"
    assert migrate_all(tmp_path)[1] == [other]
    err = capsys.readouterr().err
    assert f"memdefrag report: left out 1 run folders that cannot be read as runs: {other / 'config.yaml'}" in err
    assert "Traceback" not in err, err
    assert {p.name: p.read_bytes() for p in other.iterdir() if p.is_file()} == before


def test_a_model_named_by_its_path_gets_a_table_of_its_own_in_files_it_can_name(tmp_path):
    """model=hf names a model by its source (a folder, a hub id): its tables and figure take a file name made of
    it, not a path, and two names that differ only in what a file name cannot hold take two."""
    fake_run(tmp_path / "r" / "vanilla", "Retention", "vanilla", answers(0), model={"name": "/tmp/ckpt/tiny llama"})
    readme = write(tmp_path).read_text()
    assert "Knowledge retention on /tmp/ckpt/tiny llama" in readme
    name = f"retention__tmp_ckpt_tiny_llama_{hashlib.sha256(b'/tmp/ckpt/tiny llama').hexdigest()[:8]}"
    assert (tmp_path / "tables" / f"{name}.md").is_file() and (tmp_path / "figures" / f"{name}.png").is_file()
    assert file_part("a/b") != file_part("a-b") and file_part("qwen25_coder_05b") == "qwen25_coder_05b"


def test_a_run_older_than_a_setting_shares_a_column_with_one_at_its_default_and_not_with_another(tmp_path):
    """A run made before `reuse_formed` and `formation_batch` existed beside one that records them at their
    defaults: one column, not a refusal asking for a code change; beside one formed otherwise (a timed run's
    variant): columns of their own, as in tab:runtime."""
    fake_run(tmp_path / "old" / "vanilla", "Retention", "vanilla", answers(0))
    fake_run(tmp_path / "new" / "vanilla", "Retention", "vanilla", answers(1))
    config = tmp_path / "new" / "vanilla" / "config.yaml"
    config.write_text(config.read_text() + "reuse_formed: true\nformation_batch: null\n")
    assert column(write(tmp_path).read_text(), "vanilla")[-1] == "2"
    config.write_text(config.read_text().replace("formation_batch: null", "formation_batch: batched"))
    header = rows(write(tmp_path).read_text(), "tab:retention")[0]
    assert header[2:] == ["vanilla formation_batch=batched", "vanilla formation_batch=None"]      # new/ before old/


def test_timed_variants_and_a_cpu_and_a_gpu_run_of_one_config_are_rows_and_columns_of_their_own(tmp_path):
    """tab:runtime: Top-2 formed solo and batched (results/run_gpu.sh's variants) are two columns, and one config
    timed on a CPU and on a GPU two rows; neither is a rerun counted twice."""
    for name, batch, device in (("solo", "solo", "cpu"), ("batched", "batched", "cpu"), ("gpu", "solo", "cuda:0")):
        info = {"seconds": {"per_group": 2.0}, "groups": 1, "model": "smollm2", "device": device}
        fake_run(tmp_path / name / "memdefrag_top2", "Retention", "memdefrag_top2", answers(0), "informativeness",
                 info, study="runtime")
        config = tmp_path / name / "memdefrag_top2" / "config.yaml"
        config.write_text(config.read_text() + f"formation_batch: {batch}\n")
    table = rows(write(tmp_path).read_text(), "tab:runtime")
    assert table[0][1:] == ["memdefrag_top2+informativeness formation_batch=batched",
                            "memdefrag_top2+informativeness formation_batch=solo"]
    assert [row[0] for row in table[1:]] == ["nqa (smollm2, cpu)", "nqa (smollm2, cuda:0)"]


def test_a_run_whose_run_json_is_missing_is_still_marked_where_it_read_past_the_window(tmp_path):
    """A killed run writes no run.json: the mark of a read past the trained window comes from its records."""
    fading = [{"group": 0, "step": s, "correct": True, "memory_tokens": 100 * s, "beyond_window": 5 * (s - 1),
               "density": {"last": [0.5 / s, 0.1], "mean": [0.4 / s, 0.2 * s]}} for s in (1, 2, 3)]
    fake_run(tmp_path / "d" / "text", "Distortion", "text", fading)
    readme = write(tmp_path).read_text()
    assert f"### nqa, text memory (1 groups, `d/text`) {BEYOND_MARK}" in readme


def test_the_report_says_which_folders_it_renamed(tmp_path, capsys):
    """A folder named the old way (brackets, spaces) is renamed before the report reads it, and the report says so
    as `memdefrag migrate` does."""
    fake_run(tmp_path / "r" / "my run", "Retention", "vanilla", answers(0))
    capsys.readouterr()
    write(tmp_path)
    assert f"migrated: {tmp_path / 'r' / 'my+run'} (renamed from my run" in capsys.readouterr().out


def test_a_timed_run_resumed_under_other_timing_settings_is_named_in_its_table_s_caption(tmp_path):
    """tab:runtime's caption names a run whose seconds per group mix two settings (run.json's seconds.retimed)."""
    info = {"seconds": {"per_group": 3.0, "retimed": {"threads": [1, 2]}}, "model": "smollm2", "device": "cpu"}
    fake_run(tmp_path / "t" / "vanilla", "Retention", "vanilla", answers(0), "informativeness", info, study="runtime")
    readme = write(tmp_path).read_text()
    caption = readme.split("## Time per group (s)")[1].split("\n")[0]
    assert caption.endswith("; vanilla+informativeness resumed under other timing settings, its seconds mixing both "
                            "(run.json: seconds.retimed) (`tab:runtime`)"), caption


def test_shards_of_a_timed_run_pool_their_seconds_over_their_groups_and_their_peaks_by_the_highest(tmp_path):
    """tab:runtime's cell of a run made in shards is its seconds per group over all its groups (not the slower
    shard's); tab:gpu-memory's, the highest peak of its shards."""
    for shard, (group, groups, seconds, peak) in enumerate(((0, 1, 2.0, 1000), (1, 3, 4.0, 2000))):
        info = {"seconds": {"per_group": seconds}, "groups": groups, "model": "smollm2", "device": "cpu",
                "peak_memory": {"cpu_rss_mb": peak}}
        for study in ("runtime", "gpu_memory"):
            fake_run(tmp_path / study / f"{shard}_vanilla", "Retention", "vanilla", answers(group), "informativeness",
                     info, study=study)
    readme = write(tmp_path).read_text()
    assert rows(readme, "tab:runtime")[1] == ["nqa (smollm2, cpu)", "3.5"]
    assert rows(readme, "tab:gpu-memory")[1] == ["nqa (smollm2, cpu)", f"{2000 * 2**20 / 1e9:.2f}".rstrip("0")]


def test_a_table_of_a_model_given_by_its_source_says_the_command_that_makes_its_runs(tmp_path):
    """A model no conf/model/ file names (model=hf model.source=...): its table's command names its source, so it
    can be run as shown; a shipped model's names its choice."""
    model = {"name": "tiny", "source": "/ckpt/tiny"}
    fake_run(tmp_path / "r" / "vanilla", "Retention", "vanilla", answers(0), model=model)
    fake_run(tmp_path / "r" / "gemma", "Retention", "vanilla", answers(0), model={"name": "gemma3_270m"})
    readme = write(tmp_path).read_text()
    assert "Command: `memdefrag experiment=accuracy model=hf model.source=/ckpt/tiny model.name=tiny`" in readme
    assert "Command: `memdefrag experiment=accuracy model=gemma3_270m`" in readme


@pytest.mark.parametrize("source", ["/data/my ckpt,v2", 'C:\\ckpts\\it\'s "the" one', "D:\\my ckpts\\", "~/ckpt",
                                    "/data/ckpté"])
def test_a_source_path_with_a_space_or_a_comma_is_quoted_so_that_the_command_runs_as_shown(tmp_path, source):
    """Hydra reads a comma as a sweep and the shell splits at a space: the command a table names quotes such a
    source for both, and gives the path back whole."""
    import shlex

    from hydra.core.override_parser.overrides_parser import OverridesParser

    fake_run(tmp_path / "r" / "vanilla", "Retention", "vanilla", answers(0), model={"name": "tiny", "source": source})
    command = re.search(r"Command: `memdefrag experiment=accuracy (.*)`", write(tmp_path).read_text()).group(1)
    parsed = OverridesParser.create().parse_overrides(shlex.split(command))
    assert {o.key_or_group: o.value() for o in parsed} == {"model": "hf", "model.source": source, "model.name": "tiny"}
