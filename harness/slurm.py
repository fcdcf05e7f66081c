"""Sweeps through hydra-submitit-launcher that say what happens: `hydra/launcher=slurm` (and `local`); the
launchers Hydra finds are declared in hydra_plugins/memdefrag_launchers.

Before anything is submitted, SLURM itself is asked whether it can place a job of the sweep (`sbatch
--test-only`): a bad partition or a request no node meets ends the command with one line naming what the
partitions offer. The sweep goes in as one array job whose tasks are named `memdefrag:<run folder>`; while
it runs, one status line per change (job id, pending reason, running and finished counts, the log folder).
A job that fails raises in the job, so SLURM records it FAILED and submitit keeps its error; the command waits
for every other job, writes the summary of what finished, then exits 2 with each failed job's own line, its
job id and its log. Interrupted while waiting, it cancels its jobs. Rerunning the same command into the same
hydra.sweep.dir resumes every run (harness.results keeps finished groups); so do requeued and timed-out jobs.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra_plugins.hydra_submitit_launcher import submitit_launcher
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from omegaconf import OmegaConf, open_dict

from harness.errors import ConfigError, stops_on_config_error
from harness.summary import SweepSummary

COMMANDS = ("sbatch", "srun", "squeue", "scontrol", "sinfo")     # what submitting and waiting take
POLL_S = 5                     # seconds between looks at the queue while waiting
ASK_S = 30                     # the longest wait for one answer of sbatch, squeue or scontrol
MARK = "harness.slurm.JobFailed: "    # how a failed job's own line reads in the trace submitit keeps
# states after which a job runs no more: SLURM's (a requeued job passes through PENDING instead), then local ones
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
         "ENDED", "FINISHED", "INTERRUPTED"}


class JobFailed(Exception):
    """A run that failed inside its job, as one line (what the submitting command prints)."""


def ask(*command: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """Run a SLURM command; a SLURM that does not answer is one line."""
    try:
        return subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=ASK_S)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"hydra/launcher=slurm: `{' '.join(command)}` did not answer in {ASK_S} s: "
                          "is slurmctld up (`sinfo`)?") from None


def partitions() -> str:
    """What each partition offers, for a message: `cpu (1 node, 2 CPUs, 24105 MB, gpu:1)`."""
    rows = ask("sinfo", "-h", "-o", "%P|%D|%c|%m|%G").stdout.split()
    return ", ".join(f"{p.rstrip('*')} ({n} node{'s' * (n != '1')}, {c} CPUs, {m} MB, "
                     f"{'no GPUs' if g == '(null)' else g})" for p, n, c, m, g in (row.split("|") for row in rows))


def check_request(script: str, params: dict) -> None:
    """Ask SLURM whether it can place a job of this sweep (partition, CPUs, memory, GPUs, time): one line if not."""
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


class Waiting(submitit_launcher.BaseSubmititLauncher):
    """The shared part: submit one array, wait for every job with a status line per change, report failures."""

    def __call__(self, *args) -> JobReturn:
        """In the job: a run that fails raises (the job ends FAILED, submitit keeps the line) instead of
        returning a failed result that SLURM would count as COMPLETED."""
        ret = super().__call__(*args)
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
                                      if k not in init})
        return executor

    def preflight(self, executor) -> None:
        """Checks before anything is submitted (SLURM: can it place the jobs)."""

    def named(self, jobs, folders: list[str]) -> None:
        """Give each job its run's name where the scheduler shows names (SLURM)."""

    def states(self, jobs) -> dict[str, str]:
        """Job id -> state (`PENDING (reason)`, RUNNING, ...) of the jobs without a result yet."""
        return {job.job_id: job.state for job in jobs}

    def launch(self, job_overrides, initial_job_idx: int) -> list[JobReturn]:
        """Check, submit every run as one array, say where each goes, wait, and return their results."""
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        with stops_on_config_error("memdefrag"):
            executor = self.executor()
            self.preflight(executor)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        nums = range(initial_job_idx, initial_job_idx + len(job_overrides))
        folders = [self.run_folder(list(o), num) for o, num in zip(job_overrides, nums)]
        jobs = executor.map_array(self, [list(o) for o in job_overrides], ["hydra.sweep.dir"] * len(nums), list(nums),
                                  [f"job_id_for_{num}" for num in nums], [Singleton.get_state()] * len(nums))
        logs = Path(jobs[0].paths.folder).parent
        print(f"submitted {len(jobs)} runs as {self._EXECUTOR} job {jobs[0].job_id.split('_')[0]}; "
              f"job logs in {logs}", flush=True)
        for job, overrides, folder in zip(jobs, job_overrides, folders):
            print(f"  {job.job_id}: {folder}  ({' '.join(filter_overrides(overrides))})", flush=True)
        self.named(jobs, folders)
        return self.returns(jobs, folders, self.wait(jobs, logs), sweep_dir)

    def run_folder(self, overrides: list[str], num: int) -> str:
        """The folder name a job's run writes (hydra.sweep.subdir), as the job will compose it."""
        config = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
        with open_dict(config.hydra.job):
            config.hydra.job.num = num
        return str(config.hydra.sweep.subdir)

    def wait(self, jobs, logs: Path) -> dict[str, str]:
        """Until every job has a result or has ended (seen so at two looks in a row: a result still missing is
        not coming); a status line per change. Returns the last state of each job still without a result.
        Interrupted (Ctrl-C, SIGTERM), cancel the jobs, so none stays queued behind a command that is gone."""
        previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
        said, ended = None, False
        array = jobs[0].job_id.split("_")[0]
        try:
            while True:
                waiting = [job for job in jobs if not job.paths.result_pickle.exists()]
                states = self.states(waiting) if waiting else {}
                counts = sorted(Counter(states.values()).items())
                line = ", ".join([*(f"{n} {state.lower()}" for state, n in counts),
                                  f"{len(jobs) - len(waiting)} of {len(jobs)} done"])
                if line != said:
                    print(f"[{time.strftime('%H:%M:%S')}] job {array}: {line}; logs in {logs}", flush=True)
                    said = line
                now_ended = all(state.split()[0] in ENDED for state in states.values())
                if not waiting or ended and now_ended:
                    return states
                ended = now_ended
                time.sleep(1 if ended else POLL_S)
        except KeyboardInterrupt:
            for job in jobs:
                job.cancel(check=False)
            print(f"memdefrag: interrupted: cancelled job {array}; rerun the same command to resume "
                  f"(finished groups are kept)", file=sys.stderr)
            sys.exit(130)
        finally:
            signal.signal(signal.SIGTERM, previous)

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


class Slurm(Waiting):
    """hydra/launcher=slurm's part. gpus_per_node null: one GPU per job, none for a CPU model (model.device=cpu)."""

    def setup(self, **kwargs) -> None:
        super().setup(**kwargs)
        if self.params.get("gpus_per_node") is None:
            self.params["gpus_per_node"] = 0 if str(self.config.model.device) == "cpu" else 1

    def executor(self):
        missing = [command for command in COMMANDS if shutil.which(command) is None]
        if missing:
            raise ConfigError(f"hydra/launcher=slurm: no `{missing[0]}` on this machine; submit from a SLURM login "
                              "node, or run the sweep here with hydra/launcher=local")
        return super().executor()

    def preflight(self, executor) -> None:
        check_request(executor._executor._make_submission_file_text("true", "preflight"), self.params)

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
