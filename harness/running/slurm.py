"""Sweeps through hydra-submitit-launcher that say what happens: `hydra/launcher=slurm` (and `local`); the
launchers Hydra finds are declared in hydra_plugins/memdefrag_launchers.

Before anything is submitted, and before the sweep folder exists, SLURM itself is asked whether it can place
a job of the sweep (`sbatch --test-only`): a bad partition, a time limit that leaves no time before SLURM's
signal, or a request no node meets ends the command with one line naming what the partitions offer. The sweep
goes in as one array job whose tasks are named `memdefrag:<run folder>`; while it runs, one status line per
change (job id, SLURM's pending reason, running and finished counts, the log folder). A job that fails raises
in the job, so SLURM records it FAILED and submitit keeps its error; the command waits for every other job,
writes the summary of what finished, then exits 2 with each failed job's own line, its job id and its log.
Interrupted while waiting, it cancels its jobs. Rerunning the same command into the same hydra.sweep.dir
resumes every run (harness.results.folder keeps finished groups); so do requeued jobs and jobs that reach their time
limit (Requeue: requeued as long as each try finishes a group).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra_plugins.hydra_submitit_launcher import submitit_launcher
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from omegaconf import OmegaConf
from submitit.core.job_environment import JobEnvironment, SignalHandler
from submitit.core.utils import DelayedSubmission, FailedJobError
import torch

from harness.errors import ConfigError, put_back, stops_on_config_error
from harness.results.folder import read_jsonl
from harness.results.paths import sweep_subdir
from harness.results.summary import SweepSummary
from methods.errors import whole_number

log = logging.getLogger(__name__)

COMMANDS = ("sbatch", "srun", "squeue", "scontrol", "sinfo")     # what submitting and waiting take
POLL_S = 5                     # seconds between looks at the queue while waiting
ASK_S = 30                     # the longest wait for one answer of sbatch, squeue or scontrol
LOOK_S = 30                    # slurmctld looks at time limits every 30 s: its signal comes up to that much early
MARK = "harness.running.slurm.JobFailed: "    # how a failed job's own line reads in the trace submitit keeps
# states after which a job runs no more: SLURM's (a requeued job passes through PENDING instead), then local ones
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
         "ENDED", "FINISHED", "INTERRUPTED"}


class JobFailed(Exception):
    """A run that failed inside its job, as one line (what the submitting command prints)."""


class TimeLimit(BaseException):
    """SLURM's time-limit signal in a try that finished no group. It is raised by the signal handler, wherever the
    run is, so it is not an Exception: no `except Exception` on its way (a plugin's guard that turns the plugin's
    own error into one line) takes it for the error of the code it interrupted."""


def ask(*command: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """Run a SLURM command; a SLURM that does not answer is one line."""
    try:
        return subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=ASK_S)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"hydra/launcher=slurm: `{' '.join(command)}` did not answer in {ASK_S} s: "
                          "is slurmctld up (`sinfo`)?") from None


def partitions() -> str:
    """What each partition offers, for a message: `cpu (1 node, 2 CPUs, 24105 MB, gpu:1, time limit 2-00:00:00)`."""
    answer = ask("sinfo", "-h", "-o", "%P|%D|%c|%m|%G|%l")
    rows = [row.split("|") for row in answer.stdout.split()]
    offered = ", ".join(f"{p.rstrip('*')} ({n} node{'s' * (n != '1')}, {c} CPUs, {m} MB, "
                        f"{'no GPUs' if g == '(null)' else g}, time limit {t})"
                        for p, n, c, m, g, t in (row for row in rows if len(row) == 6))
    return offered or f"nothing `sinfo` could say ({(answer.stderr.strip() or 'no rows').splitlines()[-1]})"


def check_time(params: dict) -> None:
    """A time limit SLURM's signal would fill (it comes signal_delay_s, and up to LOOK_S more, before the limit):
    one line naming both settings. Whether one group fits what is left is known only in the job (Requeue)."""
    limit, delay = 60 * params["timeout_min"], params["signal_delay_s"]
    if limit <= delay + LOOK_S:
        raise ConfigError(f"hydra.launcher.timeout_min={params['timeout_min']} leaves a job no time to run: SLURM "
                          f"signals it to requeue hydra.launcher.signal_delay_s={delay} s (and up to {LOOK_S} s "
                          f"more) before its limit of {limit} s; raise timeout_min or lower signal_delay_s")


def check_request(script: str, params: dict) -> None:
    """Ask SLURM whether it can place a job of this sweep (partition, CPUs, memory, GPUs, time): one line if not."""
    check_time(params)
    answer = ask("sbatch", "--test-only", stdin=script)
    if answer.returncode:
        said = (answer.stderr.strip() or answer.stdout.strip()).splitlines()   # an sbatch may say nothing
        reason = said[-1].split(": ", 1)[-1] if said else f"sbatch --test-only exited {answer.returncode}"
        asked = " ".join(f"hydra.launcher.{k}={params.get(k)}" for k in
                         ("partition", "cpus_per_task", "mem_gb", "gpus_per_node", "timeout_min"))
        raise ConfigError(f"SLURM refuses the request ({reason}): {asked}; the partitions offer {partitions()}")


def job_error(err: Exception) -> str:
    """A failed job's one line from the error submitit returns: the run's own (JobFailed), else the last line of
    the trace (what stopped it), else the first line (a job that ended without a result)."""
    lines = [line for line in str(err).splitlines() if line.strip()]
    own = [line[len(MARK):] for line in lines if line.startswith(MARK)]
    if own:
        return own[-1]
    rules = [i for i, line in enumerate(lines) if set(line) == {"-"}]
    return lines[rules[1] - 1] if len(rules) > 1 else lines[0]


def which(wave: range, runs: int) -> str:
    """The runs a wave submits, for its line: `2 runs` (all of them), `run 2 of 6`, `runs 3-4 of 6`."""
    if len(wave) == runs:
        return f"{runs} runs"
    return f"run {wave[0] + 1} of {runs}" if len(wave) == 1 else f"runs {wave[0] + 1}-{wave[-1] + 1} of {runs}"


def shown(state: str) -> str:
    """A state as a status line says it: `pending (Resources)` (the reason as SLURM prints it)."""
    word, space, reason = state.partition(" ")
    return word.lower() + space + reason


def finished_groups(groups: Path) -> int:
    """How many groups a run has finished (its groups.jsonl)."""
    return len(read_jsonl(groups)) if groups.is_file() else 0


class Requeue(SignalHandler):
    """In a SLURM job, SLURM's signal `signal_delay_s` before the time limit. A try that finished a group is
    requeued, not counted as a timeout: the run resumes from its finished groups, so every try gets further, and
    a sweep whose groups fit the limit ends by itself. A try that finished none fails in one line naming the
    setting to raise: every later try would do the same. (A signal that is a preemption requeues as in submitit.)"""

    def __init__(self, env: JobEnvironment, delayed: DelayedSubmission, groups: Path, params: dict):
        super().__init__(env, env.paths, delayed)
        self.groups, self.before, self.params = groups, finished_groups(groups), params

    def has_timed_out(self) -> bool:
        return super().has_timed_out() and finished_groups(self.groups) <= self.before

    def checkpoint_and_try_requeue(self, signum: int, frame=None) -> None:
        """The signal, handled between two steps of the run, which may be writing a log file's line: a record
        submitit logs here to that file is then dropped (logging.raiseExceptions off), not a reentrant-flush
        traceback in the job's log, whose dumped record read as one more signal."""
        raising, logging.raiseExceptions = logging.raiseExceptions, False
        try:
            self._checkpoint_and_try_requeue(signum, frame)
        finally:
            logging.raiseExceptions = raising

    def _checkpoint_and_try_requeue(self, signum: int, frame=None) -> None:
        if self.has_timed_out():
            raise TimeLimit(f"SLURM signalled the time limit before a group finished (hydra.launcher.timeout_min="
                            f"{self.params['timeout_min']}, less hydra.launcher.signal_delay_s="
                            f"{self.params['signal_delay_s']} s and up to {LOOK_S} s more, less loading the model); "
                            f"every try would end so: raise hydra.launcher.timeout_min")
        try:
            super().checkpoint_and_try_requeue(signum, frame)
        except subprocess.CalledProcessError as err:
            if err.returncode != -signal.SIGTERM:
                raise
            # `scontrol requeue` ends the try by signalling every process of the job, itself too where it has not
            # exited by then (seen on a loaded 2-core node): its request was taken, so the try ends as after one
            self._exit()


@contextmanager
def requeueing(handler: Requeue, signum: int) -> Iterator[None]:
    """SLURM's signal goes to `handler` while the run runs, and is only logged once it has returned: the try's
    work is done and submitit is writing its result, which the waiting sweep reads as the job's end, so a requeue
    then would run the ended run again behind the sweep's back."""
    signal.signal(signum, handler.checkpoint_and_try_requeue)
    try:
        yield
    finally:
        signal.signal(signum, lambda *_: log.warning("SLURM's signal after the run had ended: not requeued"))


class Waiting(submitit_launcher.BaseSubmititLauncher):
    """The shared part: submit one array, wait for every job with a status line per change, report failures."""

    OWN: tuple[str, ...] = ()      # settings of the launcher's own, which submitit is not given
    LOOK_EVERY_S = POLL_S          # seconds between looks at the jobs' states

    def __call__(self, *args) -> JobReturn:
        """In the job: a run that fails raises (the job ends FAILED, submitit keeps the line) instead of
        returning a failed result that SLURM would count as COMPLETED."""
        try:
            ret = super().__call__(*args)
        except TimeLimit as err:
            raise JobFailed(str(err)) from None
        if ret.status == JobStatus.FAILED:
            err = ret._return_value
            raise JobFailed(str(err) if isinstance(err, ConfigError) else f"{type(err).__name__}: {err}")
        return ret

    def executor(self):
        """The submitit executor of these launcher settings (as hydra-submitit-launcher builds it)."""
        import submitit

        kind, init = self._EXECUTOR, ("submitit_folder", "max_num_timeout")
        timeouts = ({f"{kind}_max_num_timeout": self.params["max_num_timeout"]} if "max_num_timeout" in self.params
                    else {})
        executor = submitit.AutoExecutor(folder=self.params["submitit_folder"], cluster=kind, **timeouts)
        base = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(**{k if k in base else f"{kind}_{k}": v for k, v in self.params.items()
                                      if k not in init + self.OWN})
        return executor

    def submitting(self):
        """What the submission runs inside (nothing here; see Local)."""
        return nullcontext()

    def named(self, jobs, folders: list[str]) -> None:
        """Give each job its run's name where the scheduler shows names (SLURM)."""

    def states(self, jobs) -> dict[str, str]:
        """Job id -> state (`PENDING (reason)`, RUNNING, ...) of the jobs without a result yet."""
        return {job.job_id: job.state for job in jobs}

    def launch(self, job_overrides, initial_job_idx: int) -> list[JobReturn]:
        """Check, submit the runs (one array, or a wave at a time: `waves`), say where each goes, wait, and return
        their results."""
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        executor = self.executor()
        sweep_dir.mkdir(parents=True, exist_ok=True)
        nums = range(initial_job_idx, initial_job_idx + len(job_overrides))
        folders = [self.run_folder(list(o), num) for o, num in zip(job_overrides, nums)]
        self.runs = {num: str(sweep_dir.absolute() / folder) for num, folder in zip(nums, folders)}  # for the jobs
        jobs, states = [], {}
        previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
        try:
            for wave in self.waves(len(nums)):
                submitted = self.submit(executor, [job_overrides[i] for i in wave], [nums[i] for i in wave])
                jobs += submitted
                logs = Path(submitted[0].paths.folder).parent
                print(f"submitted {which(wave, len(nums))} as {self._EXECUTOR} job "
                      f"{submitted[0].job_id.split('_')[0]}; job logs in {logs}", flush=True)
                for job, i in zip(submitted, wave):
                    print(f"  {job.job_id}: {folders[i]}  ({' '.join(filter_overrides(job_overrides[i]))})",
                          flush=True)
                self.named(submitted, [folders[i] for i in wave])
                states |= self.wait(submitted, logs, done=len(jobs) - len(submitted), runs=len(nums))
        except KeyboardInterrupt:        # Ctrl-C or SIGTERM, while a wave runs or between two
            self.cancel([job for job in jobs if job.job_id not in states])     # not one of an ended wave
        finally:
            put_back(signal.SIGTERM, previous)
        return self.returns(jobs, folders, states, sweep_dir)

    @staticmethod
    def cancel(jobs) -> None:
        """Cancel the jobs still without a result, so that none stays queued or running behind a command that is
        gone; one line, exit 130. (Interrupted inside a submission, the jobs it made are not known yet.)"""
        running = [job for job in jobs if not job.paths.result_pickle.exists()]
        for job in running:
            job.cancel(check=False)
        arrays = sorted({job.job_id.split("_")[0] for job in running})
        print(f"memdefrag: interrupted: {'cancelled job ' + ', '.join(arrays) if arrays else 'no job was running'}; "
              f"rerun the same command to resume (finished groups are kept)", file=sys.stderr)
        sys.exit(130)

    def waves(self, runs: int) -> list[range]:
        """The runs submitted together, each wave once the one before has ended: all at once (SLURM queues them
        and runs array_parallelism of them at a time)."""
        return [range(runs)]

    def submit(self, executor, job_overrides: list, nums: list[int]) -> list:
        """Submit runs `nums` as one array; a submission the scheduler refuses is one line."""
        with stops_on_config_error("memdefrag"):
            try:
                with self.submitting():
                    return executor.map_array(self, [list(o) for o in job_overrides], ["hydra.sweep.dir"] * len(nums),
                                              nums, [f"job_id_for_{num}" for num in nums],
                                              [Singleton.get_state()] * len(nums))
            except FailedJobError as err:   # what --test-only passed (SLURM checks no account or QOS there)
                said = str(err).strip().splitlines()
                raise ConfigError(f"{self._EXECUTOR} refused the submission ({said[-1] if said else 'no reason given'})"
                                  f": nothing was submitted; rerun the same command once it can be") from None

    def run_folder(self, overrides: list[str], num: int) -> str:
        """The folder name a job's run writes (hydra.sweep.subdir), as the job will compose it."""
        return sweep_subdir(self.hydra_context.config_loader.load_sweep_config(self.config, overrides), num)

    def wait(self, jobs, logs: Path, done: int = 0, runs: int | None = None) -> dict[str, str]:
        """Until every job has a result or has ended (seen so at two looks in a row: a result still missing is
        not coming); a status line per change, counting the `done` runs of earlier waves among all `runs`.
        Returns the last state of each job still without a result."""
        last, ended, since = None, False, None
        array = jobs[0].job_id.split("_")[0]
        while True:
            waiting = [job for job in jobs if not job.paths.result_pickle.exists()]
            if ended and waiting and hasattr(waiting[0], "watcher"):
                waiting[0].watcher.update()     # the confirming look reads the queue afresh: submitit keeps a
                                                # reading for seconds, and a requeue passes through FAILED
            states = self.states(waiting) if waiting else {}
            counts = sorted(Counter(states.values()).items())
            line = ", ".join([*(f"{n} {shown(state)}" for state, n in counts),
                              f"{done + len(jobs) - len(waiting)} of {runs or len(jobs)} done"])
            # a job just (re)queued is PENDING without a reason until SLURM's next pass: the line waits for it
            bare = "PENDING" in states.values()
            since = (since or time.monotonic()) if bare else None
            unexplained = bare and time.monotonic() < since + POLL_S
            if line != last and not unexplained:
                print(f"[{time.strftime('%H:%M:%S')}] job {array}: {line}; logs in {logs}", flush=True)
                last = line
            now_ended = all(state.split()[0] in ENDED for state in states.values())
            if not waiting or ended and now_ended:
                return states
            ended = now_ended
            time.sleep(1 if ended or unexplained else self.LOOK_EVERY_S)

    def returns(self, jobs, folders: list[str], states: dict[str, str], sweep_dir: Path) -> list[JobReturn]:
        """Every job's result; where some failed: the summary of what finished, a line per failed job, exit 2."""
        errors = [(job_error(job.exception()) if job.exception() else None) if job.paths.result_pickle.exists()
                  else f"ended {states[job.job_id]} without a result" for job in jobs]
        failed = [(job, folder, line) for job, folder, line in zip(jobs, folders, errors) if line]
        if not failed:
            return [job.results()[0] for job in jobs]
        SweepSummary().on_multirun_end(self.config)
        for job, folder, line in failed:
            print(f"memdefrag: error: job {job.job_id} ({folder}): {line}; log: {job.paths.stderr}", file=sys.stderr)
        print(f"memdefrag: {len(failed)} of {len(jobs)} runs failed ({len(jobs) - len(failed)} finished, in "
              f"{sweep_dir}); rerun the same command to resume", file=sys.stderr)
        sys.exit(2)


class Local(Waiting):
    """hydra/launcher=local's part: each job runs under a controller process of submitit's, which a terminal's
    Ctrl-C reaches beside this command (one process group), and which prints its KeyboardInterrupt's traceback
    under the command's one line. Its stderr goes to controllers.log in the jobs' log folder instead. The jobs
    run `array_parallelism` at a time (one by default: jobs side by side share the machine's cores and GPU, which
    a timed study's times must not), and see the GPUs this command sees (`seen_gpus`): the first gpus_per_node, or
    where it is null all of them, none for a CPU model."""

    OWN = ("array_parallelism",)
    LOOK_EVERY_S = 1               # a local job's state is its process's, read at no cost

    def setup(self, **kwargs) -> None:
        """Settle the GPUs each job sees and check array_parallelism, before Hydra makes the sweep folder."""
        super().setup(**kwargs)
        with stops_on_config_error("memdefrag"):
            whole_number("hydra.launcher.array_parallelism", self.params["array_parallelism"])
            asked = self.params.get("gpus_per_node")
            whole_number("hydra.launcher.gpus_per_node", asked, least=0, or_null=True)
            self.visible: tuple[int, ...] = ()
            if asked != 0 and not (asked is None and str(self.config.model.device) == "cpu"):
                seen = seen_gpus(os.environ, torch.cuda.device_count)
                if asked is not None and asked > len(seen):
                    raise ConfigError(f"hydra.launcher.gpus_per_node={asked}: this command sees {len(seen)} GPUs "
                                      f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); "
                                      "ask for at most that many, or null for all of them")
                self.visible = seen[:asked]
            self.params["gpus_per_node"] = len(self.visible)

    def executor(self):
        executor = super().executor()
        executor._executor.update_parameters(visible_gpus=self.visible)   # not a setting AutoExecutor passes on
        return executor

    def waves(self, runs: int) -> list[range]:
        at_once = self.params["array_parallelism"]
        return [range(first, min(first + at_once, runs)) for first in range(0, runs, at_once)]

    def submitting(self):
        return stderr_into(Path(self.params["submitit_folder"]).parent / "controllers.log")


def seen_gpus(environ, count) -> tuple[int, ...]:
    """The GPUs this command sees, by index: CUDA_VISIBLE_DEVICES up to its first invalid index (as CUDA reads
    it), or all `count()` where it is unset. submitit gives a local job CUDA_VISIBLE_DEVICES itself (the first
    gpus_per_node of the machine's, none without it: a GPU model's job ran on the CPU), so `Local` hands it these."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return tuple(range(count()))
    gpus = []
    for index in (part.strip() for part in visible.split(",") if part.strip()):
        if not index.lstrip("-").isdigit():
            raise ConfigError(f"hydra/launcher=local: CUDA_VISIBLE_DEVICES={visible!r} names a device by "
                              f"{index!r}, and a local job is given devices by index: give their indices "
                              "(nvidia-smi -L lists them)")
        if int(index) < 0:
            break
        gpus.append(int(index))
    return tuple(gpus)


@contextmanager
def stderr_into(path: Path) -> Iterator[None]:
    """Processes started inside write their stderr to `path` (they inherit file descriptor 2); this process's
    own is back after."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    kept = os.dup(2)
    try:
        with open(path, "a", encoding="utf-8") as log_file:
            os.dup2(log_file.fileno(), 2)
            yield
    finally:
        sys.stderr.flush()
        os.dup2(kept, 2)
        os.close(kept)


class Slurm(Waiting):
    """hydra/launcher=slurm's part. gpus_per_node null: one GPU per job, none for a CPU model (model.device=cpu)."""

    def setup(self, **kwargs) -> None:
        """Settle gpus_per_node and check the request: before Hydra makes the sweep folder, so a refused request
        leaves nothing behind."""
        super().setup(**kwargs)
        if self.params.get("gpus_per_node") is None:
            self.params["gpus_per_node"] = 0 if str(self.config.model.device) == "cpu" else 1
        with stops_on_config_error("memdefrag"):
            check_request(self.executor()._executor._make_submission_file_text("true", "preflight"), self.params)

    def __call__(self, *args) -> JobReturn:
        """In the job: SLURM's signal before the time limit goes to Requeue (args[2]: the run's number)."""
        env = JobEnvironment()
        delayed = DelayedSubmission(self, *args)
        delayed.set_timeout(self.params["timeout_min"], 0)
        handler = Requeue(env, delayed, Path(self.runs[args[2]]) / "groups.jsonl", self.params)
        with requeueing(handler, env._usr_sig()):
            return super().__call__(*args)

    def executor(self):
        missing = [command for command in COMMANDS if shutil.which(command) is None]
        if missing:
            raise ConfigError(f"hydra/launcher=slurm: no `{missing[0]}` on this machine; submit from a SLURM login "
                              "node, or run the sweep here with hydra/launcher=local")
        return super().executor()

    def named(self, jobs, folders: list[str]) -> None:
        for job, folder in zip(jobs, folders):
            ask("scontrol", "update", f"JobId={job.job_id}", f"JobName=memdefrag:{folder}")

    def states(self, jobs) -> dict[str, str]:
        """From squeue (not sacct: a cluster without accounting answers too). A job squeue no longer lists
        has ENDED; while squeue fails otherwise (slurmctld busy), every state is UNKNOWN and the wait goes on."""
        ids = ",".join(job.job_id for job in jobs)
        answer = ask("squeue", "-h", "-r", "--states=all", "-j", ids, "-o", "%i|%T|%r")
        if answer.returncode and "Invalid job id" not in answer.stderr:
            return {job.job_id: "UNKNOWN" for job in jobs}
        listed = {i: (f"{state} ({reason})" if state == "PENDING" and reason != "None" else state)
                  for i, state, reason in (row.split("|") for row in answer.stdout.splitlines() if row)}
        return {job.job_id: listed.get(job.job_id, "ENDED") for job in jobs}
