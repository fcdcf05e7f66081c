"""The cache verifies itself: entries built whole, once under concurrency, damaged ones rebuilt, a killed
builder's leftovers removed, a cache that cannot be written named in one line; on the real conversion of
the embedded SmolLM2 too (kill -9 at three moments, a truncated and a zeroed checkpoint)."""

import hashlib
import mmap
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from harness.models import cache
from harness.errors import ConfigError


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMDEFRAG_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def maker(log: Path, content: bytes = b"x" * 1000):
    """A `make` that writes a two-file folder and counts its builds in `log`."""
    def make(folder: Path):
        with log.open("a") as handle:
            handle.write("built\n")
        folder.mkdir()
        (folder / "weights.bin").write_bytes(content)
        (folder / "config.json").write_text("{}")
    return make


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith((".tmp", ".partial")))


def test_an_entry_is_built_once_and_then_only_checked(own_cache, tmp_path):
    log, entry = tmp_path / "log", cache.usable("models") / "m"
    for _ in range(3):
        assert cache.build(entry, maker(log)) == entry
    assert log.read_text().count("built") == 1 and cache.intact(entry)
    assert leftovers(entry.parent) == []


@pytest.mark.parametrize("damage", ["truncated", "overwritten", "file removed", "manifest broken"])
def test_a_damaged_entry_is_rebuilt(own_cache, tmp_path, damage):
    log, entry = tmp_path / "log", cache.usable("models") / "m"
    cache.build(entry, maker(log))
    weights = entry / "weights.bin"
    if damage == "truncated":
        weights.write_bytes(weights.read_bytes()[:500])
    elif damage == "overwritten":                                  # same size, other content, a new mtime
        weights.write_bytes(b"\0" * 1000)
    elif damage == "file removed":
        (entry / "config.json").unlink()
    else:
        (entry / cache.MANIFEST).write_text('{"weights.bin": ')
    assert not cache.intact(entry)
    cache.build(entry, maker(log))
    assert log.read_text().count("built") == 2 and cache.intact(entry)
    assert weights.read_bytes() == b"x" * 1000


def test_a_touched_but_unchanged_entry_is_kept(own_cache, tmp_path):
    log, entry = tmp_path / "log", cache.usable("models") / "m"
    cache.build(entry, maker(log))
    os.utime(entry / "weights.bin", ns=(1, 1))
    assert cache.intact(entry) and cache.build(entry, maker(log)) == entry and log.read_text().count("built") == 1


def test_bit_rot_that_keeps_size_and_time_is_found_and_rebuilt(own_cache, tmp_path):
    """Part of the weights zeroed in place, the file's modification time put back: only the content tells."""
    log, entry = tmp_path / "log", cache.usable("models") / "m"
    cache.build(entry, maker(log))
    weights = entry / "weights.bin"
    before = weights.stat()
    with weights.open("r+b") as handle:
        handle.seek(100)
        handle.write(b"\0" * 400)
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert weights.stat().st_size == before.st_size and weights.stat().st_mtime_ns == before.st_mtime_ns
    assert not cache.intact(entry)
    cache.build(entry, maker(log))
    assert log.read_text().count("built") == 2 and weights.read_bytes() == b"x" * 1000


def test_an_entry_is_hashed_once_per_process_while_its_files_stay_put(own_cache, tmp_path, monkeypatch):
    """A run looks at its model several times before it loads it: one hash; a file whose time moves, again."""
    entry = cache.usable("models") / "m"
    cache.build(entry, maker(tmp_path / "log"))
    hashed = []
    real = cache.xxh3
    monkeypatch.setattr(cache, "xxh3", lambda path: hashed.append(path.name) or real(path))
    assert cache.intact(entry) and cache.intact(entry) and cache.intact(entry)
    assert sorted(hashed) == ["config.json", "weights.bin"]
    os.utime(entry / "weights.bin", ns=(1, 1))
    assert cache.intact(entry) and len(hashed) == 4


def test_verify_checks_every_entry_and_removes_the_damaged(own_cache, tmp_path, capsys):
    from harness.cli import main

    good, bad = cache.usable("models") / "good", cache.usable("models") / "bad"
    gguf = cache.usable("gguf") / "model.gguf"
    for entry in (good, bad):
        cache.build(entry, maker(tmp_path / "log"))
    cache.build(gguf, lambda partial: partial.write_bytes(b"gguf" * 100))
    (bad / "weights.bin").write_bytes(b"\0" * 1000)
    assert [(e.name, ok) for e, ok in cache.verify()] == [("model.gguf", True), ("bad", False), ("good", True)]
    assert not bad.exists() and good.exists() and gguf.exists()
    sys_argv, sys.argv = sys.argv, ["memdefrag", "cache", "verify"]
    try:
        with pytest.raises(SystemExit) as done:
            main()
    finally:
        sys.argv = sys_argv
    assert done.value.code == 0 and "2 entries intact, 0 damaged" in capsys.readouterr().out


def test_a_file_entry_is_verified_too(own_cache, tmp_path):
    entry = cache.usable("gguf") / "model.gguf"
    cache.build(entry, lambda partial: partial.write_bytes(b"gguf" * 100))
    assert cache.intact(entry)
    entry.write_bytes(b"gguf")
    assert not cache.intact(entry)
    cache.build(entry, lambda partial: partial.write_bytes(b"gguf" * 100))
    assert entry.read_bytes() == b"gguf" * 100 and leftovers(entry.parent) == []


def test_a_failed_build_leaves_nothing(own_cache):
    entry = cache.usable("models") / "m"

    def fails(folder):
        folder.mkdir()
        (folder / "weights.bin").write_bytes(b"half")
        raise RuntimeError("conversion failed")
    with pytest.raises(RuntimeError):
        cache.build(entry, fails)
    assert not entry.exists() and leftovers(entry.parent) == []


BUILDER = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path
    from harness.models import cache
    moment, log = sys.argv[1], Path(sys.argv[2])

    def make(folder):
        with log.open("a") as handle:
            handle.write("built\\n")
        if moment == "before writing":
            os.kill(os.getpid(), signal.SIGKILL)
        folder.mkdir()
        (folder / "weights.bin").write_bytes(b"x" * 1000)
        if moment == "mid-way":
            os.kill(os.getpid(), signal.SIGKILL)
        (folder / "config.json").write_text("{}")
        if moment == "slow":
            time.sleep(1)

    if moment == "before the rename":
        real = os.replace
        os.replace = lambda a, b: os.kill(os.getpid(), signal.SIGKILL) if Path(b).name == "m" else real(a, b)
    cache.build(cache.usable("models") / "m", make)
""")


def build_in_process(moment: str, log: Path):
    return subprocess.Popen([sys.executable, "-c", BUILDER, moment, str(log)], env=os.environ,
                            cwd=Path(__file__).resolve().parents[1])


def test_a_builder_killed_at_three_moments_leaves_a_cache_the_next_builds_correctly(own_cache, tmp_path):
    log, entry = tmp_path / "log", own_cache / "models" / "m"
    for moment in ("before writing", "mid-way", "before the rename"):
        assert build_in_process(moment, log).wait() == -9
        assert not cache.intact(entry)
    assert build_in_process("done", log).wait() == 0
    assert cache.intact(entry) and (entry / "weights.bin").read_bytes() == b"x" * 1000
    assert leftovers(entry.parent) == [] and log.read_text().count("built") == 4


def test_concurrent_first_uses_build_once(own_cache, tmp_path):
    log = tmp_path / "log"
    builders = [build_in_process("slow", log) for _ in range(3)]
    assert [b.wait() for b in builders] == [0, 0, 0]
    assert log.read_text().count("built") == 1
    assert cache.intact(own_cache / "models" / "m")


def test_a_hash_index_cut_short_is_rebuilt_not_blamed_on_the_model(own_cache, tmp_path):
    from harness.models.loading import content_key

    model = tmp_path / "model.gguf"
    model.write_bytes(b"weights")
    key = content_key(model)
    (own_cache / "hashes.json").write_text('{"/some/path": "ab')
    assert content_key(model) == key
    assert cache.read_json(own_cache / "hashes.json")


@pytest.mark.parametrize("where", ["a file", "read-only"])
def test_a_cache_that_cannot_be_written_is_named_in_one_line(tmp_path, monkeypatch, where):
    target = tmp_path / "cache"
    if where == "a file":
        target.write_text("not a folder")
    else:
        target.mkdir()
        target.chmod(0o500)
        if os.access(target, os.W_OK):
            pytest.skip("this user writes into read-only folders (root)")
    monkeypatch.setenv("MEMDEFRAG_CACHE", str(target))
    with pytest.raises(ConfigError) as caught:
        cache.usable("models")
    assert str(caught.value).startswith(f"MEMDEFRAG_CACHE={str(target)!r} cannot be used as the cache")


CONVERT = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    import transformers
    from harness.models.loading import ModelSpec, load
    moment = sys.argv[1]

    def die(*a, **k):
        os.kill(os.getpid(), signal.SIGKILL)

    if moment == "loading the GGUF":
        transformers.AutoModelForCausalLM.from_pretrained = die
    elif moment == "weights written":                   # the model saved, the tokenizer not yet
        transformers.PreTrainedTokenizerBase.save_pretrained = die
    elif moment == "before the rename":
        real = os.replace
        os.replace = lambda a, b: die() if Path(b).parent.name == "models" else real(a, b)
    load(ModelSpec("smollm2", "smollm2"))
""")


@pytest.mark.slow
def test_the_embedded_models_conversion_survives_kills_and_damage(own_cache):
    """kill -9 at three moments of a first conversion of SmolLM2, then a truncated and a zeroed converted
    checkpoint: each time the next load gives the same weights, and no temporary is left behind."""
    from harness.models.loading import ModelSpec, load

    root = Path(__file__).resolve().parents[1]
    for moment in ("loading the GGUF", "weights written", "before the rename"):
        done = subprocess.run([sys.executable, "-c", CONVERT, moment], env=os.environ, cwd=root,
                              capture_output=True, timeout=600)
        assert done.returncode == -9, done.stderr[-2000:]
    model, _ = load(ModelSpec("smollm2", "smollm2"))
    reference = {name: tensor.clone() for name, tensor in list(model.state_dict().items())[:4]}
    [entry] = [p for p in (own_cache / "models").iterdir() if p.is_dir()]
    assert leftovers(own_cache / "models") == [] and cache.intact(entry)
    weights = entry / "model.safetensors"
    for damage in ("truncated", "zeroed"):
        if damage == "truncated":
            os.truncate(weights, weights.stat().st_size // 2)
        else:
            with weights.open("r+b") as handle:
                handle.seek(1 << 20)
                handle.write(b"\0" * (64 << 20))
        model, _ = load(ModelSpec("smollm2", "smollm2"))
        for name, tensor in reference.items():
            assert torch.equal(model.state_dict()[name], tensor), (damage, name)
        assert cache.intact(entry) and leftovers(own_cache / "models") == []


def test_a_file_hashes_the_same_mapped_in_windows_empty_or_read_from_a_pipe(tmp_path, monkeypatch):
    """digest_of maps a regular file a window at a time; an empty file, a pipe and a /proc file (size 0) are read."""
    monkeypatch.setattr(cache, "WINDOW", mmap.ALLOCATIONGRANULARITY)
    data = os.urandom(3 * mmap.ALLOCATIONGRANULARITY + 17)
    (tmp_path / "f").write_bytes(data)
    (tmp_path / "empty").write_bytes(b"")
    assert cache.sha256(tmp_path / "f") == hashlib.sha256(data).hexdigest()
    assert cache.sha256(tmp_path / "empty") == hashlib.sha256(b"").hexdigest()
    read, write = os.pipe()
    os.write(write, b"through a pipe")
    os.close(write)
    assert cache.sha256(Path(f"/proc/self/fd/{read}")) == hashlib.sha256(b"through a pipe").hexdigest()
    os.close(read)
    assert cache.sha256(Path("/proc/self/cmdline")) != hashlib.sha256(b"").hexdigest()
