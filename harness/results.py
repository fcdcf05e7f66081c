"""The self-describing result folder of one run.

config.yaml (resolved), predictions.jsonl (one line per question, written as it
is answered), metrics.csv (accuracy per step), run.json (versions, git hash,
timing, peak memory).
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


def peak_memory_mb() -> dict[str, float]:
    """Process peak RSS, and the CUDA allocator's peak where a GPU is used."""
    peak = {"cpu_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if torch.cuda.is_available():
        peak["cuda_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return peak


class ResultFolder:
    def __init__(self, folder: str | Path, cfg):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
        self._predictions = open(self.folder / "predictions.jsonl", "w", encoding="utf-8")

    def add(self, record: dict) -> None:
        self._predictions.write(json.dumps(record) + "\n")
        self._predictions.flush()

    def finish(self, metrics, info: dict) -> None:
        self._predictions.close()
        metrics.to_csv(self.folder / "metrics.csv", index=False)
        info = {**info, "versions": versions(), "git": git_hash(), "argv": sys.argv}
        (self.folder / "run.json").write_text(json.dumps(info, indent=2))
