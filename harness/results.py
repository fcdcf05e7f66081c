"""The self-describing result folder of one run, resumable.

config.yaml (resolved), predictions.jsonl (one line per question, written as it
is answered), groups.jsonl (one line per finished group, written after its
answers), metrics.csv (accuracy per step), run.json (versions, git hash,
timing, peak memory).

A group counts once groups.jsonl says it finished. Rerunning the same config
into the folder keeps those groups, drops the answers of a group cut short (also
by kill -9, mid-line), and runs only what is missing.
"""

from __future__ import annotations

import json
import platform
import resource
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import torch
from omegaconf import OmegaConf

from harness.errors import ConfigError

PACKAGES = ("torch", "transformers", "hydra-core", "wandb", "memdefrag")


def git_hash() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def versions() -> dict[str, str | None]:
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def reset_peak_memory() -> None:
    """Start counting the CUDA allocator's peak afresh (the jobs of a sweep share one process)."""
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def peak_memory_mb() -> dict[str, float]:
    """Process peak RSS (over the whole process: every job it ran so far), and the CUDA allocator's
    peak since reset_peak_memory where a GPU is used."""
    peak = {"cpu_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if torch.cuda.is_available():
        peak["cuda_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return peak


class ResultFolder:
    # settings that do not change a run's answers: a resumed run may change them
    FREE = ("threads", "logger", "resume")

    def __init__(self, folder: str | Path, cfg, resume: bool = True):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.done: dict[int, float] = {}                  # finished group -> seconds it took
        self.records: list[dict] = []
        if resume and (self.folder / "groups.jsonl").exists():
            self._check_same_run(cfg)
            self.done = {g["group"]: g["seconds"] for g in read_jsonl(self.folder / "groups.jsonl")}
            self.records = [r for r in read_jsonl(self.folder / "predictions.jsonl") if r["group"] in self.done]
        (self.folder / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
        self._predictions = _rewrite(self.folder / "predictions.jsonl", self.records)
        self._groups = _rewrite(self.folder / "groups.jsonl",
                                [{"group": g, "seconds": t} for g, t in self.done.items()])

    def _check_same_run(self, cfg) -> None:
        def comparable(conf):
            return {k: v for k, v in OmegaConf.to_container(conf, resolve=True).items() if k not in self.FREE}
        before, now = comparable(OmegaConf.load(self.folder / "config.yaml")), comparable(cfg)
        changed = sorted(k for k in before.keys() | now.keys() if before.get(k) != now.get(k))
        if changed:
            raise ConfigError(f"{self.folder} holds a run with other settings ({', '.join(changed)}); "
                              "choose another output folder, or pass resume=false to start it over")

    def add(self, record: dict) -> None:
        self.records.append(record)
        self._predictions.write(json.dumps(record) + "\n")
        self._predictions.flush()

    def end_group(self, group: int, seconds: float) -> None:
        self.done[group] = seconds
        self._groups.write(json.dumps({"group": group, "seconds": seconds}) + "\n")
        self._groups.flush()

    def finish(self, metrics, info: dict) -> None:
        self._predictions.close()
        self._groups.close()
        metrics.to_csv(self.folder / "metrics.csv", index=False)
        info = {**info, "versions": versions(), "git": git_hash(), "argv": sys.argv}
        (self.folder / "run.json").write_text(json.dumps(info, indent=2))


def read_run_info(folder: Path) -> dict:
    return json.loads((Path(folder) / "run.json").read_text())


def metrics_table(task, records: list[dict], label: str):
    """The task's metrics of `records`, labelled with the method."""
    metrics = task.metrics(records)
    metrics.insert(0, "method", label)
    return metrics


def read_jsonl(path: Path) -> list[dict]:
    """The complete lines of a JSONL file; a line cut short by a kill is skipped."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines() if path.exists() else []:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def _rewrite(path: Path, rows: list[dict]):
    """Write `rows` to `path` and return it open for appending."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return open(path, "a", encoding="utf-8")
