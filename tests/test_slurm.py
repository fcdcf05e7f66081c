"""Sweeps submitted to a real SLURM (tests/slurm/cluster.sh start: partitions cpu, CPU-only, and gpu, with a fake
GPU; accounting): the same answers as without a launcher, docs/slurm.md's CPU-cluster command as written, resumed
after a requeue and through the requeues of the shortest time limit with every line once, a job failing inside
reported in one line after the others finished, a request SLURM cannot place or a time limit SLURM's signal would
fill refused before anything is submitted or made. Marked `slurm`: skipped where sbatch does not answer, except
under CI (CI=true), where that is a failure. Runs are on the tiny checkpoint, on CPU."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf
from submitit.core.utils import DelayedSubmission

from harness.errors import ConfigError
from harness.report.compare import compare, markdown
from harness.results.folder import read_jsonl
from harness.plugins.contracts import check_first_record
from harness.running.slurm import Requeue, TimeLimit, check_request, requeueing, seen_gpus
from tests.conftest import as_in_a_terminal, refusal, refused, tiny_overrides
from tests.test_docs import blocks, command_lines

ON_CPU = ["hydra/launcher=slurm", "hydra.launcher.partition=cpu", "hydra.launcher.cpus_per_task=1",
          "hydra.launcher.mem_gb=1"]
RUN = "memdefrag_top2_unbounded_synthetic"


def sbatch_answers() -> str | None:
    """Why SLURM cannot take jobs here, or None when it can."""
    try:
        answer = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, timeout=15)
    except FileNotFoundError:
        return "no sinfo/sbatch on this machine (tests/slurm/cluster.sh start, as root, installs and starts one)"
    except subprocess.TimeoutExpired:
        return "sinfo did not answer in 15 s (tests/slurm/cluster.sh start)"
    if answer.returncode or "cpu" not in answer.stdout.replace("*", "").split():
        return f"SLURM does not answer with a partition cpu ({answer.stderr.strip() or answer.stdout.strip()})"
    return None


@pytest.fixture(scope="module")
def slurm(request, tmp_path_factory):
    """SLURM answers, and under `--dist loadgroup` (make test) the tests that submit to it run on one worker
    (tests/conftest.py's scheduler): each worker that starts them writes its name where all workers see it, and a
    second name fails them."""
    why = sbatch_answers()
    if why and os.environ.get("CI") == "true":
        pytest.fail(f"SLURM did not start under CI: {why}")
    if why:
        pytest.skip(why)
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker and request.config.getvalue("dist") == "loadgroup":
        seen = tmp_path_factory.getbasetemp().parent / "slurm-tests-worker"
        with seen.open("a") as names:
            names.write(f"{worker}\n")
        assert set(seen.read_text().split()) == {worker}, f"the SLURM tests ran on workers {seen.read_text().split()}"


def on_slurm(test):
    return pytest.mark.slurm(pytest.mark.usefixtures("slurm")(test))


def memdefrag(cwd: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def sweep_args(checkpoint: str, folder: Path, *overrides: str, groups: int = 2, tokens: int = 4,
               updates: int = 3) -> list[str]:
    """A tiny multirun on CPU into `folder` (then `overrides`: a method list, a launcher); `tokens` (each answer's
    budget) and `updates` (answers a group): the work a group takes, where the synthetic set's groups are too few
    to fill a time."""
    tiny = [o for o in tiny_overrides(checkpoint, small_task=False) if not o.startswith("max_new_tokens=")]
    return ["-m", *tiny, f"max_new_tokens={tokens}", f"task.groups={groups}", f"task.updates={updates}",
            "model.device=cpu", "threads=1", f"hydra.sweep.dir={folder}", *overrides]


def until(done, seconds: float, what: str):
    """Wait (bounded) for done() to be true; returns its value."""
    deadline = time.monotonic() + seconds
    while not (value := done()):
        assert time.monotonic() < deadline, f"{what} within {seconds} s"
        time.sleep(0.2)
    return value


def job_of(sweep: Path, proc: subprocess.Popen) -> str:
    """The SLURM id of a one-run sweep's job, from its log folder (.submitit/<job id>); the submitting command's
    own output if it ended before submitting."""

    def submitted():
        assert proc.poll() is None or (sweep / ".submitit").is_dir(), proc.communicate()
        return [p.name for p in (sweep / ".submitit").glob("*") if p.name.isdigit()]

    return until(submitted, 240, "a job submitted")[0]


def finished_groups(run: Path) -> int:
    path = run / "groups.jsonl"
    return len(path.read_text().splitlines()) if path.is_file() else 0


RELEASE_AFTER_S = 2     # seconds a requeued job is left held before wait_releasing lets it start


def wait_releasing(proc: subprocess.Popen, job: str, timeout: int = 600) -> tuple[str, str]:
    """Wait for the submitting command; a requeued job, which SLURM holds two minutes before it may start again
    (PENDING (BeginTime)), is let start RELEASE_AFTER_S after it was first seen held: slurmd refuses to launch a
    job in the second its previous try was killed (it compares the revoked credential's time in whole seconds:
    "Job credential revoked", and the job ends FAILED)."""
    deadline, held = time.monotonic() + timeout, None
    while proc.poll() is None:
        assert time.monotonic() < deadline, f"the sweep ended within {timeout} s"
        state = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T %r"], capture_output=True, text=True).stdout
        held = (held or time.monotonic()) if state.strip() == "PENDING BeginTime" else None
        if held and time.monotonic() >= held + RELEASE_AFTER_S:
            subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True)
            held = None
        time.sleep(1)
    return proc.communicate()


LONG_ANSWERS = 160      # tokens an answer decodes where a run must last: the synthetic set has 100 groups of 3 updates
SYNTHETIC_GROUPS = 100
UNINTERRUPTED_GROUPS = 24   # the requeued run's: a requeue takes effect after cluster.sh's KillWait (5 s), and 6 more
                            # groups finished meanwhile here (up to 10 at CI's 0.83 s a group): some must be left
OUTLASTED = 60              # seconds of groups that outlast a 1-minute try (its signal comes 25-55 s
                            # into it, 10 s or more of which start the run)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tiny_checkpoint) -> tuple[Path, int, float]:
    """A sweep of UNINTERRUPTED_GROUPS groups of LONG_ANSWERS, run once for the module without a launcher: what a
    requeued run must answer, its prediction lines per group, and its fastest group's seconds (the nearest to
    this machine's speed unloaded: the module's first minutes ran twice as slow as its later runs on CI)."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    done = memdefrag(folder, *sweep_args(tiny_checkpoint, folder / "plain", "method=memdefrag_top2",
                                         groups=UNINTERRUPTED_GROUPS, tokens=LONG_ANSWERS))
    assert done.returncode == 0, done.stderr
    lines = len((folder / "plain" / RUN / "predictions.jsonl").read_text().splitlines())
    fastest = min(record["seconds"] for record in read_jsonl(folder / "plain" / RUN / "groups.jsonl"))
    return folder / "plain", lines // UNINTERRUPTED_GROUPS, fastest


def answered_the_same(a: Path, b: Path):
    """memdefrag compare's verdict on two sweeps (in this process): every run paired, and equal."""
    reports, unpaired = compare(a, b)
    assert reports and all(report.equal for report in reports) and not unpaired, markdown(reports, unpaired)


def signals(log: str) -> int:
    """How many of SLURM's signals a job caught, from its job output: submitit's records of them, each once by its
    time (a record may be written by more than one handler)."""
    return len(set(re.findall(r"submitit WARNING \(([\d :,-]+)\) - Caught signal SIGUSR2", log)))


def resumed_at(log: str, groups: int) -> list[int]:
    """The groups a run had finished each time it resumed, from its job log."""
    return [int(n) for n in re.findall(rf"resuming .*: (\d+) of {groups} groups already finished", log)]


@on_slurm
def test_a_sweep_through_slurm_answers_as_the_same_sweep_without_a_launcher(tmp_path, tiny_checkpoint):
    done = memdefrag(tmp_path, *sweep_args(tiny_checkpoint, tmp_path / "slurm", "method=none,memdefrag_top2",
                                           *ON_CPU))
    assert done.returncode == 0, done.stderr
    array = re.search(r"submitted 2 runs as slurm job (\d+); job logs in (\S+)", done.stdout)
    assert array and array[2] == str(tmp_path / "slurm" / ".submitit"), done.stdout
    status = re.findall(rf"\] job {array[1]}: (.*); logs in ", done.stdout)
    assert status[-1] == "2 of 2 done" and len(status) == len(set(status)), done.stdout   # one per change
    names = until(lambda: ended(array[1], "JobName%60,State"), 60, f"job {array[1]} recorded as ended")
    assert names == ["memdefrag:none_unbounded_synthetic", "COMPLETED",
                     "memdefrag:memdefrag_top2_unbounded_synthetic", "COMPLETED"]
    assert (tmp_path / "slurm" / "summary.md").is_file() and "warn" not in done.stderr.lower()
    plain = memdefrag(tmp_path, *sweep_args(tiny_checkpoint, tmp_path / "plain", "method=none,memdefrag_top2"))
    assert plain.returncode == 0, plain.stderr
    answered_the_same(tmp_path / "plain", tmp_path / "slurm")


def documented(partition: str) -> list[str]:
    """The words after `memdefrag` of docs/slurm.md's command for hydra.launcher.partition=<partition>."""
    return next(words[1:] for _, _, language, code in blocks("docs/slurm.md") if language == "bash"
                for words, _ in command_lines(code)
                if words[0] == "memdefrag" and f"hydra.launcher.partition={partition}" in words)


@on_slurm
def test_the_documented_cpu_cluster_command_runs_as_written(tmp_path, tiny_checkpoint):
    """docs/slurm.md's command for a cluster without GPUs, on cluster.sh's CPU-only partition, as written (on the
    tiny checkpoint, into a temporary sweep folder): both runs end. Two CPUs a run on a 2-CPU node: one waits its
    turn, and the status lines say SLURM's reason, from the first line on (a loaded node may not have started the
    first run by then: both pending)."""
    words = [w for w in documented("cpu") if not w.startswith("hydra.sweep.dir=")]
    sweep = tmp_path / "smollm2-cpu"
    done = memdefrag(tmp_path, *words, *sweep_args(tiny_checkpoint, sweep)[1:])
    assert done.returncode == 0, done.stdout + done.stderr
    status = re.findall(r"^\[[\d:]+\] job \d+: (.*); logs in ", done.stdout, re.MULTILINE)
    assert re.match(r"[12] pending \((Resources|Priority)\)", status[0]), done.stdout       # a reason from the start
    assert any(re.match(r"1 pending \((Resources|Priority)\), 1 running, 0 of 2 done$", line) for line in status), \
        done.stdout                                     # one waits its turn (the first line may precede the first start)
    assert status[-1] == "2 of 2 done" and (sweep / "summary.md").is_file()


@on_slurm
def test_a_requeued_job_resumes_with_every_line_once(tmp_path, tiny_checkpoint, uninterrupted):
    """`scontrol requeue` after the first group: the job runs again, keeps the groups it finished, and its run
    holds the lines of the uninterrupted run, each once, and answers as it did."""
    plain, lines_per_group, _ = uninterrupted
    groups, sweep = UNINTERRUPTED_GROUPS, tmp_path / "slurm"
    proc = subprocess.Popen([sys.executable, "-m", "harness", *sweep_args(
        tiny_checkpoint, sweep, "method=memdefrag_top2", *ON_CPU, groups=groups, tokens=LONG_ANSWERS)], cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    job = job_of(sweep, proc)
    until(lambda: finished_groups(sweep / RUN) >= 1, 300, "the first group finished")
    subprocess.run(["scontrol", "requeue", job], check=True)
    out, err = wait_releasing(proc, job)
    assert proc.returncode == 0, err
    log = (sweep / ".submitit" / job / f"{job}_0_log.out").read_text()
    resumed = resumed_at(log, groups)
    assert len(resumed) == 1 and 1 <= resumed[0] < groups, log
    lines = len((sweep / RUN / "predictions.jsonl").read_text().splitlines())
    assert lines == groups * lines_per_group and finished_groups(sweep / RUN) == groups
    print(f"requeued after {resumed[0]} of {groups} groups: {lines} lines, as uninterrupted")
    answered_the_same(plain, sweep)


SHORTEST = ["hydra.launcher.timeout_min=1", "hydra.launcher.signal_delay_s=5"]   # SLURM's shortest limit: 1 minute


@on_slurm
def test_a_sweep_under_the_shortest_time_limit_ends_by_itself_through_requeues(tmp_path, tiny_checkpoint,
                                                                               uninterrupted):
    """A 1-minute limit on the synthetic set's 100 groups: SLURM signals every try 5-35 s before its limit, each
    try finishes groups and is requeued, uncounted, until the run ends by itself, with every group's lines once. A
    run that ends inside its first try tests nothing, and each further try costs its startup (10 s of a 30-s try
    on a slow machine): answers are as long as make 100 groups last OUTLASTED seconds at the module's fastest
    group (its group with LONG_ANSWERS scaled down; a group's fixed work and an answer's end before the budget
    make that an underestimate, so the run lasts at least as long). On a machine 3x slower than CI's, answers of
    LONG_ANSWERS gave 289 s of groups in 21 tries (11 min). That a resumed run answers as the uninterrupted one is
    test_a_requeued_job_resumes_with_every_line_once's claim. SLURM holds each requeued try about two minutes
    (PENDING (BeginTime)); wait_releasing lets it start RELEASE_AFTER_S after it is first seen held, as the holds
    would make up most of the wall time."""
    _, lines_per_group, fastest = uninterrupted
    tokens = math.ceil(LONG_ANSWERS * OUTLASTED / (SYNTHETIC_GROUPS * fastest))
    sweep = tmp_path / "slurm"
    proc = subprocess.Popen([sys.executable, "-m", "harness", *sweep_args(
        tiny_checkpoint, sweep, "method=memdefrag_top2", *ON_CPU, *SHORTEST, groups=SYNTHETIC_GROUPS,
        tokens=tokens)], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    job = job_of(sweep, proc)
    out, err = wait_releasing(proc, job, timeout=900)
    assert proc.returncode == 0, out + err
    log = (sweep / ".submitit" / job / f"{job}_0_log.out").read_text()
    tries = signals(log)                               # each time a try met the limit and was requeued
    seconds = json.loads((sweep / RUN / "run.json").read_text())["seconds"]["total"]
    assert tries >= 1, f"the run ended inside its first try ({seconds:.0f} s of groups): {log}"
    assert "Logging error" not in (sweep / ".submitit" / job / f"{job}_0_log.err").read_text()
    resumed = resumed_at(log, SYNTHETIC_GROUPS)
    assert len(resumed) == tries and resumed == sorted(set(resumed)) and resumed[0] >= 1, resumed
    records = read_jsonl(sweep / RUN / "predictions.jsonl")
    per_group_lines = Counter(record["group"] for record in records)
    assert len(records) == SYNTHETIC_GROUPS * lines_per_group and set(per_group_lines.values()) == {lines_per_group}
    assert len(per_group_lines) == finished_groups(sweep / RUN) == SYNTHETIC_GROUPS
    print(f"1-minute limit, answers of {tokens} tokens: {tries} requeues, resumed after {resumed} of "
          f"{SYNTHETIC_GROUPS} groups: {len(records)} lines, {seconds:.0f} s of groups")


@on_slurm
def test_a_group_longer_than_a_try_fails_at_the_first_time_limit_in_one_line(tmp_path, tiny_checkpoint):
    """A group that cannot finish inside the 1-minute limit (10 answers of 6000 tokens: 41 s for 3 of them alone
    on an idle 2-core Xeon, so over two minutes a group): the first try's signal fails the job with one line naming
    the setting to raise, not a requeue loop."""
    sweep = tmp_path / "slurm"
    done = memdefrag(tmp_path, *sweep_args(tiny_checkpoint, sweep, "method=memdefrag_top2", *ON_CPU, *SHORTEST,
                                           tokens=6000, updates=10), timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    job = re.search(r"submitted 1 runs as slurm job (\d+)", done.stdout)[1]
    assert done.stderr.splitlines() == [
        f"memdefrag: error: job {job} ({RUN}): SLURM signalled the time limit before a group finished "
        f"(hydra.launcher.timeout_min=1, less hydra.launcher.signal_delay_s=5 s and up to 30 s more, less loading the "
        f"model); every try would end so: raise hydra.launcher.timeout_min; log: "
        f"{sweep / '.submitit' / job / f'{job}_0_log.err'}",
        f"memdefrag: 1 of 1 runs failed (0 finished, in {sweep}); rerun the same command to resume"], done.stderr
    assert until(lambda: ended(job), 60, f"job {job} recorded as ended") == ["FAILED"]


LIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED", "STAGE_OUT"}


def ended(job: str, fields: str = "State") -> list[str] | None:
    """`fields` of the job's tasks in SLURM's accounting once every task has ended (None while one runs: the
    submitting command reads a task's outcome from its result, maybe before the task's own process has exited)."""
    words = subprocess.run(["sacct", "-n", "-X", "-j", job, "-o", fields], capture_output=True,
                           text=True).stdout.split()
    return None if LIVE & set(words) else words


@on_slurm
def test_a_time_limit_the_signal_would_fill_is_refused_naming_signal_delay_s(tmp_path, tiny_checkpoint, monkeypatch,
                                                                             capsys, no_work):
    """timeout_min=1 with the shipped signal_delay_s (30 s, and SLURM's signal up to 30 s earlier): refused in one
    line before anything is submitted or made."""
    sweep = tmp_path / "slurm"
    monkeypatch.chdir(tmp_path)
    line = refused(sweep_args(tiny_checkpoint, sweep, "method=none", *ON_CPU, "hydra.launcher.timeout_min=1"),
                   monkeypatch, capsys)
    assert line == (
        "memdefrag: error: hydra.launcher.timeout_min=1 leaves a job no time to run: SLURM signals it to requeue "
        "hydra.launcher.signal_delay_s=30 s (and up to 30 s more) before its limit of 60 s; raise timeout_min or "
        "lower signal_delay_s"), line
    assert not sweep.exists() and no_work == []


def test_ctrl_c_in_a_terminal_ends_a_local_sweep_with_its_one_line_and_no_traceback(tmp_path, tiny_checkpoint):
    """A terminal's Ctrl-C reaches every process of its foreground group: the command, which cancels its job and
    says so in one line (exit 130), and submitit's controller of the job, whose KeyboardInterrupt traceback went to
    the same terminal under that line. It goes to the jobs' log folder now; no process of the sweep stays."""
    sweep = tmp_path / "sweep"
    command = [sys.executable, "-m", "harness", *sweep_args(tiny_checkpoint, sweep, "method=memdefrag_top2",
                                                            "hydra/launcher=local", groups=40, updates=6)]
    process = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True, preexec_fn=as_in_a_terminal)   # a group of its own
    until(lambda: (sweep / RUN / "groups.jsonl").is_file(), 120, "a group finished")
    os.killpg(process.pid, signal.SIGINT)
    out, err = process.communicate(timeout=60)
    job = re.search(r"^  (\S+): ", out, re.MULTILINE)[1]
    said = f"memdefrag: interrupted: cancelled job {job}; rerun the same command to resume (finished groups are kept)"
    assert process.returncode == 130 and err.splitlines() == [said], err
    log = sweep / ".submitit" / "controllers.log"
    until(lambda: "KeyboardInterrupt" in log.read_text(), 10, "the controller's traceback in its log")
    until(lambda: not group_alive(process.pid), 30, "every process of the sweep ended")


@pytest.mark.parametrize("at_once", [1, 2])
def test_a_local_sweep_runs_array_parallelism_jobs_at_a_time(tmp_path, tiny_checkpoint, at_once):
    """hydra/launcher=local runs one job at a time by default: the second is submitted once the first is done
    (jobs side by side share the cores and the GPU, and a timed study's times with them); array_parallelism=2
    submits both at once."""
    sweep = tmp_path / "sweep"
    done = memdefrag(tmp_path, *sweep_args(tiny_checkpoint, sweep, "method=none,memdefrag_top2",
                                           "hydra/launcher=local", f"hydra.launcher.array_parallelism={at_once}"))
    assert done.returncode == 0, done.stdout + done.stderr
    submitted = [line for line in done.stdout.splitlines() if line.startswith("submitted ")]
    assert [line.split(" as local job ")[0] for line in submitted] == (
        ["submitted run 1 of 2", "submitted run 2 of 2"] if at_once == 1 else ["submitted 2 runs"])
    if at_once == 1:
        lines = done.stdout.splitlines()
        first_done = next(i for i, line in enumerate(lines) if "1 of 2 done" in line and "running" not in line)
        assert lines.index(submitted[1]) > first_done, done.stdout
    assert all((sweep / run / "run.json").is_file() for run in ("none_unbounded_synthetic", RUN))


def test_a_sigterm_in_a_later_wave_cancels_its_job_in_one_line(tmp_path, tiny_checkpoint):
    """`timeout` signals a local sweep's whole process group while its second wave runs: the command cancels that
    wave's job, says so in one line (exit 130), and no process of the sweep stays; the first run's results stay."""
    sweep = tmp_path / "sweep"
    command = [sys.executable, "-m", "harness", *sweep_args(tiny_checkpoint, sweep, "method=memdefrag_top2",
                                                            "task.groups=1,40", "hydra/launcher=local", updates=6)]
    process = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)                 # a group of its own, as under `timeout`
    until(lambda: len(list(sweep.glob("*/groups.jsonl"))) == 2, 240, "the second run's first group")
    os.killpg(process.pid, signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    second = re.findall(r"^  (\S+): ", out, re.MULTILINE)[1]
    assert process.returncode == 130 and err.splitlines() == [
        f"memdefrag: interrupted: cancelled job {second}; rerun the same command to resume (finished groups are "
        f"kept)"], err
    until(lambda: not group_alive(process.pid), 30, "every process of the sweep ended")


@pytest.mark.parametrize("visible, gpus", [(None, (0, 1)), ("2,5", (2, 5)), ("", ()), ("1,-1,3", (1,))])
def test_a_local_job_sees_the_gpus_this_command_sees(visible, gpus):
    """The GPUs a local job may be given: CUDA_VISIBLE_DEVICES's (up to an invalid index, as CUDA reads it), all
    where it is unset; submitit alone gave every job none."""
    assert seen_gpus({} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}, lambda: 2) == gpus


def test_a_local_launcher_gives_submitit_the_gpus_and_refuses_what_it_cannot_give(monkeypatch, capsys):
    """The executor the local launcher builds carries the command's GPUs (AutoExecutor takes no visible_gpus):
    all of them, the first gpus_per_node, none for a CPU model. A device named by UUID, more GPUs than the command
    sees, a negative count, and array_parallelism below 1 are one line each."""
    from hydra_plugins.memdefrag_launchers import LocalLauncher

    def launcher(device="auto", **params):
        made = LocalLauncher(submitit_folder="/tmp/unused", timeout_min=1, **{"array_parallelism": 1, **params})
        made.setup(hydra_context=None, task_function=None, config=OmegaConf.create({"model": {"device": device}}))
        return made.executor()._executor.parameters

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    given = [launcher(gpus_per_node=None), launcher(gpus_per_node=1), launcher("cpu", gpus_per_node=None)]
    assert [(p["gpus_per_node"], p["visible_gpus"]) for p in given] == [(2, (2, 5)), (1, (2,)), (0, ())]
    for environ, params, line in [
            ("GPU-8f2e", {"gpus_per_node": None}, "hydra/launcher=local: CUDA_VISIBLE_DEVICES='GPU-8f2e' names a "
             "device by 'GPU-8f2e', and a local job is given devices by index: give their indices (nvidia-smi -L "
             "lists them)"),
            ("2,5", {"gpus_per_node": 3}, "hydra.launcher.gpus_per_node=3: this command sees 2 GPUs "
             "(CUDA_VISIBLE_DEVICES=2,5); ask for at most that many, or null for all of them"),
            ("2,5", {"gpus_per_node": -1}, "hydra.launcher.gpus_per_node=-1 must be an integer >= 0, or null"),
            ("2,5", {"gpus_per_node": 0, "array_parallelism": 0},
             "hydra.launcher.array_parallelism=0 must be an integer >= 1")]:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", environ)
        with pytest.raises(SystemExit) as stopped:
            launcher(**params)
        assert stopped.value.code == 2 and capsys.readouterr().err.splitlines() == [f"memdefrag: error: {line}"]


def group_alive(group: int) -> bool:
    """Whether any process of the process group is left (a zombie too: it has not been reaped)."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("launcher", [pytest.param("slurm", marks=pytest.mark.slurm), "local"])
def test_a_job_failing_inside_ends_the_command_with_its_line_after_the_others(tmp_path, tiny_checkpoint, request,
                                                                             launcher):
    """Run 1's folder has a folder where its records go: its job fails inside (SLURM: FAILED); the command waits
    for run 0, writes the summary of it, and exits 2 with run 1's own line, its job id and its log. The same
    through hydra/launcher=local, which needs no SLURM. (A folder holding another run's results, or one whose
    config cannot be read, is refused before any job runs: test_bad_input.py.)"""
    if launcher == "slurm":
        request.getfixturevalue("slurm")
    sweep = tmp_path / launcher
    broken = sweep / "memdefrag_top2_unbounded_synthetic"
    (broken / "predictions.jsonl").mkdir(parents=True)      # docs/slurm.md's example
    done = memdefrag(tmp_path, *sweep_args(tiny_checkpoint, sweep, "method=none,memdefrag_top2",
                                           *(ON_CPU if launcher == "slurm" else ["hydra/launcher=local"])))
    assert done.returncode == 2, done.stdout + done.stderr
    jobs = dict(re.findall(r"^  (\S+): (\S+)  \(", done.stdout, re.MULTILINE))
    job = next(job for job, folder in jobs.items() if folder == broken.name)
    log = sweep / ".submitit" / job / f"{job}_0_log.err"
    assert done.stderr.splitlines() == [
        f"memdefrag: summary: {broken / 'config.yaml'} cannot be read (No such file or directory); its run is left "
        f"out",
        f"memdefrag: error: job {job} ({broken.name}): cannot write the results in {broken}: "
        f"{broken / 'predictions.jsonl'}: Is a directory; the groups finished so far are kept: mend that path (or "
        f"choose another output folder) and rerun the same command to resume; log: {log}",
        f"memdefrag: 1 of 2 runs failed (1 finished, in {sweep}); rerun the same command to resume"], done.stderr
    assert log.is_file() and (sweep / "none_unbounded_synthetic" / "run.json").is_file()
    assert "none" in (sweep / "summary.md").read_text() and "memdefrag_top2" not in (sweep / "summary.md").read_text()
    if launcher == "slurm":
        array = job.split("_")[0]
        assert until(lambda: ended(array), 60, f"job {array} recorded as ended") == ["COMPLETED", "FAILED"]


@on_slurm
@pytest.mark.parametrize("request_, refusal", [
    ("hydra.launcher.partition=nope", "Invalid partition name specified"),
    ("hydra.launcher.cpus_per_task=100000", "More processors requested than permitted"),   # and 0 GPUs: a CPU model
    ("hydra.launcher.gpus_per_node=1", "Requested node configuration is not available"),     # cpu has no GPU
    ("hydra.launcher.timeout_min=2881", "Requested time limit is invalid (missing or exceeds some limit)")])
def test_a_request_slurm_cannot_place_is_one_line_before_anything_is_submitted(tmp_path, tiny_checkpoint, request_,
                                                                               refusal, monkeypatch, capsys, no_work):
    """One line naming the request and what each partition offers, its time limit included (cluster.sh: 2 days,
    2880 min); nothing submitted, no sweep folder made. In this process: sbatch --test-only answers it."""
    sweep = tmp_path / "slurm"
    monkeypatch.chdir(tmp_path)
    line = refused(sweep_args(tiny_checkpoint, sweep, "method=none,memdefrag_top2", *ON_CPU, request_),
                   monkeypatch, capsys)
    assert line.startswith(f"memdefrag: error: SLURM refuses the request ({refusal}): ")
    assert request_ in line and ("gpus" in request_ or "hydra.launcher.gpus_per_node=0 " in line)
    assert re.search(r"; the partitions offer cpu \(1 node, \d+ CPUs, \d+ MB, no GPUs, time limit 2-00:00:00\), "
                     r"gpu \(1 node, \d+ CPUs, \d+ MB, gpu:1, time limit 2-00:00:00\)$", line), line
    assert not sweep.exists() and no_work == []


@on_slurm
def test_a_model_on_its_default_device_asks_for_a_gpu(tmp_path, tiny_checkpoint, monkeypatch, capsys, no_work):
    """gpus_per_node null: one GPU for model.device=auto (a CPU model asks for none: the test above), as the
    request SLURM is asked about says."""
    monkeypatch.chdir(tmp_path)
    line = refused(sweep_args(tiny_checkpoint, tmp_path / "slurm", "method=none", *ON_CPU, "model.device=auto",
                              "hydra.launcher.cpus_per_task=100000"), monkeypatch, capsys)
    assert "hydra.launcher.gpus_per_node=1 " in line, line


def test_without_sbatch_a_slurm_sweep_is_one_line(tmp_path, tiny_checkpoint, monkeypatch, capsys, no_work):
    """A machine without SLURM's commands (PATH without them): one line, nothing submitted."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    line = refused(sweep_args(tiny_checkpoint, tmp_path / "s", "method=none", *ON_CPU), monkeypatch, capsys)
    assert line == ("memdefrag: error: hydra/launcher=slurm: no `sbatch` on this machine; submit from a SLURM login "
                    "node, or run the sweep here with hydra/launcher=local"), line
    assert no_work == [] and not (tmp_path / "s").exists()


def test_an_sbatch_refusing_without_a_word_is_still_one_line(monkeypatch):
    """sbatch --test-only failing with nothing on stderr or stdout: the refusal names its exit status."""
    monkeypatch.setattr("harness.running.slurm.ask",
                        lambda *command, stdin=None: subprocess.CompletedProcess(command, 1, "", ""))
    with pytest.raises(ConfigError, match=r"^SLURM refuses the request \(sbatch --test-only exited 1\): "
                                          r"hydra.launcher.partition=cpu "):
        check_request("#!/bin/bash\n", {"partition": "cpu", "timeout_min": 240, "signal_delay_s": 30})


@pytest.mark.parametrize("stdout, stderr, offered", [
    ("cpu*|1|2|24105|(null)|2-00:00:00\nodd|row\n", "",
     "cpu (1 node, 2 CPUs, 24105 MB, no GPUs, time limit 2-00:00:00)"),
    ("", "slurm_load_partitions: Unable to contact slurm controller (connect failure)\n",
     "nothing `sinfo` could say (slurm_load_partitions: Unable to contact slurm controller (connect failure))")])
def test_what_the_partitions_offer_is_said_whatever_sinfo_prints(stdout, stderr, offered, monkeypatch):
    """The partitions named in a refusal: a row of another shape left out, a SLURM that cannot be reached said."""
    from harness.running.slurm import partitions

    monkeypatch.setattr("harness.running.slurm.ask",
                        lambda *command, stdin=None: subprocess.CompletedProcess(command, 0, stdout, stderr))
    assert partitions() == offered


def requeue_handler(groups: Path, timeout_min: int, signal_delay_s: int, countdown: int, requeue=None) -> Requeue:
    """A try's Requeue as Slurm.__call__ builds it, its job environment stood in (`requeue`: scontrol's part)."""
    env = SimpleNamespace(paths=None, global_rank=0, _requeue=requeue)
    delayed = DelayedSubmission(print)
    delayed.set_timeout(timeout_min, countdown)
    return Requeue(env, delayed, groups, {"timeout_min": timeout_min, "signal_delay_s": signal_delay_s})


@pytest.mark.parametrize("exit_status", [-signal.SIGTERM, 1])
def test_a_requeue_whose_scontrol_its_own_signal_ends_is_taken_and_another_failure_is_not(tmp_path, exit_status):
    """SLURM's signal before the limit, a group finished since the try began: `scontrol requeue` killed by the
    SIGTERM its requeue sends to every process of the job ends the try as a requeue does (SystemExit); scontrol
    failing otherwise stays the job's error."""
    groups = tmp_path / "groups.jsonl"

    def requeue(countdown):
        raise subprocess.CalledProcessError(exit_status, ["scontrol", "requeue", "7"])

    handler = requeue_handler(groups, 60, 30, 3, requeue)
    groups.write_text('{"group": 0}\n')
    with pytest.raises(SystemExit if exit_status == -signal.SIGTERM else subprocess.CalledProcessError):
        handler.checkpoint_and_try_requeue(signal.SIGUSR2)


def test_slurms_signal_requeues_while_the_run_runs_and_not_once_it_has_returned(tmp_path, caplog):
    """A group finished, SLURM's signal inside `requeueing` requeues the try; the same signal after it (submitit
    writing the result the sweep is waiting for) is logged and requeues nothing."""
    requeued = []
    groups = tmp_path / "groups.jsonl"
    handler = requeue_handler(groups, 1, 5, 3, requeued.append)
    groups.write_text('{"group": 0}\n')
    previous = signal.signal(signal.SIGUSR2, lambda *_: requeued.append("not requeueing's"))  # not pytest's death
    try:
        with pytest.raises(SystemExit), requeueing(handler, signal.SIGUSR2):
            os.kill(os.getpid(), signal.SIGUSR2)
        assert requeued == [3]
        os.kill(os.getpid(), signal.SIGUSR2)
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert requeued == [3] and "SLURM's signal after the run had ended: not requeued" in caplog.text


def test_the_time_limit_signal_inside_a_plugins_guarded_call_stays_the_time_limit(tmp_path):
    """SLURM's signal before the limit, no group finished, arriving while the task's `metrics` reads the first
    record (as it once did under CI): the run stops with the time limit's line, not the guard's line for an error
    of the task's own."""
    handler = requeue_handler(tmp_path / "groups.jsonl", 1, 5, 0)
    task = SimpleNamespace(metrics=lambda records: handler.checkpoint_and_try_requeue(signal.SIGUSR2))
    with pytest.raises(TimeLimit, match="^SLURM signalled the time limit before a group finished"):
        check_first_record(task, {"group": 0})


def test_a_submission_sbatch_refuses_after_its_test_passed_is_one_line(tmp_path, tiny_checkpoint, monkeypatch,
                                                                       capsys, no_work):
    """sbatch --test-only checks no account or QOS: a real submission it then refuses ends in one line with
    sbatch's reason, after sbatch's own (submitit leaves its stderr to the terminal), and nothing runs."""
    commands = tmp_path / "bin"
    commands.mkdir()
    (commands / "sbatch").write_text('#!/bin/sh\ncase "$*" in *--test-only*) exit 0;; esac\n'
                                     'echo "sbatch: error: Batch job submission failed: Invalid account or '
                                     'account/partition combination specified" >&2\nexit 1\n')
    (commands / "sbatch").chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", f"{commands}:{Path(sys.executable).parent}:/usr/bin:/bin")
    said = refusal(["memdefrag", *sweep_args(tiny_checkpoint, tmp_path / "s", "method=none", *ON_CPU)], monkeypatch,
                   capsys).strip().splitlines()
    assert said[:-1] == ["sbatch: error: Batch job submission failed: Invalid account or account/partition "
                         "combination specified"], said
    line = said[-1]
    assert line == ("memdefrag: error: slurm refused the submission (sbatch: error: Batch job submission failed: "
                    "Invalid account or account/partition combination specified): nothing was submitted; rerun the "
                    "same command once it can be"), line
    assert no_work == []
