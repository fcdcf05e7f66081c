"""Result folders resume: finished groups are kept, a group cut short is dropped, damaged records are rerun,
settings must match, one writer at a time, a full disk loses nothing."""

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

import conf  # noqa: F401 - has OmegaConf parse with ConfigLoader
from harness.errors import ConfigError
from harness.results.folder import ConfigLoader, OmegaConfLoader, ResultFolder, read_config

ROOT = Path(__file__).resolve().parents[1]

CFG = OmegaConf.create({"method": {"_target_": "methods.baselines.Vanilla", "label": "vanilla"},
                        "task": {"_target_": "evals.retention.Retention", "groups": 3}, "model": {"name": "tiny"},
                        "threads": 1})


def answer(group, step):
    return {"group": group, "step": step, "correct": True}


def interrupted_run(folder):
    with ResultFolder(folder, CFG) as run:
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
    resumed.close()
    lines = [json.loads(line) for line in (tmp_path / "predictions.jsonl").read_text().splitlines()]
    assert lines == [answer(0, 1), answer(0, 2), answer(1, 1), answer(1, 2)]
    with ResultFolder(tmp_path, CFG) as again:
        assert again.done == {0: 1.5, 1: 2.0}


def test_a_rerun_with_other_settings_is_refused(tmp_path):
    interrupted_run(tmp_path)
    with pytest.raises(ConfigError, match=r"holds a run with other settings \(method.label\)"):
        ResultFolder(tmp_path, OmegaConf.merge(CFG, {"method": {"label": "text"}}))
    with ResultFolder(tmp_path, CFG, resume=False) as fresh:
        assert fresh.done == {}


def test_a_run_older_than_groups_jsonl_is_not_overwritten_by_a_run_with_other_settings(tmp_path):
    """A folder written before groups.jsonl (eight committed runs) holds results all the same: a run with other
    settings is refused there, as in a folder of today's; the same settings start it over (no group is vouched)."""
    interrupted_run(tmp_path)
    (tmp_path / "groups.jsonl").unlink()
    with pytest.raises(ConfigError, match=r"holds a run with other settings \(method.label\)"):
        ResultFolder(tmp_path, OmegaConf.merge(CFG, {"method": {"label": "text"}}))
    with ResultFolder(tmp_path, CFG) as same:
        assert same.done == {}


def test_a_run_started_over_leaves_the_results_it_found_until_its_own_first_write(tmp_path):
    """resume=false replaces a folder's results, but not before the run writes one of its own: a run that stops
    first (a model that fails to load) loses nothing."""
    finished_run(tmp_path)
    before = {name: (tmp_path / name).read_text() for name in ("config.yaml", "predictions.jsonl", "groups.jsonl")}
    with ResultFolder(tmp_path, OmegaConf.merge(CFG, {"method": {"label": "text"}}), resume=False):
        pass                                                          # stopped before its first record
    assert {name: (tmp_path / name).read_text() for name in before} == before
    with ResultFolder(tmp_path, OmegaConf.merge(CFG, {"method": {"label": "text"}}), resume=False) as fresh:
        fresh.add(answer(0, 1))
    assert (tmp_path / "predictions.jsonl").read_text() == json.dumps(answer(0, 1)) + "\n"
    assert "label: text" in (tmp_path / "config.yaml").read_text() and (tmp_path / "groups.jsonl").read_text() == ""


def finished_run(folder, groups=2):
    with ResultFolder(folder, CFG) as run:
        for group in range(groups):
            run.add(answer(group, 1))
            run.add(answer(group, 2))
            run.end_group(group, 1.0 + group)


def test_a_second_writer_is_refused_naming_the_folder_and_the_holder(tmp_path):
    with ResultFolder(tmp_path, CFG):
        with pytest.raises(ConfigError) as caught:
            ResultFolder(tmp_path, CFG)
        message = str(caught.value)
        assert "\n" not in message and f"{tmp_path} is being written by another run (pid {os.getpid()} on" in message
    with ResultFolder(tmp_path, CFG):                                  # released when the first ends
        pass


def test_the_lock_goes_with_a_killed_process(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from omegaconf import OmegaConf; "
                               "from harness.results.folder import ResultFolder; "
                               f"f = ResultFolder({str(tmp_path)!r}, OmegaConf.create({dict(CFG)!r})); "
                               "print('held', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(ConfigError, match=f"pid {holder.pid} on"):
        ResultFolder(tmp_path, CFG)
    holder.kill()
    holder.wait()
    with ResultFolder(tmp_path, CFG):
        pass


@pytest.mark.parametrize("damage", ["cut", "doubled", "lost"])
def test_a_finished_group_whose_records_are_damaged_runs_again(tmp_path, damage):
    finished_run(tmp_path)
    path = tmp_path / "predictions.jsonl"
    lines = path.read_text().splitlines()
    lines = {"cut": lines[:1] + [lines[1][:9]] + lines[2:],             # a record cut mid-line, inside the file
             "doubled": lines + lines[2:],                              # a second writer's copy of group 1
             "lost": lines[1:]}[damage]
    path.write_text("\n".join(lines) + "\n")
    with ResultFolder(tmp_path, CFG) as resumed:
        rerun = {"cut": [0], "doubled": [1], "lost": [0]}[damage]
        assert resumed.rerun == rerun and set(resumed.done) == {0, 1} - set(rerun)
        for group in rerun:
            resumed.add(answer(group, 1))
            resumed.add(answer(group, 2))
            resumed.end_group(group, 3.0)
    with ResultFolder(tmp_path, CFG) as again:
        assert set(again.done) == {0, 1} and again.rerun == []
        assert sorted((r["group"], r["step"]) for r in again.records) == [(0, 1), (0, 2), (1, 1), (1, 2)]


def test_a_full_disk_stops_with_one_line_and_the_resume_loses_nothing(tmp_path, monkeypatch):
    """ENOSPC (simulated: the machine may not mount a small tmpfs) while group 1 is being written."""
    run = ResultFolder(tmp_path, CFG)
    run.add(answer(0, 1))
    run.add(answer(0, 2))
    run.end_group(0, 1.0)
    run.add(answer(1, 1))

    class Full:
        def __init__(self, handle):
            self.handle = handle

        def write(self, text):
            self.handle.write(text[: len(text) // 2])                  # half the line reaches the disk
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def __getattr__(self, name):
            return getattr(self.handle, name)

    run._predictions = Full(run._predictions)
    with pytest.raises(ConfigError) as caught:
        run.add(answer(1, 2))
    assert str(caught.value).startswith(f"cannot write the results in {tmp_path}: No space left on device")
    assert "\n" not in str(caught.value)
    run.close()
    with ResultFolder(tmp_path, CFG) as resumed:                        # room again
        assert resumed.done == {0: 1.0} and resumed.records == [answer(0, 1), answer(0, 2)]
        resumed.add(answer(1, 1))
        resumed.add(answer(1, 2))
        resumed.end_group(1, 2.0)
    with ResultFolder(tmp_path, CFG) as again:
        assert again.records == [answer(0, 1), answer(0, 2), answer(1, 1), answer(1, 2)]


def test_a_rewrite_that_fails_keeps_the_file_it_would_replace(tmp_path, monkeypatch):
    finished_run(tmp_path)
    before = (tmp_path / "predictions.jsonl").read_text()
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left")))
    with pytest.raises(ConfigError, match="cannot write the results in"), ResultFolder(tmp_path, CFG) as run:
        run.add(answer(2, 1))                                         # the first write rewrites the files
    assert (tmp_path / "predictions.jsonl").read_text() == before
    assert not list(tmp_path.glob(".*.partial"))


def test_a_config_that_is_a_folder_is_named_not_taken_for_a_full_disk(tmp_path):
    (tmp_path / "config.yaml").mkdir()
    with pytest.raises(ConfigError) as refused:
        ResultFolder(tmp_path, CFG)
    assert f"{tmp_path / 'config.yaml'}: Is a directory" in str(refused.value)
    assert "make room" not in str(refused.value)


def test_a_run_written_before_a_setting_existed_resumes_at_its_default(tmp_path):
    """memory_on came after runs were written: such a run had the memory where the model is, and resumes."""
    interrupted_run(tmp_path)
    config = OmegaConf.load(tmp_path / "config.yaml")
    config.pop("memory_on", None)
    OmegaConf.save(config, tmp_path / "config.yaml")
    with ResultFolder(tmp_path, OmegaConf.merge(CFG, {"memory_on": "model"})) as resumed:
        assert resumed.done
    with pytest.raises(ConfigError, match=r"other settings \(memory_on\)"):
        ResultFolder(tmp_path, OmegaConf.merge(CFG, {"memory_on": "host"}))


def test_a_config_reads_as_omegaconf_reads_it_and_a_duplicate_key_is_refused(tmp_path, monkeypatch):
    """read_config and OmegaConf.load (Hydra's reads of conf/) parse with libyaml under OmegaConf's rules: every
    committed run config and every shipped config file reads the same as under OmegaConf's own pure-Python loader,
    value types included (1e-3 a float, a date a string); a duplicate key or a file that is not a mapping is one
    line naming the file."""
    def as_omegaconf_reads(path: Path) -> str:
        return OmegaConf.to_yaml(OmegaConf.create(yaml.load(path.read_text(encoding="utf-8"),
                                                            Loader=OmegaConfLoader) or {}))

    loaders = []
    real_load = yaml.load
    monkeypatch.setattr(yaml, "load", lambda stream, Loader: loaders.append(Loader) or real_load(stream, Loader))
    OmegaConf.load(ROOT / "conf" / "config.yaml")
    monkeypatch.undo()
    assert loaders == [ConfigLoader], loaders
    configs = sorted(ROOT.glob("results/**/config.yaml")) + sorted(ROOT.glob("tests/testdata/**/config.yaml"))
    assert configs and all(OmegaConf.to_yaml(read_config(c.parent)) == as_omegaconf_reads(c) for c in configs)
    shipped = sorted(ROOT.glob("conf/**/*.yaml"))
    assert shipped and all(OmegaConf.to_yaml(OmegaConf.load(c)) == as_omegaconf_reads(c) for c in shipped)
    named = "method: {label: x}\ntask: {_target_: evals.retention.Retention}\nmodel: {name: tiny}\n"
    (tmp_path / "config.yaml").write_text(named + "rate: 1e-3\nwhen: 2026-11-27\n")
    assert OmegaConf.to_yaml(read_config(tmp_path)).endswith("rate: 0.001\nwhen: '2026-11-27'\n")
    for text, why in (("rate: 1\nrate: 2\n", "while constructing a mapping"),
                      ("- a\n- b\n", "it holds a list, not a mapping of settings")):
        (tmp_path / "config.yaml").write_text(text)
        with pytest.raises(ConfigError, match=rf"config.yaml cannot be read \({why}"):
            read_config(tmp_path)


def test_a_runs_commit_says_where_its_code_was_modified(tmp_path):
    """run.json's `git`: the checkout's commit, `<commit>-modified` once tracked code differs from it; a changed
    result, test or doc leaves it plain (a run never runs them)."""
    import importlib.util
    import shutil

    project = tmp_path / "project"
    code = project / "harness" / "results" / "folder.py"
    code.parent.mkdir(parents=True)
    shutil.copy(ROOT / "harness" / "results" / "folder.py", code)
    (project / "results").mkdir()
    (project / "results" / "notes.md").write_text("a\n")

    def git(*args):
        return subprocess.run(["git", "-C", str(project), *args], capture_output=True, text=True, check=True).stdout

    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    spec = importlib.util.spec_from_file_location("copied_folder", code)
    copied = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copied)
    head = git("rev-parse", "HEAD").strip()
    (project / "results" / "notes.md").write_text("b\n")
    assert copied.git_hash() == head
    code.write_text(code.read_text() + "# changed\n")
    assert copied.git_hash() == f"{head}-modified"


def test_a_folder_on_a_filesystem_without_locks_is_refused_in_one_line(tmp_path, monkeypatch):
    """A filesystem that refuses locks (Lustre mounted without flock): the one-writer lock cannot be taken, so the
    run is refused in one line naming the folder, before any work, rather than a traceback or two writers unseen."""
    import fcntl

    def no_locks(handle, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with pytest.raises(ConfigError, match=rf"^{tmp_path} cannot be locked for its one writer \(No locks available\): "
                                          r"its filesystem takes no flock; choose an output folder on one that does"):
        ResultFolder(tmp_path, CFG)
