"""`memdefrag migrate RESULTS_DIR`: every run folder below brought to the current record format, so that one
report reads them all alike.

- config.yaml: every setting added since the run was written, at the value it then had (harness.results.folder.as_of_now),
  so that no table splits a method's column on a setting that older runs did not record;
- predictions.jsonl: each record annotated by the record hooks of this version (RECORD_HOOKS: the positions it
  read past its model's trained window, harness/report/window_records.py; what ranked it), groups.jsonl's hashes
  following;
- run.json: how many records read past the window (harness/report/window_records.py);
- metrics.csv: the task's metrics of the finished groups' records as this version computes them (intervals
  included);
- the folder's name: a name that is not plain (brackets, commas, spaces, `=`: a label's settings, as older
  versions named folders) renamed to harness.results.folder.folder_name of it, refused in one line before anything moves
  where that name is taken or a run is writing the folder.

Nothing is guessed and no answer changes: a migrated folder reads as the same run, and migrating twice changes
nothing.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

from omegaconf import OmegaConf

from harness.errors import ConfigError, OneLineParser
from harness.plugins.contracts import build, metrics_table
from harness.results.folder import (RunLock, as_of_now, atomic_write, digest, finished, folder_name,
                                    read_config, read_jsonl, read_lines)
from harness.results.summary import run_folders
from harness.report.window_records import summarize, with_beyond_window


def with_ranker(config: dict, records: list[dict]) -> list[dict]:
    """A ranked record of a retriever's run (method.ranker other than density) says what ranked it: `ranked_by`,
    which records write since the rank column is labelled by its ranker."""
    ranker = config["method"].get("ranker", "density")
    if ranker == "density":
        return records
    return [{**r, "ranked_by": ranker} if "target_rank" in r and "ranked_by" not in r else r for r in records]


# Functions (config, records) -> records that annotate the records of an older run with a field this version
# writes; each returns the records unchanged where it has nothing to add.
RECORD_HOOKS: list[Callable[[dict, list[dict]], list[dict]]] = [with_beyond_window, with_ranker]


def with_hooks(config: dict, records: list[dict]) -> list[dict]:
    """The records of a run of `config` (as_of_now) as this version writes them: each RECORD_HOOKS applied."""
    for hook in RECORD_HOOKS:
        records = hook(config, records)
    return records


def records_now(folder: Path) -> list[dict]:
    """A run folder's records of the groups it finished, as this version writes them, the folder left as it is
    (`memdefrag compare` reads an older run so, against a newer one)."""
    return with_hooks(as_of_now(OmegaConf.to_container(read_config(folder))), finished(folder).records)


def migrate_records(folder: Path, config: dict) -> bool:
    """Annotate predictions.jsonl with RECORD_HOOKS and rehash groups.jsonl's finished groups; a group whose records
    no longer match what it finished with (a kill cut it, or a line was doubled) keeps its old hash, so that a resume
    still runs it again and a report leaves it out. True where anything changed."""
    lines = read_lines(folder / "predictions.jsonl")
    records = with_hooks(config, [record for _, record in lines])
    written = [json.dumps(record) for record in records]
    if written == [line for line, _ in lines]:
        return False
    damaged = set(finished(folder).damaged)             # read before the records are rewritten
    atomic_write(folder / "predictions.jsonl", "".join(line + "\n" for line in written))
    groups = folder / "groups.jsonl"
    if groups.is_file():
        by_group: dict = {}
        for line, record in zip(written, records):
            by_group.setdefault(record.get("group"), []).append(line)
        entries = [entry if entry.get("group") in damaged else
                   {**entry, "records": len(by_group.get(entry.get("group"), [])),
                    "sha256": digest(by_group.get(entry.get("group"), []))} for entry in read_jsonl(groups)]
        atomic_write(groups, "".join(json.dumps(entry) + "\n" for entry in entries))
    return True


def migrate(folder: Path) -> list[str]:
    """Bring one run folder to the current format; returns the files it rewrote."""
    config = OmegaConf.to_container(read_config(folder))
    now = as_of_now(config)
    changed = []
    if now != config:
        atomic_write(folder / "config.yaml", OmegaConf.to_yaml(now))
        changed.append("config.yaml")
    if migrate_records(folder, now):
        changed.append("predictions.jsonl")
    metrics_file = folder / "metrics.csv"
    records = finished(folder).records
    if summarize(folder, now, records):
        changed.append("run.json")
    if metrics_file.is_file() and records:
        task = build(OmegaConf.create(now["task"]), "task")
        text = metrics_table(task, records, now["method"]["label"]).to_csv(index=False)
        if text != metrics_file.read_text():
            atomic_write(metrics_file, text)
            changed.append("metrics.csv")
    return changed


def rename_all(root: Path) -> dict[Path, Path]:
    """Every run folder below `root` whose name is not plain renamed to folder_name of it; {old: new}. Refused,
    before any folder moves, where a new name is taken (by a folder, or by two old names) or a run holds a
    folder's lock (harness.results.folder.RunLock names the holder)."""
    moves = {f: f.with_name(folder_name(f.name)) for f in run_folders(root) if folder_name(f.name) != f.name}
    for old, new in moves.items():
        if new.exists() or list(moves.values()).count(new) > 1:
            raise ConfigError(f"{old}: its plain name {new.name} is taken (by {new if new.exists() else 'another run'}"
                              "): move one of them away, then migrate again")
        if (old / ".lock").is_file():
            RunLock(old).release()
    for old, new in moves.items():
        old.rename(new)
    return moves


def migrate_all(root: Path, prog: str = "memdefrag migrate") -> tuple[dict[Path, list[str]], list[Path]]:
    """Every run folder below `root` plainly named and migrated: {folder: what changed} of those that changed
    (`renamed from OLD` where it was renamed, then the files rewritten), and the folders left as they are, each
    named in one line on stderr (a file that cannot be read: the others are migrated all the same)."""
    if not root.is_dir():
        raise ConfigError(f"{root}: no such folder (give the folder that holds the result folders)")
    was = {new: old for old, new in rename_all(root).items()}
    changes, left = {}, []
    for folder in run_folders(root):
        try:
            changes[folder] = ([f"renamed from {was[folder].name}"] if folder in was else []) + migrate(folder)
        except ConfigError as err:
            print(f"{prog}: {err}; that run folder is left as it is", file=sys.stderr)
            left.append(folder)
    return {folder: changed for folder, changed in changes.items() if changed}, left


def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(prog="memdefrag migrate", description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="?", default="results")
    root = Path(parser.parse_args(argv).results)
    if root.is_dir() and not run_folders(root):
        raise ConfigError(f"{root} holds no run folder (a folder with predictions.jsonl): nothing to migrate")
    changed, left = migrate_all(root)
    print_migrations(changed)
    print(f"{len(changed)} of {len(run_folders(root))} run folders migrated")
    if left:
        sys.exit(2)                 # each left-out folder is named above


def print_migrations(changed: dict[Path, list[str]]) -> None:
    """One line per run folder migrate_all changed: which, and how (renamed, files rewritten)."""
    for folder, files in changed.items():
        print(f"migrated: {folder} ({', '.join(files)})")
