"""Recommended tracer layers per model: written by `memdefrag tracer-sweep`, read by model configs.

A model config says `tracer_layer: ${tracer:tracer_layer,18}`: the value recorded for that
model (by its `name`) in the tracers file, else the default after the comma. The file is
conf/tracers.yaml, or MEMDEFRAG_TRACERS.
"""

from __future__ import annotations

import copy
import functools
import os
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from harness.errors import ConfigError

FIELDS = ("tracer_layer", "query_mode")
NO_DEFAULT = "none"


def tracers_file() -> Path:
    return Path(os.environ.get("MEMDEFRAG_TRACERS", Path(__file__).resolve().parents[2] / "conf" / "tracers.yaml"))


def start_file() -> None:
    """Create the MEMDEFRAG_TRACERS file that `tracer-sweep` is about to write (empty), where it is missing
    and its folder exists: reading a missing one is refused (a mistyped path)."""
    path = tracers_file()
    if "MEMDEFRAG_TRACERS" in os.environ and not path.exists() and path.parent.is_dir():
        path.write_text("{}\n")


def recorded() -> dict:
    """The recorded table; one line naming the file (and MEMDEFRAG_TRACERS where it is set) when it is missing,
    unreadable or not a table of models."""
    path = tracers_file()
    where = f"MEMDEFRAG_TRACERS={str(path)!r}" if "MEMDEFRAG_TRACERS" in os.environ else str(path)
    if not path.is_file():
        if "MEMDEFRAG_TRACERS" not in os.environ:
            return {}
        raise ConfigError(f"{where}: no such file (the recorded tracer layers); unset it for conf/tracers.yaml, or "
                          f"run memdefrag tracer-sweep to write it")
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError(f"{where}: not readable YAML ({err})") from None
    return copy.deepcopy(_parsed(text, where))


@functools.lru_cache(maxsize=4)
def _parsed(text: str, where: str) -> dict:
    """The table a text holds, parsed once: every model config's ${tracer:...} reads the file at each resolution
    (hundreds in a sweep's preflight), and reading it is cheap where parsing is not."""
    try:
        table = yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{where}: not readable YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(table, dict) or not all(isinstance(v, dict) for v in table.values()):
        raise ConfigError(f"{where}: must map model names to {{tracer_layer: ..., query_mode: ...}}")
    return table


def resolve(field: str, default=NO_DEFAULT, *, _parent_):
    """The `tracer` resolver: `field` of the model named by the enclosing node; None when neither
    recorded nor defaulted (a method that traces refuses to run without it, the others need none)."""
    if field not in FIELDS:
        raise ConfigError(f"${{tracer:{field}}}: the field must be one of {FIELDS}")
    name = _parent_.get("name")
    value = recorded().get(name, {}).get(field, default)
    return None if value == NO_DEFAULT else value


def swept(config) -> str:
    """How a tracer-sweep run swept (recorded with its choice), from its config: the report finds that run by it
    (a setting a config lacks reads None, so it matches no recorded sweep)."""
    task = config["task"]
    return (f"layers {task.get('layers')} on {task.get('dataset')}, {task.get('groups')} groups x "
            f"{task.get('fragments')} fragments, prompt {config.get('prompt')}, formation {config.get('formation')}")


def record(name: str, choice: dict) -> Path:
    """Write `choice` (tracer_layer, query_mode and how they were found) for model `name`."""
    table = recorded()
    table[name] = choice
    path = tracers_file()
    path.write_text("# Written by `memdefrag tracer-sweep`; read by conf/model/*.yaml through ${tracer:...}.\n"
                    + yaml.safe_dump(table, sort_keys=True))
    return path


if not OmegaConf.has_resolver("tracer"):
    OmegaConf.register_new_resolver("tracer", resolve)
