"""Whole runs through the real harness on the tiny checkpoint: sharding, merging, resuming."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from harness.errors import ConfigError
from harness.results.folder import ResultFolder
from harness.running.runner import run
from harness.running.shards import merge_sweep, parse
from tests.conftest import command, tiny_overrides, tiny_run_config

RUN = ("method=memdefrag_top1", "forgetting=random", "model.memory_capacity=200", "task.groups=4")


def answers(folder):
    """What a run answered, without its timings."""
    return [{k: v for k, v in json.loads(line).items() if k != "seconds"}
            for line in (folder / "predictions.jsonl").read_text().splitlines()]


def test_merged_shards_equal_the_unsharded_run(tmp_path, tiny_checkpoint):
    """Shards named as a sweep tells them apart merge into a run named without their shard."""
    run(tiny_run_config(tiny_checkpoint, *RUN), str(tmp_path / "whole"))
    for i in range(2):
        shard = tmp_path / "sweep" / f"memdefrag_top1_random_synthetic_shard-{i}-2"
        run(tiny_run_config(tiny_checkpoint, *RUN, f"shard={i}/2"), str(shard))
        (shard / ".hydra").mkdir()                     # what a Hydra job leaves beside the results: no shard
        shutil.copy(shard / "config.yaml", shard / ".hydra" / "config.yaml")
    [merged] = merge_sweep(tmp_path / "sweep")
    assert merged == tmp_path / "sweep" / "merged" / "memdefrag_top1_random_synthetic"
    assert answers(merged) == answers(tmp_path / "whole")
    assert (merged / "metrics.csv").read_text() == (tmp_path / "whole" / "metrics.csv").read_text()
    assert json.loads((merged / "run.json").read_text())["groups"] == 4


def test_shards_run_with_other_threads_merge_and_a_shard_twice_is_named(tmp_path, tiny_checkpoint):
    for i in range(2):
        run(tiny_run_config(tiny_checkpoint, *RUN, f"shard={i}/2", f"threads={i + 1}"), str(tmp_path / f"{i}_run"))
    [merged] = merge_sweep(tmp_path)
    assert json.loads((merged / "run.json").read_text())["groups"] == 4
    shutil.rmtree(tmp_path / "merged")
    shutil.copytree(tmp_path / "1_run", tmp_path / "2_run")
    with pytest.raises(ConfigError, match=r"shards \['1/2'\] of .* are there twice .*: keep one of each"):
        merge_sweep(tmp_path)


def test_incomplete_shards_are_named(tmp_path, tiny_checkpoint):
    run(tiny_run_config(tiny_checkpoint, *RUN, "shard=1/3"), str(tmp_path / "1_run"))
    with pytest.raises(ConfigError, match=r"incomplete: found \['1/3'\]"):
        merge_sweep(tmp_path)


@pytest.mark.parametrize("spec", ["2/2", "a/b", "1", "-1/2"])
def test_bad_shards_are_refused(spec):
    with pytest.raises(ConfigError, match="must be 'i/n'"):
        parse(spec)


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_a_run_killed_mid_group_resumes_to_the_same_result(tmp_path, tiny_checkpoint, how):
    """Killed mid-way through a group: the same command resumes it. SIGKILL ends it where it is; SIGTERM (`kill`,
    `timeout`) ends it as Ctrl-C does: one line saying what it kept, exit status 130."""
    overrides = [*RUN, "task.groups=12", "task.updates=4"]
    run(tiny_run_config(tiny_checkpoint, *overrides), str(tmp_path / "whole"))
    command = [sys.executable, "-m", "harness", *tiny_overrides(tiny_checkpoint), *overrides,
               f"hydra.run.dir={tmp_path / 'killed'}"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=os.environ, text=True)
    marker = tmp_path / "killed" / "groups.jsonl"
    while not (marker.exists() and marker.read_text().count("\n") >= 2):
        assert process.poll() is None, "the run ended before it could be killed"
        time.sleep(0.02)
    process.send_signal(how)                                             # mid-way through a group
    err = process.communicate(timeout=60)[1]
    finished = marker.read_text().count("\n")
    if how == signal.SIGKILL:
        assert process.returncode == -9
    else:
        assert process.returncode == 130 and "Traceback" not in err, err[-2000:]
        assert err.splitlines()[-1] == (f"memdefrag: interrupted: {finished} of 12 groups finished, kept in "
                                        f"{tmp_path / 'killed'}; the same command given that folder (hydra.run.dir, "
                                        f"or a sweep's hydra.sweep.dir) resumes it")
    assert 2 <= finished < 12
    done = subprocess.run(command, capture_output=True, text=True, env=os.environ, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert answers(tmp_path / "killed") == answers(tmp_path / "whole")


def test_tracer_sweep_records_a_layer_that_memdefrag_then_uses(tmp_path, tiny_checkpoint, monkeypatch, capsys):
    monkeypatch.setenv("MEMDEFRAG_TRACERS", str(tmp_path / "tracers.yaml"))
    model = [f"model.source={tiny_checkpoint}", "model.name=tiny", "model.memory_capacity=null"]
    code, _, err = command(["memdefrag", "tracer-sweep", *model, "task.dataset=synthetic", "task.groups=2",
                            "task.fragments=3", f"hydra.run.dir={tmp_path / 'sweep'}"], monkeypatch, capsys)
    assert code == 0, err[-2000:]
    import yaml
    choice = yaml.safe_load((tmp_path / "tracers.yaml").read_text())["tiny"]
    assert choice["tracer_layer"] in (0, 1, 2) and choice["query_mode"] in ("last", "mean")  # every layer
    assert choice["swept"].startswith("layers all")
    cfg = tiny_run_config(tiny_checkpoint, "model.name=tiny", "model.tracer_layer=${tracer:tracer_layer,none}",
                          "model.query_mode=${tracer:query_mode,last}")
    assert (cfg.method.tracer_layer, cfg.method.query_mode) == (choice["tracer_layer"], choice["query_mode"])


def test_a_sequential_sweep_forms_each_distractor_once(tmp_path, tiny_checkpoint, monkeypatch):
    from harness.running import runner
    from methods.formation import Former
    monkeypatch.setattr(runner, "_FORMED", {})       # as in a fresh process
    prefilled = []
    original = Former._prefill
    monkeypatch.setattr(Former, "_prefill", lambda self, ids, text, fid: prefilled.append(text) or original(self, ids, text, fid))
    run(tiny_run_config(tiny_checkpoint, *RUN), str(tmp_path / "first"))
    first = list(prefilled)
    run(tiny_run_config(tiny_checkpoint, *RUN, "method=vanilla"), str(tmp_path / "second"))
    second = prefilled[len(first):]
    assert len(set(first)) == len(first)             # within a run: each distractor once, across its groups
    targets = 4                                      # task.groups: each run forms its own targets
    assert len(second) == targets < len(first)       # the second run forms no distractor again


def test_a_second_run_into_a_folder_being_written_is_refused_and_nothing_is_doubled(tmp_path, tiny_checkpoint):
    """The first run is paused (SIGSTOP) mid-way, holding its folder, while the second starts."""
    command = [sys.executable, "-m", "harness", *tiny_overrides(tiny_checkpoint), *RUN, "task.groups=12",
               "task.updates=4", f"hydra.run.dir={tmp_path / 'run'}"]
    first = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ)
    marker = tmp_path / "run" / "groups.jsonl"
    while not (marker.exists() and marker.read_text().count("\n") >= 1):
        assert first.poll() is None, "the first run ended before it could be paused"
        time.sleep(0.01)
    first.send_signal(signal.SIGSTOP)
    try:
        second = subprocess.run(command, capture_output=True, text=True, env=os.environ, timeout=600)
    finally:
        first.send_signal(signal.SIGCONT)
    assert first.wait(timeout=600) == 0
    lines = second.stderr.strip().splitlines()
    assert second.returncode == 2 and len(lines) == 1, second.stderr[-2000:]
    assert lines[0].startswith(f"memdefrag: error: {tmp_path / 'run'} is being written by another run (pid "
                               f"{first.pid} on ")
    keys = [(r["group"], r["step"]) for r in answers(tmp_path / "run")]
    assert len(keys) == len(set(keys)) == 12 * 4


def test_a_sweep_reordered_and_extended_resumes_into_the_folders_it_wrote(tmp_path, tiny_checkpoint, monkeypatch,
                                                                          capsys):
    """A sweep's folders are named by what tells its jobs apart (`_backend-fast`), not by their place in it: the
    same sweep with its values reordered and a method added finds its finished runs where it left them, and runs
    only the new jobs; with a setting swept for the first time (`seed=0,1`), each earlier run is renamed for the
    job that resumes it."""
    sweep = [*tiny_overrides(tiny_checkpoint), "task.groups=1", "task.updates=2", f"hydra.sweep.dir={tmp_path}"]
    code, _, err = command(["memdefrag", "-m", "method=none", "backend=fast,hidden_prefix", *sweep], monkeypatch,
                           capsys)
    assert code == 0, err
    first = {"none_unbounded_synthetic_backend-fast", "none_unbounded_synthetic_backend-hidden_prefix"}
    assert {p.parent.name for p in tmp_path.glob("*/run.json")} == first
    written = {name: (tmp_path / name / "predictions.jsonl").read_bytes() for name in first}
    code, _, err = command(["memdefrag", "-m", "method=vanilla,none", "backend=hidden_prefix,fast", *sweep],
                           monkeypatch, capsys)
    assert code == 0, err
    added = {"vanilla_unbounded_synthetic_backend-fast", "vanilla_unbounded_synthetic_backend-hidden_prefix"}
    assert {p.parent.name for p in tmp_path.glob("*/run.json")} == first | added
    assert {name: (tmp_path / name / "predictions.jsonl").read_bytes() for name in first} == written
    code, out, err = command(["memdefrag", "-m", "method=vanilla,none", "backend=hidden_prefix,fast", "seed=1,0",
                              *sweep], monkeypatch, capsys)
    assert code == 0, err
    assert f"memdefrag: {tmp_path / 'none_unbounded_synthetic_backend-fast'} holds the run of " \
           f"none_unbounded_synthetic_backend-fast_seed-0: renamed so, to resume it there" in out
    assert {p.parent.name for p in tmp_path.glob("*/run.json")} == {
        f"{name}_seed-{seed}" for name in first | added for seed in (0, 1)}
    assert {name: (tmp_path / f"{name}_seed-0" / "predictions.jsonl").read_bytes() for name in first} == written


def test_a_finished_run_run_again_loads_no_weights_and_leaves_its_files_as_they_are(tmp_path, tiny_checkpoint,
                                                                                     monkeypatch):
    """The same command again over a finished run: nothing to run, so no model loads and run.json (its measured
    peak memory among it) stays the one the run wrote; resume=false runs it again."""
    from harness.running import runner
    folder = tmp_path / "run"
    run(tiny_run_config(tiny_checkpoint, *RUN), str(folder))
    written = {name: (folder / name).read_bytes() for name in ("run.json", "metrics.csv", "predictions.jsonl")}
    monkeypatch.setattr(runner, "ready", lambda *args: pytest.fail("a model was loaded"))
    run(tiny_run_config(tiny_checkpoint, *RUN), str(folder))
    assert {name: (folder / name).read_bytes() for name in written} == written
    with pytest.raises(pytest.fail.Exception, match="a model was loaded"):
        run(tiny_run_config(tiny_checkpoint, *RUN, "resume=false"), str(folder))
    assert (folder / "run.json").read_bytes() == written["run.json"]        # a run that wrote nothing leaves them
    with ResultFolder(folder, tiny_run_config(tiny_checkpoint, *RUN), resume=False) as again:
        again.add({"group": 0, "step": 1})          # its first write: the files saying the run finished go
        assert not (folder / "run.json").exists() and not (folder / "metrics.csv").exists()


def test_a_shard_restarted_and_killed_is_not_merged_as_finished(tmp_path, tiny_checkpoint):
    """A shard whose groups.jsonl vouches for fewer groups than its run.json says it ran (a restart under
    resume=false cut short, a group's records damaged) is refused by the merge, not merged without its groups."""
    for i in range(2):
        run(tiny_run_config(tiny_checkpoint, *RUN, f"shard={i}/2"), str(tmp_path / f"{i}_run"))
    groups = tmp_path / "1_run" / "groups.jsonl"
    groups.write_text(groups.read_text().splitlines()[0] + "\n")
    with pytest.raises(ConfigError, match=r"shard .*1_run has not finished: its groups.jsonl vouches for 1 of its 2 "
                                          r"groups; rerun it, it resumes"):
        merge_sweep(tmp_path)


def test_ctrl_c_is_one_line_and_exit_status_130_and_a_run_says_what_it_kept(tmp_path, tiny_checkpoint, monkeypatch,
                                                                            capsys):
    """Ctrl-C (a KeyboardInterrupt) in any command: one line, exit status 130, no traceback; in a run, the line
    says how many groups it kept and in which folder; inside a submitit job it is raised, for the job to fail."""
    from harness.errors import stops_on_config_error
    from harness.running import runner

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "_run_groups", interrupted)
    with pytest.raises(SystemExit) as ended, stops_on_config_error("memdefrag"):
        run(tiny_run_config(tiny_checkpoint, *RUN), str(tmp_path))
    assert ended.value.code == 130
    assert capsys.readouterr().err == (f"memdefrag: interrupted: 0 of 4 groups finished, kept in {tmp_path}; the same "
                                       f"command given that folder (hydra.run.dir, or a sweep's hydra.sweep.dir) "
                                       f"resumes it\n")
    with pytest.raises(SystemExit) as ended, stops_on_config_error("memdefrag compare"):
        raise KeyboardInterrupt
    assert ended.value.code == 130 and capsys.readouterr().err == "memdefrag compare: interrupted\n"
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    with pytest.raises(KeyboardInterrupt), stops_on_config_error("memdefrag"):
        raise KeyboardInterrupt


def test_a_resume_under_other_threads_says_its_seconds_mix_them(tmp_path, tiny_checkpoint):
    """threads may change on resume (no answer changes), but the seconds per group then mix them: each group's
    threads, as in effect, stay in groups.jsonl through every later resume, and the folder says which took more
    than one value (run.json's seconds.retimed; a warning as it resumes). A group older than that record counts
    under its config's threads, where set. reuse_formed and formation_batch make another run: refused."""
    def group(index: int, threads: int) -> dict:
        with ResultFolder(tmp_path, tiny_run_config(tiny_checkpoint, *RUN, f"threads={threads}")) as folder:
            folder.timing = {"threads": threads}
            folder.add({"group": index, "step": 1})
            folder.end_group(index, 1.0)
            return folder.retimed()

    assert group(0, 1) == {} and group(1, 1) == {}
    assert group(2, 2) == {"threads": [1, 2]}
    assert group(3, 2) == {"threads": [1, 2]}                   # a third process: the first groups' still said
    lines = [json.loads(line) for line in (tmp_path / "groups.jsonl").read_text().splitlines()]
    assert [line["timed_under"]["threads"] for line in lines] == [1, 1, 2, 2]
    (tmp_path / "groups.jsonl").write_text("".join(json.dumps({k: v for k, v in line.items() if k != "timed_under"})
                                                   + "\n" for line in lines))      # as written before the record
    with ResultFolder(tmp_path, tiny_run_config(tiny_checkpoint, *RUN, "threads=2")) as folder:
        assert folder.retimed({"threads": 3}) == {"threads": [2, 3]}
    with pytest.raises(ConfigError, match=r"holds a run with other settings \(formation_batch\)"):
        ResultFolder(tmp_path, tiny_run_config(tiny_checkpoint, *RUN, "threads=2", "formation_batch=batched"))


def test_a_run_names_its_device_and_a_resume_on_another_says_its_seconds_mix_them(tmp_path, tiny_checkpoint,
                                                                                  monkeypatch):
    """model.device=auto (every shipped model's) may pick another device on resume: each group records the name
    of the one it ran on (a CPU's model, a GPU's name), run.json names the device, and a resume on another says
    that its seconds per group mix them, as under other threads."""
    from harness.measurement.device import device_name
    from harness.running import runner

    here = device_name(torch.device("cpu"))
    run(tiny_run_config(tiny_checkpoint, *RUN), str(tmp_path))
    assert json.loads((tmp_path / "run.json").read_text())["device_name"] == here
    groups = (tmp_path / "groups.jsonl").read_text().splitlines()
    assert all(json.loads(line)["timed_under"]["device_name"] == here for line in groups)
    (tmp_path / "groups.jsonl").write_text("\n".join(groups[:-1]) + "\n")          # killed before its last group
    monkeypatch.setattr(runner, "device_name", lambda device: "NVIDIA H200")        # resumed on another machine
    run(tiny_run_config(tiny_checkpoint, *RUN), str(tmp_path))
    info = json.loads((tmp_path / "run.json").read_text())
    assert info["seconds"]["retimed"] == {"device_name": [here, "NVIDIA H200"]}
    assert info["device_name"] == f"{here} + NVIDIA H200"               # the table's row names both
    lines = [json.loads(line) for line in (tmp_path / "groups.jsonl").read_text().splitlines()[:-1]]
    (tmp_path / "groups.jsonl").write_text("".join(json.dumps({k: v for k, v in line.items() if k != "timed_under"})
                                                   + "\n" for line in lines))     # written before the record,
    (tmp_path / "run.json").write_text(json.dumps({**info, "device_name": "NVIDIA H100 80GB HBM3"}))  # run.json's
    run(tiny_run_config(tiny_checkpoint, *RUN), str(tmp_path))
    assert json.loads((tmp_path / "run.json").read_text())["seconds"]["retimed"]["device_name"] == [
        "NVIDIA H100 80GB HBM3", "NVIDIA H200"]


def test_shards_run_under_other_threads_merge_into_a_run_that_says_so(tmp_path, tiny_checkpoint, monkeypatch):
    """Shards may run under other threads, and on other machines: the merged run keeps each group's, its run.json
    says they mix and names every shard's device."""
    from harness.running import runner

    here = runner.device_name(torch.device("cpu"))
    for i in range(2):
        if i:
            monkeypatch.setattr(runner, "device_name", lambda device: "NVIDIA H200")   # the second shard elsewhere
        run(tiny_run_config(tiny_checkpoint, *RUN, f"shard={i}/2", f"threads={i + 1}"), str(tmp_path / f"{i}_run"))
    [merged] = merge_sweep(tmp_path)
    lines = [json.loads(line) for line in (merged / "groups.jsonl").read_text().splitlines()]
    assert [line["timed_under"]["threads"] for line in lines] == [1, 2, 1, 2]
    info = json.loads((merged / "run.json").read_text())
    assert info["seconds"]["retimed"] == {"threads": [1, 2], "device_name": [here, "NVIDIA H200"]}
    assert info["device_name"] == f"{here} + NVIDIA H200"
