"""Reading the data files a task is pointed at: every fault one line naming the file (and the item, where the
loader adds it), before any weights load. One reader for JSON and JSON lines, one test of a text field, shared by
the retention sets, LongBench and LoCoMo."""

from __future__ import annotations

import json
import math
from pathlib import Path

from methods.errors import ConfigError


def read_json(path: Path):
    """The value of a JSON file (a UTF-8 byte-order mark allowed)."""
    return _parsed(_text(path), str(path))


def read_json_lines(path: Path) -> list:
    """The values of a JSON-lines file, one per non-blank line."""
    return [_parsed(line, f"{path}: line {number}")
            for number, line in enumerate(_text(path).splitlines(), 1) if line.strip()]


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path} is not UTF-8 text (byte {err.start}: {err.reason})") from None


def _parsed(text: str, where: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{where} is not valid JSON: {err}") from None
    except RecursionError:
        raise ConfigError(f"{where}: its JSON nests deeper than Python's parser reads") from None


def text_fault(value, blank_ok: bool = False) -> str | None:
    """Why a data field cannot be read as text, as the rest of a sentence naming it (None where it can): not a
    string, empty or blank (unless `blank_ok`), or not writable as UTF-8 (a lone surrogate, which JSON's \\ud800
    escape can spell, and no tokenizer reads)."""
    if not isinstance(value, str):
        return f"is {type(value).__name__}, not a string"
    if not blank_ok and not value.strip():
        return "is empty"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        return f"is no valid text (a lone surrogate {value[err.start]!r} at character {err.start})"
    return None


def number_fault(value) -> str | None:
    """Why a data field cannot be read as a number written as text (None where it can): a bool, NaN or infinite."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"is {type(value).__name__}, not a number"
    return None if math.isfinite(value) else f"is {value}, not a finite number"
