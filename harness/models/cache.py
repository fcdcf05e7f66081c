"""The cache under MEMDEFRAG_CACHE (converted checkpoints, the joined Gemma-3 GGUF, file hashes, self-check
verdicts) that verifies itself.

Every entry is written whole or not at all (into a temporary name in the same folder, then renamed;
temporaries removed on failure, and those of a killed writer removed by the next one), under a lock per
entry, so that concurrent first uses build it once. A built entry records what it holds (each file's
size and xxh3-128 digest), and every process that uses it hashes it again (once): bit rot changes neither a
file's size nor its modification time, so only its content can tell. xxh3 hashes at memory speed, so the check costs
about one more pass over the files' pages; a damaged entry is built again. `memdefrag cache verify`
checks every entry at once and removes the damaged ones.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import hashlib
import json
import mmap
import os
import re
import shutil
import stat
from pathlib import Path

import xxhash

from harness.errors import ConfigError
from harness.results.folder import atomic_write

MANIFEST = "memdefrag-manifest.json"


def cache_dir() -> Path:
    return Path(os.environ.get("MEMDEFRAG_CACHE", Path.home() / ".cache" / "memdefrag"))


def usable(sub: str = "") -> Path:
    """cache_dir()/sub, made; one line naming MEMDEFRAG_CACHE when it cannot be written."""
    folder = cache_dir() / sub
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".writable.{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as err:
        raise ConfigError(f"MEMDEFRAG_CACHE={str(cache_dir())!r} cannot be used as the cache ({folder}: "
                          f"{err.strerror or err}): point it at a folder this user may write") from None
    return folder


def sha256(path: Path) -> str:
    return digest_of(path, hashlib.sha256())


def xxh3(path: Path) -> str:
    """A file's xxh3-128 digest: a content check fast enough to run at every load."""
    return digest_of(path, xxhash.xxh3_128())


WINDOW = 1 << 26       # bytes of a file mapped at a time while hashing: what the hash adds to the process's RSS


def digest_of(path: Path, digest) -> str:
    """A regular file hashed from its pages mapped in place, a window at a time: no copy into Python's memory
    (about twice as fast as 16 MB reads on a 2.4 GB checkpoint in the page cache, which every load hashes); a
    pipe or a /proc file, whose size says nothing (0), read through."""
    with path.open("rb") as handle:
        status = os.fstat(handle.fileno())
        size = status.st_size if stat.S_ISREG(status.st_mode) else 0
        if not size:
            while block := handle.read(1 << 24):
                digest.update(block)
        for offset in range(0, size, WINDOW):
            with mmap.mmap(handle.fileno(), min(WINDOW, size - offset), offset=offset,
                           access=mmap.ACCESS_READ) as pages:
                digest.update(pages)
    return digest.hexdigest()


def write_json(path: Path, data) -> None:
    """A JSON file written whole or not at all."""
    atomic_write(path, json.dumps(data, indent=1))


def read_json(path: Path) -> dict:
    """A JSON object, or {} for a file missing, cut short or not an object (it is then rewritten)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


@contextlib.contextmanager
def locked(entry: Path):
    """An exclusive lock for building `entry` (released by the OS if the process dies)."""
    with open(entry.with_name(f".{entry.name}.lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _record(files: list[Path], root: Path) -> dict:
    stats = {f: f.stat() for f in files}
    return {str(f.relative_to(root)): {"size": stat.st_size, "xxh3": xxh3(f)} for f, stat in stats.items()}


def _manifest_of(entry: Path) -> Path:
    """Where an entry's record lives: inside a folder, beside a file."""
    return entry / MANIFEST if entry.is_dir() else entry.with_name(f".{entry.name}.{MANIFEST}")


_VERIFIED: dict[Path, tuple] = {}   # entry -> its files' (name, size, mtime) when this process last hashed it


def intact(entry: Path) -> bool:
    """Whether `entry` holds exactly what it was built with: every file's size and content. Hashed once per
    process while no file's size or modification time moves (a run looks at its model several times before
    loading it; each process hashes it anew)."""
    recorded = read_json(_manifest_of(entry))
    if not entry.exists() or not recorded:
        return False
    root = entry if entry.is_dir() else entry.parent
    try:
        stats = {name: (root / name).stat() for name in recorded}
    except OSError:
        return False
    seen = tuple((name, stat.st_size, stat.st_mtime_ns) for name, stat in sorted(stats.items()))
    if _VERIFIED.get(entry) == seen:
        return True
    for name, want in recorded.items():
        if stats[name].st_size != want.get("size") or xxh3(root / name) != want.get("xxh3"):
            return False
    _VERIFIED[entry] = seen
    return True


def entries() -> list[Path]:
    """Every built entry of the cache: folders holding a manifest, files with one beside them."""
    root = cache_dir()
    if not root.is_dir():
        return []
    folders = [m.parent for m in root.rglob(MANIFEST)]
    files = [m.with_name(m.name[1:-len(MANIFEST) - 1]) for m in root.rglob(f".*.{MANIFEST}")]
    return sorted(folders + files)


def verify() -> list[tuple[Path, bool]]:
    """(entry, intact) for every entry; a damaged one is removed, so that its next use builds it again."""
    found = []
    for entry in entries():
        _VERIFIED.pop(entry, None)                # hashed now, whatever this process saw before
        ok = intact(entry)
        if not ok:
            with locked(entry):
                _remove(entry)
                _manifest_of(entry).unlink(missing_ok=True)
        found.append((entry, ok))
    return found


def partials(entry: Path) -> list[Path]:
    """The temporaries of `entry` that written_whole makes (`.<name>.<pid>.tmp`): a killed writer's, where no
    writer holds locked(entry)."""
    named = re.compile(rf"\.{re.escape(entry.name)}\.\d+\.tmp")
    return [p for p in entry.parent.glob(f".{glob.escape(entry.name)}.*.tmp") if named.fullmatch(p.name)]


def size_of(path: Path) -> int:
    """The disk a file, or every file below a folder, takes (its blocks: what removing it frees)."""
    files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
    return sum(f.stat().st_blocks * 512 for f in files)


@contextlib.contextmanager
def written_whole(entry: Path):
    """A temporary path beside `entry` (a file or a folder) to write it into, renamed to `entry` when the block
    ends and removed if it fails; temporaries a killed writer left are removed first. Hold locked(entry)."""
    for stale in partials(entry):
        _remove(stale)
    partial = entry.with_name(f".{entry.name}.{os.getpid()}.tmp")
    try:
        yield partial
        os.replace(partial, entry)
    finally:
        _remove(partial)


def build(entry: Path, make) -> Path:
    """`entry` (a folder or a file in the cache), built by make(temporary path) unless it is intact; built
    whole or not at all, once under concurrent first uses; a damaged entry is built again."""
    if intact(entry):
        return entry
    with locked(entry):
        if intact(entry):                        # another process built it while we waited
            return entry
        try:
            with written_whole(entry) as partial:
                make(partial)
                files = sorted(p for p in partial.rglob("*") if p.is_file()) if partial.is_dir() else [partial]
                record = _record(files, partial if partial.is_dir() else partial.parent)
                if partial.is_file():
                    record = {entry.name: record.pop(partial.name)}
                _remove(entry)
                _manifest_of(entry).unlink(missing_ok=True)
                if partial.is_dir():
                    write_json(partial / MANIFEST, record)
            if entry.is_file():
                write_json(_manifest_of(entry), record)
        except OSError as err:
            if err.errno in (errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EDQUOT):
                raise ConfigError(f"MEMDEFRAG_CACHE={str(cache_dir())!r}: cannot write {entry.name} "
                                  f"({err.strerror}); make room or point MEMDEFRAG_CACHE elsewhere") from None
            raise
    return entry


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
