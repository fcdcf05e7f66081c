"""Sharded runs: a run's groups split over jobs (`shard=i/n`), and merged back into one run.

Every group's result depends on the group alone (its shuffles and random forgetting are
seeded by its index; distractors are formed deterministically), so the merge of all shards
equals the unsharded run, answer for answer.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

from omegaconf import OmegaConf

from harness.errors import ConfigError
from harness.plugins.contracts import build, metrics_table
from harness.results.folder import ResultFolder, devices_of, finished, folder_word, read_config, read_run_info
from harness.results.summary import run_folders


def parse(spec: str | None) -> tuple[int, int] | None:
    """`"i/n"` -> (i, n) with 0 <= i < n; None for an unsharded run."""
    if spec is None:
        return None
    try:
        index, count = (int(part) for part in str(spec).split("/"))
    except ValueError:
        index, count = -1, 0
    if not 0 <= index < count:
        raise ConfigError(f"shard={spec!r} must be 'i/n' with 0 <= i < n, e.g. shard=0/2")
    return index, count


def select(groups: list, shard: tuple[int, int] | None) -> list:
    """The groups of this shard: every n-th, starting at the i-th. A shard that would select none is refused
    (an empty run would count as a finished shard and merge into nothing)."""
    if shard is None:
        return groups
    index, count = shard
    chosen = [g for g in groups if g.index % count == index]
    if not chosen:
        raise ConfigError(f"shard={index}/{count} selects none of the {len(groups)} groups: split them into at most "
                          f"{len(groups)} shards")
    return chosen


def merge_sweep(folder: str | Path) -> list[Path]:
    """Merge every complete set of shards under `folder` into `folder`/merged/<run>; returns those runs."""
    if not Path(folder).is_dir():
        raise ConfigError(f"{folder}: no such folder (give a sweep folder holding shard runs)")
    sets: dict[str, list[tuple[Path, tuple[int, int]]]] = defaultdict(list)
    configs = {}
    for run_dir in run_folders(folder):       # result folders only: Hydra's own .hydra/config.yaml is no run
        try:
            cfg = configs[run_dir] = read_config(run_dir)
        except ConfigError as err:
            raise ConfigError(f"{err}: that folder is no run this command can merge; move it out of {folder}") \
                from None
        if cfg.get("shard") is None:
            continue
        free = {key: None for key in ResultFolder.FREE if key in cfg}     # shards may differ in these
        unsharded = OmegaConf.to_yaml(OmegaConf.merge(cfg, {"shard": None, **free}))
        sets[unsharded].append((run_dir, parse(cfg.shard)))
    if not sets:
        raise ConfigError(f"{folder}: holds no sharded runs (shard=i/n) to merge")
    merged = []
    for unsharded, shards in sets.items():
        count = shards[0][1][1]
        found = sorted(index for _, (index, _) in shards)
        twice = sorted({f"{i}/{n}" for _, (i, n) in shards if sum(s == (i, n) for _, s in shards) > 1})
        if twice:
            raise ConfigError(f"shards {twice} of {shards[0][0].name} are there twice "
                              f"({', '.join(str(p) for p, s in shards if f'{s[0]}/{s[1]}' in twice)}): keep one of each")
        if found != list(range(count)) or any(n != count for _, (_, n) in shards):
            raise ConfigError(f"shards of {shards[0][0].name} are incomplete: found "
                              f"{[f'{i}/{n}' for _, (i, n) in shards]}, need 0/{count}..{count - 1}/{count}")
        first_path = min(shards, key=lambda s: s[1])[0]
        first = configs[first_path]
        target = Path(folder) / "merged" / unsharded_name(first_path.name, first.shard)
        merged.append(merge([path for path, _ in sorted(shards, key=lambda s: s[1])], target,
                            OmegaConf.merge(OmegaConf.create(unsharded), {key: first.get(key) for key in
                                                                          ResultFolder.FREE if key in first})))
    return merged


def unsharded_name(name: str, spec: str) -> str:
    """A shard's folder name less the word a sweep told it apart by (`x_shard-0-2` -> `x`: jobs.told_apart), as it
    is where it has none (a folder named otherwise)."""
    return re.sub(rf"_shard-{re.escape(folder_word(spec))}(?=_|$)", "", name)


def merge(shard_dirs: list[Path], target: Path, cfg) -> Path:
    """Write the run that the finished shards in `shard_dirs` make together."""
    infos, shards = [], []
    for path in shard_dirs:
        if not (path / "run.json").is_file():
            raise ConfigError(f"shard {path} has not finished (no run.json); rerun it, it resumes")
        if not (path / "groups.jsonl").is_file():
            raise ConfigError(f"shard {path} has no groups.jsonl (a run older than the file): rerun it with "
                              f"resume=false")
        infos.append(read_run_info(path))
        shards.append(finished(path))
        if shards[-1].damaged or len(shards[-1].seconds) != infos[-1].get("groups"):
            raise ConfigError(f"shard {path} has not finished: its groups.jsonl vouches for {len(shards[-1].seconds)} "
                              f"of its {infos[-1].get('groups')} groups; rerun it, it resumes")
    records = sorted((r for shard in shards for r in shard.records), key=lambda r: r["group"])   # steps in order
    seconds = {group: s for shard in shards for group, s in shard.seconds.items()}
    metrics = metrics_table(build(cfg.task, "task"), records, cfg.method.label)
    peaks = defaultdict(float)
    for info in infos:
        for key, value in info.get("peak_memory", {}).items():
            peaks[key] = max(peaks[key], value)
    total = sum(seconds.values())
    devices = dict.fromkeys(name for shard, info in zip(shards, infos)     # the machines each shard's groups ran on
                            for name in devices_of(shard.timed, info.get("device_name") or info.get("device")))
    info = {**{k: v for k, v in infos[0].items() if k not in ("versions", "git", "argv")},
            "groups": len(seconds), "seconds": {"total": total, "per_group": total / len(seconds)},
            "peak_memory": dict(peaks), "shards": [str(p) for p in shard_dirs],
            "device_name": " + ".join(map(str, devices))}
    with ResultFolder(target, cfg, resume=False) as out:
        for record in records:
            out.add(record)
        out.timed = {group: timed for shard in shards for group, timed in shard.timed.items()}
        for group in sorted(seconds):
            out.end_group(group, seconds[group])
        retimed = out.retimed()                     # shards may run under other threads: their seconds mix them
        out.finish(metrics, {**info, "seconds": {**info["seconds"], **({"retimed": retimed} if retimed else {})}})
    return target
