"""Where a command may write, checked before it does any work: each refusal is one line naming the option, the
path and what is wrong (a folder where a file is meant, a folder this user may not write, a path that leaves
the folder it belongs to)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from omegaconf import OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from harness.errors import ConfigError


def writable(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK | os.X_OK)


def nearest_existing(path: Path) -> Path:
    """`path` or its nearest ancestor that exists."""
    path = path.absolute()
    while not path.exists():
        path = path.parent
    return path


def writable_file(option: str, path: str | Path) -> None:
    """A file the command can write when it ends: not a folder, its folder existing and writable."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{option} {path}: is a folder; give a file (e.g. {path / 'out.md'})")
    folder = path.absolute().parent
    if not writable(folder):
        why = "does not exist" if not folder.exists() else "is not a folder this user may write"
        raise ConfigError(f"{option} {path}: cannot be written ({folder} {why}); give a file in an existing folder")


ROOM = 1 << 20        # bytes a command needs free before it writes anything (Hydra's own files come first)


def writable_folder(option: str, path: str | Path) -> None:
    """A folder the command can write into or create: what exists of it is a folder this user may write, on a
    filesystem with room left (a full disk otherwise fails inside Hydra, over several lines)."""
    found = nearest_existing(Path(path))
    if not writable(found):
        what = "is not a folder" if not found.is_dir() else "is a folder this user may not write"
        raise ConfigError(f"{option} {path}: cannot be written ({found} {what})")
    free = shutil.disk_usage(found).free
    if free < ROOM:
        raise ConfigError(f"{option} {path}: cannot be written ({found} has {free} bytes free): make room first")


def inside(option: str, path: str | Path, root: str | Path) -> Path:
    """`root`/`path`, refused where `path` is absolute or climbs out of `root` (`..`)."""
    joined = (Path(root) / path).resolve()
    if Path(path).is_absolute() or not joined.is_relative_to(Path(root).resolve()):
        raise ConfigError(f"{option} {path}: must stay inside {root} (a relative path without '..' leaving it)")
    return Path(root) / path


def job_folder(cfg, num: int, multirun: bool) -> Path | None:
    """The folder a job writes, as Hydra will name it (`cfg` composed with Hydra's config; a sweep's job `num`, in
    the order of its jobs); None where its name is made of what only the running job knows."""
    try:
        return Path(str(cfg.hydra.sweep.dir)) / sweep_subdir(cfg, num) if multirun else Path(str(cfg.hydra.run.dir))
    except OmegaConfBaseException as err:
        named = OmegaConf.to_container(cfg.hydra.sweep if multirun else cfg.hydra.run, resolve=False)
        if "${hydra:" in str(named):          # Hydra's own resolver, set only inside the job
            return None
        raise ConfigError(f"{'hydra.sweep' if multirun else 'hydra.run'}: {str(err).splitlines()[0]}") from None


def sweep_subdir(cfg, num: int) -> str:
    """A sweep's job's folder name (hydra.sweep.subdir) as job `num` composes it, its number and id as the
    launchers give them."""
    with open_dict(cfg.hydra.job):
        cfg.hydra.job.num, cfg.hydra.job.id = num, f"job_id_for_{num}"
    return str(cfg.hydra.sweep.subdir)
