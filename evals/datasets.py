"""Knowledge-retention data: (context, question, answer) targets and unrelated contexts.

`nqa` and `squad` are read from a data directory holding `<name>/val_data.json`
and `<name>/unrelated_contexts_from_train.json` (the authors' processed files);
`synthetic` is generated here, so the default job needs no data.
"""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path

from evals import synthetic
from evals.qa import QAItem, RetentionData
from methods.errors import ConfigError, one_of

Dataset = StrEnum("Dataset", ["synthetic", "nqa", "squad"])
TARGETS_FILE, UNRELATED_FILE = "val_data.json", "unrelated_contexts_from_train.json"


def load(name: str, data_dir: str | None, seed: int = 0) -> RetentionData:
    """The named dataset, or one clear ConfigError naming the bad value."""
    if name == "synthetic":
        return synthetic.generate(seed)
    one_of("task.dataset", name, Dataset)
    if not data_dir:
        raise ConfigError(f"task.dataset={name!r} needs task.data_dir (a folder holding {name}/{TARGETS_FILE})")
    folder = Path(data_dir) / name
    if not folder.is_dir():
        raise ConfigError(f"task.data_dir={data_dir!r} has no folder {name}/ (looked for {folder.resolve()})")
    raw = _read_list(folder / TARGETS_FILE)
    targets = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or not all(isinstance(item.get(k), str) for k in ("context", "question", "answer")):
            raise ConfigError(f"{folder / TARGETS_FILE}: item {i} is not an object with string "
                              f"'context', 'question' and 'answer'")
        blank = [k for k in ("context", "question", "answer") if not item[k].strip()]
        if blank:                        # an empty answer is found in every output: accuracy 1.0, silently
            raise ConfigError(f"{folder / TARGETS_FILE}: item {i} has an empty {' and '.join(map(repr, blank))}: "
                              f"every item needs a non-empty context, question and answer")
        targets.append(QAItem(item["context"], item["question"], item["answer"]))
    unrelated = _read_list(folder / UNRELATED_FILE)
    if not all(isinstance(u, str) for u in unrelated):
        raise ConfigError(f"{folder / UNRELATED_FILE}: every entry must be a string (a context paragraph)")
    empty = [i for i, u in enumerate(unrelated) if not u.strip()]
    if empty:
        raise ConfigError(f"{folder / UNRELATED_FILE}: entry {empty[0]} is empty: every distractor context needs "
                          f"text")
    return RetentionData(targets, unrelated)


def _read_list(path: Path) -> list:
    if not path.is_file():
        raise ConfigError(f"missing data file {path}")
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path} is not valid JSON: {err}") from None
    if not isinstance(data, list) or not data:
        raise ConfigError(f"{path} must hold a non-empty JSON list")
    return data
