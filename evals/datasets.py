"""Knowledge-retention data: (context, question, answer) targets and unrelated contexts.

`nqa` and `squad` are read from a data directory holding `<name>/val_data.json`
and `<name>/unrelated_contexts_from_train.json` (the authors' processed files);
`synthetic` is generated here, so the default job needs no data.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

from evals import synthetic
from evals.data_files import read_json, text_fault
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
        if not isinstance(item, dict):
            raise ConfigError(f"{folder / TARGETS_FILE}: item {i} is not an object with string 'context', "
                              f"'question' and 'answer'")
        for key in ("context", "question", "answer"):     # an empty answer is in every output: accuracy 1.0
            fault = text_fault(item.get(key))
            if fault:
                raise ConfigError(f"{folder / TARGETS_FILE}: item {i} {key!r} {fault}: every item needs a "
                                  f"non-empty string context, question and answer")
        targets.append(QAItem(item["context"], item["question"], item["answer"]))
    unrelated = _read_list(folder / UNRELATED_FILE)
    for i, context in enumerate(unrelated):
        fault = text_fault(context)
        if fault:
            raise ConfigError(f"{folder / UNRELATED_FILE}: entry {i} {fault}: every distractor context must be a "
                              f"string with text")
    return RetentionData(targets, unrelated)


def _read_list(path: Path) -> list:
    if not path.is_file():
        raise ConfigError(f"missing data file {path}" + (" (a folder, not a file)" if path.is_dir() else ""))
    data = read_json(path)
    if not isinstance(data, list) or not data:
        raise ConfigError(f"{path} must hold a non-empty JSON list")
    return data
