"""The self-describing result folder of one run, resumable, with one writer.

config.yaml (resolved), predictions.jsonl (one line per question, written as it
is answered), groups.jsonl (one line per finished group, written after its
answers: its record count and their sha256), metrics.csv (accuracy per step),
run.json (versions, git hash, timing, peak memory).

One writer per folder: a run holds an exclusive lock on `.lock` for its life (the
OS releases it when the process dies, even by kill -9); a second run or resume
into the folder is refused, naming the holder.

A group counts once groups.jsonl says it finished and its records on disk are
exactly the ones it finished with (count and hash). Rerunning the same config
into the folder keeps those groups, reruns any group whose records are cut,
damaged or doubled, drops the answers of a group cut short (also by kill -9,
mid-line), and runs only what is missing. A write that fails (a full disk) stops
the run with one line naming the folder; what was finished stays on disk.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import inspect
import json
import os
import platform
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import NamedTuple

import yaml
from omegaconf import OmegaConf
from omegaconf._utils import get_yaml_loader
from omegaconf.errors import OmegaConfBaseException

from harness.errors import ConfigError

PACKAGES = ("torch", "transformers", "hydra-core", "wandb", "memdefrag")


NOT_CODE = (":(exclude)results", ":(exclude)tests", ":(exclude)docs", ":(exclude)*.md")   # what a run never runs


def git_hash() -> str | None:
    """The commit of the checkout this code runs from, `<commit>-modified` where its tracked code differs from that
    commit (the run ran code no commit holds); None where the code is not a checkout's own (an installed wheel, or
    an exported copy that lies inside some other repository, whose commit says nothing of it)."""
    here = Path(__file__).resolve()
    project = here.parents[2]

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True, cwd=project).stdout

    try:
        top, head = git("rev-parse", "--show-toplevel", "HEAD").split()
        git("ls-files", "--error-unmatch", str(here.relative_to(project)))      # this code is the checkout's
        modified = git("status", "--porcelain", "--untracked-files=no", "--", ".", *NOT_CODE).strip()
    except (OSError, subprocess.CalledProcessError, ValueError):
        return None
    return head + ("-modified" if modified else "") if Path(top).resolve() == project else None


def versions() -> dict[str, str | None]:
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


class RunLock:
    """An exclusive lock on <folder>/.lock, held until `release` or the process's end; the file names the
    holder (pid, host, start time) for the one-line refusal of a second writer, which ends with `then`."""

    def __init__(self, folder: Path, then: str = "wait for it to end or choose another output folder"):
        try:
            self.handle = open(folder / ".lock", "a+", encoding="utf-8")
        except OSError as err:
            raise ConfigError(f"cannot write the results in {folder}: {err.strerror or err}; choose another output "
                              f"folder") from None
        try:
            fcntl.flock(self.handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.handle.seek(0)
            holder = self.handle.read().strip() or "a process that has not named itself yet"
            self.handle.close()
            raise ConfigError(f"{folder} is being written by another run ({holder}); {then}") from None
        except OSError as err:          # a filesystem that refuses locks (Lustre mounted without flock)
            self.handle.close()
            raise ConfigError(f"{folder} cannot be locked for its one writer ({err.strerror or err}): its filesystem "
                              f"takes no flock; choose an output folder on one that does (a local disk, or a mount "
                              f"with locking)") from None
        self.handle.seek(0)
        self.handle.truncate()
        self.handle.write(f"pid {os.getpid()} on {socket.gethostname()}, since "
                          f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        self.handle.flush()

    def release(self) -> None:
        if not self.handle.closed:
            fcntl.flock(self.handle, fcntl.LOCK_UN)
            self.handle.close()


PLAIN = "A-Za-z0-9_.@-"                     # what a folder name may hold besides '+': nothing to quote
PLAIN_WORD = re.compile(f"[{PLAIN}]+")


def folder_name(label: str) -> str:
    """A run folder's name from the label its tables print (`ape T=0.9 S=0.9+informativeness seed=43`): the label's
    plain words joined by '+' and, where it has any other word (`name=value`, a list), '-' and 8 hex digits of the
    label's sha256 (`ape+informativeness-4cad690e`): short, typeable, the same for the same label; the folder's
    config.yaml says the rest. A plain label, and so any name this returns, is its own name."""
    words = label.replace(" ", "+").split("+")
    plain = [word for word in words if PLAIN_WORD.fullmatch(word)]
    if len(plain) == len(words):
        return "+".join(words)
    return ("+".join(plain) or "run") + "-" + hashlib.sha256("+".join(words).encode()).hexdigest()[:8]


WORD_CHARACTERS = 40     # past this, a value's word is cut and ends in a digest of the whole (a list of 150 steps)


def folder_word(value) -> str:
    """A setting's value as one plain word of a folder name, written as on the command line (`true`, `null`):
    each run of other characters than PLAIN's made one '-' (`0/2` -> `0-2`, `[10, 20]` -> `10-20`), and a
    word longer than WORD_CHARACTERS cut, with 8 hex digits of its sha256."""
    text = "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    word = re.sub(f"[^{PLAIN}]+", "-", text).strip("-") or "-"
    if len(word) <= WORD_CHARACTERS:
        return word
    return word[:WORD_CHARACTERS - 9] + "-" + hashlib.sha256(word.encode()).hexdigest()[:8]


def digest(lines: list[str]) -> str:
    """sha256 of a group's record lines as written."""
    return hashlib.sha256("".join(line + "\n" for line in lines).encode()).hexdigest()


class ResultFolder:
    # settings that change neither a run's answers nor what it is (allow_beyond_window: whether one runs): a resumed
    # run, a shard, may change them (reuse_formed and formation_batch change no answer either, but what formation
    # costs: a timed run of another is another run, in a column of its own)
    FREE = ("threads", "logger", "resume", "allow_beyond_window")
    # what a group's seconds depend on beyond its settings (threads among FREE; the device's name, where `auto` or
    # a CUDA index may pick another on resume): each group's, in groups.jsonl
    TIMING = ("threads", "device_name")

    def __init__(self, folder: str | Path, cfg, resume: bool = True):
        self.folder = Path(folder)
        with self.writing():
            self.folder.mkdir(parents=True, exist_ok=True)
        self.lock = RunLock(self.folder)
        self.done: dict[int, float] = {}                  # finished group -> seconds it took
        self.records: list[dict] = []
        self.lines: dict[int, list[str]] = {}             # group -> its record lines as written
        self.rerun: list[int] = []                        # finished groups whose records were damaged
        self.cfg, self.kept = cfg, []                     # what the folder's files become at the first write
        self.timed: dict[int, dict | None] = {}           # finished group -> the TIMING settings it ran under
        self.timing: dict | None = None                   # those this process runs groups under (the runner's)
        self._predictions = self._groups = None
        try:
            if resume and holds_results(self.folder):
                self.kept = self._verified_groups(same_run(self.folder, cfg))
            self._check_writable()
        except BaseException:
            self.lock.release()
            raise

    def _check_writable(self) -> None:
        """Before any work: the folder takes new files, and none of its files' names is taken by a folder (the
        files are replaced whole, not written in place)."""
        with self.writing():
            for name in ("config.yaml", "predictions.jsonl", "groups.jsonl"):
                if (self.folder / name).is_dir():
                    raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(self.folder / name))
            probe = self.folder / f".{os.getpid()}.probe"
            probe.write_text("", encoding="utf-8")
            probe.unlink()

    def _open(self) -> None:
        """At this run's first write, the folder's files become its own: its config, the records it kept; an
        earlier run's run.json and metrics.csv go (they said it finished: a merge or a report would take this
        unfinished run for it). Until then a run that stops (a model that fails to load, under resume=false)
        leaves the results it found."""
        if self._predictions is None:
            with self.writing():                # the config last: until it is written the records are the old run's
                for finished_only in ("run.json", "metrics.csv"):
                    (self.folder / finished_only).unlink(missing_ok=True)
                self._predictions = _rewrite(self.folder / "predictions.jsonl", self.kept)
                self._groups = _rewrite(self.folder / "groups.jsonl", [self._group_line(g) for g in self.done])
                atomic_write(self.folder / "config.yaml", OmegaConf.to_yaml(self.cfg, resolve=True))

    def _verified_groups(self, earlier) -> list[str]:
        """Keep the finished groups whose records on disk are the ones they finished with (the rest run again);
        returns their record lines, in file order. earlier: the folder's config.yaml, as it was read."""
        found = finished(self.folder)
        self.done, self.lines, self.rerun = found.seconds, found.lines, found.damaged
        try:                                    # what a group older than a TIMING record ran under: its
            ran = read_run_info(self.folder) if (self.folder / "run.json").is_file() else {}    # config's, or
        except ConfigError:                     # run.json's (a damaged one says nothing; it goes at the first write)
            ran = {}

        def said(key: str):
            return earlier.get(key) if earlier.get(key) is not None else ran.get(key)

        configured = {key: said(key) for key in self.TIMING if said(key) is not None}
        self.timed = {group: {**configured, **(timed or {})} or None for group, timed in found.timed.items()}
        self.records = found.records
        return [line for line, _ in found.kept]

    def complete(self, groups: list[int]) -> bool:
        """Whether the run in the folder finished, every one of `groups` with it: nothing to run again."""
        return (self.folder / "run.json").is_file() and set(groups) <= set(self.done)

    def _group_line(self, group: int) -> dict:
        lines = self.lines.get(group, [])
        timed = {"timed_under": self.timed[group]} if self.timed.get(group) else {}
        return {"group": group, "seconds": self.done[group], "records": len(lines), "sha256": digest(lines), **timed}

    def devices(self, fallback: str) -> str:
        """The devices its finished groups ran on (timed_under), by name, in the order first seen and joined by
        ' + '; `fallback` where no group recorded one (a run older than the record)."""
        return " + ".join(devices_of(self.timed, fallback))

    def retimed(self, now: dict | None = None) -> dict[str, list]:
        """Each TIMING setting under which the finished groups (and `now`: those the next would run under) ran with
        more than one value: those values, in the order first seen. Empty where their seconds are of one setting."""
        seen: dict[str, list] = {}
        for timed in [*self.timed.values(), now]:
            for key, value in (timed or {}).items():
                seen.setdefault(key, [])
                if value not in seen[key]:
                    seen[key].append(value)
        return {key: values for key, values in seen.items() if len(values) > 1}

    @contextmanager
    def writing(self):
        """A failed write (a full disk, a folder made read-only) ends the run with one line naming the folder."""
        try:
            yield
        except OSError as err:
            if err.errno in (errno.ENOSPC, errno.EDQUOT):
                raise ConfigError(f"cannot write the results in {self.folder}: {err.strerror}; the groups finished "
                                  f"so far are kept: make room and rerun the same command to resume") from None
            raise ConfigError(f"cannot write the results in {self.folder}: {err.filename2 or err.filename or self.folder}: "
                              f"{err.strerror or err}; the groups finished so far are kept: mend that path (or "
                              f"choose another output folder) and rerun the same command to resume") from None

    def add(self, record: dict) -> None:
        line = json.dumps(record)
        self._open()
        with self.writing():
            self._predictions.write(line + "\n")
            self._predictions.flush()
        self.records.append(record)
        self.lines.setdefault(record["group"], []).append(line)

    def end_group(self, group: int, seconds: float) -> None:
        self._open()
        self.done[group] = seconds
        if self.timing is not None:
            self.timed[group] = dict(self.timing)
        with self.writing():
            self._groups.write(json.dumps(self._group_line(group)) + "\n")
            self._groups.flush()

    def finish(self, metrics, info: dict) -> None:
        self._open()
        with self.writing():
            self._predictions.close()
            self._groups.close()
            atomic_write(self.folder / "metrics.csv", metrics.to_csv(index=False))
            info = {**info, "versions": versions(), "git": git_hash(), "argv": sys.argv}
            atomic_write(self.folder / "run.json", json.dumps(info, indent=2))

    def close(self) -> None:
        """Stop writing and let another run have the folder."""
        for handle in (self._predictions, self._groups):
            if handle is not None and not handle.closed:
                try:
                    handle.close()
                except OSError:
                    pass
        self.lock.release()

    def __enter__(self) -> "ResultFolder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# Settings added after runs were written, at the value those runs had (the behaviour before the setting
# existed), so that an old run resumes, pairs in `memdefrag compare`, keeps its label and is migrated
# (`memdefrag migrate`) without a guess.
LATER_SETTINGS = {"memory_on": "model", "shard": None, "resume": True, "study": None, "decode": None,
                  "allow_beyond_window": True,      # nothing was refused before the window check: every read ran
                  "reuse_formed": True, "formation_batch": None,    # the defaults (run.json says what ran)
                  "forgetting": {"_target_": "methods.forgetting.NoForgetting", "label": "unbounded"},
                  "compression": {"_target_": "methods.compression.compressor.NoCompression", "label": "none"}}
LATER_PLUGIN_SETTINGS = {                  # the same for a plugin's options, by its _target_
    "methods.baselines.TextMemory": {"fit_window": False, "answer_room": 64},
    "evals.locomo.LoCoMo": {"trace_layers": False, "protocol": "bare"},   # the bare question (evals/locomo.py)
    "evals.probe.Probe": {"one_position_per_group": False},
}
# A model's settings added since, at the value they had: the chat prompt, no remote code, and the paper's N_max
# of 12800 memory tokens that every named model's file gave when it was added (it acts only under forgetting,
# which the runs that predate it lack).
LATER_MODEL_SETTINGS = {"prompt": "chat", "trust_remote_code": False, "memory_capacity": 12800}


def holds_results(folder: Path) -> bool:
    """Whether a folder holds a run's results: its groups.jsonl, or records written before there was one."""
    records = folder / "predictions.jsonl"
    return (folder / "groups.jsonl").exists() or records.is_file() and records.stat().st_size > 0


def same_run(folder: Path, cfg):
    """Refuse a run with other settings than the folder's (those of ResultFolder.FREE aside); returns the folder's
    config.yaml. The command checks each job's folder so before Hydra writes into it (harness/running/jobs.py), the
    run again as it opens the folder."""
    try:
        earlier = read_config(folder)
    except ConfigError as err:
        raise ConfigError(f"{folder} holds results but {err}; choose another output folder, or pass "
                          f"resume=false to start it over") from None
    before, now = settings_of(earlier), settings_of(cfg)
    changed = sorted(k for k in before.keys() | now.keys() if before.get(k) != now.get(k))
    if changed:
        raise ConfigError(f"{folder} holds a run with other settings ({', '.join(changed)}); "
                          "choose another output folder, or pass resume=false to start it over")
    return earlier


def settings_of(cfg, aside: tuple[str, ...] = ResultFolder.FREE) -> dict:
    """A run's settings by dotted key, as of now (`as_of_now`), those named in `aside` left out."""
    return flattened({k: v for k, v in as_of_now(OmegaConf.to_container(cfg, resolve=True)).items()
                      if k not in aside})


def as_of_now(config: dict) -> dict:
    """A run's config with every setting added since it was written at the value it then had (after its own)."""
    out = {group: filled(node, LATER_PLUGIN_SETTINGS.get(node.get("_target_"), {})) if isinstance(node, dict)
           else node for group, node in filled(config, LATER_SETTINGS).items()}
    if isinstance(out.get("model"), dict):
        out["model"] = filled(out["model"], LATER_MODEL_SETTINGS)
    return out


def filled(node: dict, later: dict) -> dict:
    """`node` with the settings of `later` it lacks, after its own."""
    return {**node, **{key: value for key, value in later.items() if key not in node}}


def flattened(node, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1}: a config's settings by dotted key (a list is one setting)."""
    if not isinstance(node, dict) or not node:
        return {prefix.rstrip("."): node}
    return {k: v for key, value in node.items() for k, v in flattened(value, f"{prefix}{key}.").items()}


def config_loader():
    """OmegaConf.load's YAML rules (floats such as 1e-3, no timestamps, a duplicate key refused) on libyaml's C
    parser where PyYAML has it: a report reads every run's config, and the pure-Python parser took most of its
    time. The rules are copies of OmegaConf's loader's resolver and constructor tables: nothing added to one
    loader reaches the other."""
    if not hasattr(yaml, "CSafeLoader"):
        return OmegaConfLoader
    return type("ConfigLoader", (yaml.CSafeLoader, OmegaConfLoader), {
        "yaml_implicit_resolvers": {key: list(rules)
                                    for key, rules in OmegaConfLoader.yaml_implicit_resolvers.items()},
        "yaml_constructors": dict(OmegaConfLoader.yaml_constructors)})


OmegaConfLoader = inspect.unwrap(get_yaml_loader)()     # OmegaConf's own, where conf/ has it use ConfigLoader
ConfigLoader = config_loader()


# The settings that make a config a run's, which every reader of a run folder takes as there: what ran (the
# method's label), on what (the task's class) and with which model (its name).
RUN_SETTINGS = ("method.label", "task._target_", "model.name")


def read_config(folder: Path):
    """A run folder's config.yaml (a mapping holding RUN_SETTINGS, read as written: nothing resolved), or a
    ConfigError naming the file and why it cannot be read."""
    path = Path(folder) / "config.yaml"
    try:
        settings = yaml.load(path.read_text(encoding="utf-8"), Loader=ConfigLoader)
        if not isinstance(settings, dict):
            held = f"a {type(settings).__name__}" if settings is not None else "nothing"
            raise ValueError(f"it holds {held}, not a mapping of settings")
        config = OmegaConf.create(settings)
    except (OSError, ValueError, OmegaConfBaseException, yaml.YAMLError) as err:
        why = err.strerror if isinstance(err, OSError) and err.strerror else \
            str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ConfigError(f"{path} cannot be read ({why})") from None
    given = flattened(settings)                 # as written: nothing resolved
    missing = [key for key in RUN_SETTINGS if given.get(key) is None]
    if missing:
        raise ConfigError(f"{path} holds no run's settings (it lacks {', '.join(missing)}, which every run writes)")
    return config


def read_run_info(folder: Path) -> dict:
    """A run's run.json; one line naming the file where it cannot be read."""
    path = Path(folder) / "run.json"
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"{path} cannot be read ({err}): mend or remove it (a finished run writes it last)") \
            from None
    if not isinstance(info, dict):
        raise ConfigError(f"{path} holds no run's summary (a JSON object): mend or remove it")
    return info


def complete_lines(path: Path) -> Iterator[tuple[str, dict]]:
    """(line, record) for each complete line of a JSONL file, parsed as they are taken; a line cut short by a kill
    is skipped. A ConfigError naming the path where it is there but not a file (a folder, a pipe, a dangling link),
    rather than a traceback or a read that never ends."""
    if not os.path.lexists(path):
        return
    if not path.is_file():
        raise ConfigError(f"{path} is not a file that can be read (a folder, a pipe or a dangling link): mend or "
                          f"remove it")
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            yield line, record


def read_lines(path: Path) -> list[tuple[str, dict]]:
    """(line, record) for each complete line of a JSONL file."""
    return list(complete_lines(path))


def read_jsonl(path: Path) -> list[dict]:
    """The complete records of a JSONL file."""
    return [record for _, record in read_lines(path)]


class Finished(NamedTuple):
    """What a run folder finished, as its groups.jsonl vouches: each finished group's seconds and record lines
    (exactly the ones it finished with: their count and sha256), the groups listed as finished whose records on
    disk differ (cut, damaged or doubled: a resume runs them again), and the kept (line, record) pairs in file
    order. A folder without groups.jsonl (a run older than the file) names no finished group (`seconds`, `lines`
    and `timed` empty: a resume starts it over) and keeps every complete record (a report counts them)."""

    seconds: dict[int, float]
    lines: dict[int, list[str]]
    damaged: list[int]
    kept: list[tuple[str, dict]]
    timed: dict[int, dict | None]       # finished group -> the timing settings it ran under (where it says)

    @property
    def records(self) -> list[dict]:
        return [record for _, record in self.kept]


def devices_of(timed: dict[int, dict | None], fallback: str) -> list[str]:
    """The device names that groups' timing records (group -> timed_under) name, in order; [fallback] if none."""
    return list(dict.fromkeys(t["device_name"] for t in timed.values() if t and t.get("device_name"))) or [fallback]


def finished(folder: Path) -> Finished:
    """The groups a run folder finished and their records (Finished): what a resume keeps and a report counts."""
    written = read_lines(folder / "predictions.jsonl")
    if not os.path.lexists(folder / "groups.jsonl"):
        return Finished({}, {}, [], written, {})
    lines: dict[int, list[str]] = {}
    for line, record in written:
        lines.setdefault(record.get("group"), []).append(line)
    seconds, kept_lines, damaged, timed = {}, {}, [], {}
    for group, entry in {entry.get("group"): entry for entry in read_jsonl(folder / "groups.jsonl")}.items():
        mine = lines.get(group, [])
        if "records" in entry and (len(mine) != entry["records"] or digest(mine) != entry.get("sha256")):
            damaged.append(group)
            continue
        seconds[group], kept_lines[group], timed[group] = entry.get("seconds"), mine, entry.get("timed_under")
    return Finished(seconds, kept_lines, damaged, [(line, record) for line, record in written
                                                   if record.get("group") in seconds], timed)


def atomic_write(path: Path, text: str) -> None:
    """Write `text` whole or not at all: a temporary file beside `path`, then a rename."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def _rewrite(path: Path, lines: list[str | dict]):
    """Replace `path` with `lines` (whole or not at all) and return it open for appending."""
    atomic_write(path, "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return open(path, "a", encoding="utf-8")
