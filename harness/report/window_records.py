"""Records written before reads were checked against the model's trained window (methods/window.py): each
gets the `beyond_window` a run now writes, and run.json its `window` summary, from what the record and its run
say. A record hook of `memdefrag migrate` (harness/report/migrate.py).

What an older record says of its read: `used_tokens` (the sink and the memory the answer read, or the text
before its prompt; a trace-only record: its `memory_tokens` behind the one-token sink), its question (whose
prompt is tokenized again by the preflight's rule, harness.plugins.contracts.prompt_positions: the task's own wording and
style where it declares them; after the memory's sink, which under shared_prefix holds the prompt's header, what
follows that header; the whole prompt where the answer read no memory) and the answer budget its task asked with
(harness.plugins.contracts.answer_budget); both on the task as the record was asked: a task of `subsets` narrowed to the
record's own `subset`, so a LongBench record counts its subset's template and budget, not its run's largest; no
budget for a record without an answer. A question the task lengthens before wording it (LoCoMo's category hints
and choices) reads a little more than this counts. A method that reads its fragments in parallel (APE:
`parallel`) takes the longest fragment's positions, not its memory's: at most the task's `max_context_tokens`
where it cuts contexts to a length, else (not known) the memory's. A method that `traces` (attention density over
the whole memory) also read its sink, its whole memory and its prompt.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

from omegaconf import OmegaConf

from harness.errors import ConfigError
from harness.models.loading import ModelSpec, check_source
from harness.plugins.contracts import answer_budget, build, prompt_positions
from harness.results.folder import atomic_write, read_run_info
from methods.formation import formation_header
from methods.window import positions, trained_window, window_summary


def model_window(config: dict):
    """(trained window, tokenizer) of a run's model, read offline; (None, None) where its source is gone (a
    temporary checkpoint) or its config does not name one."""
    names = {f.name for f in dataclasses.fields(ModelSpec)}
    return source_window(json.dumps({k: v for k, v in config["model"].items() if k in names}, sort_keys=True))


@functools.cache
def source_window(spec: str):
    """model_window of a model's settings (as JSON: read once per model)."""
    try:
        config, tokenizer = check_source(ModelSpec(**json.loads(spec)))
    except (ConfigError, TypeError):                # TypeError: a model config without a source
        return None, None
    return trained_window(config), tokenizer


@functools.cache
def plugin_of(node: str, what: str):
    """The `what` plugin (method, task) a run's config names (as JSON: built once per node)."""
    return build(OmegaConf.create(json.loads(node)), what)


def read_positions(config: dict, record: dict, tokenizer, header: list[int]) -> int:
    """The positions an older record's reads took, from the record and its run's config (see the docstring);
    `header`: what the run's memory sink holds of the prompt (methods.formation.formation_header)."""
    task, method = config["task"], plugin_of(json.dumps(config["method"], sort_keys=True), "method")
    read = record["used_tokens"] if "used_tokens" in record else 1 + record["memory_tokens"]
    if method.parallel and task.get("max_context_tokens"):
        read = min(read, 1 + task["max_context_tokens"])
    asked = plugin_of(json.dumps({**task, "subsets": [record["subset"]]} if "subset" in record and "subsets" in task
                                 else task, sort_keys=True), "task")

    def prompt(after_sink: bool) -> int:
        """As Session reads it: after the memory's sink, what follows the header the sink holds; else whole."""
        if "question" not in record:
            return 0
        return prompt_positions(asked, tokenizer, config["prompt"], header if after_sink else [], record["question"])

    budget = answer_budget(asked, config["max_new_tokens"]) if "output" in record else 0
    answered = positions(read, prompt(read > 0 and not method.keeps_own_memory), budget)
    return max(answered, positions(1 + record["memory_tokens"], prompt(True), 0) if method.traces else 0)


def with_beyond_window(config: dict, records: list[dict]) -> list[dict]:
    """The records, each with `beyond_window` (positions past its model's trained window, 0 inside) where it
    has none and says what it read; unchanged where its model's config or its task's files cannot be read."""
    def unmarked(record: dict) -> bool:
        return "beyond_window" not in record and ("used_tokens" in record or "memory_tokens" in record)

    if not any(unmarked(r) for r in records):
        return records
    window, tokenizer = model_window(config)
    if window is None:
        return records
    header = formation_header(tokenizer, config["formation"], config["prompt"])     # one run's: the same for all
    try:
        return [{**r, "beyond_window": max(read_positions(config, r, tokenizer, header) - window, 0)}
                if unmarked(r) else r for r in records]
    except ConfigError:             # the task's own files (LongBench's templates) are not where its config says
        return records


def summarize(folder: Path, config: dict, records: list[dict]) -> bool:
    """run.json's `window` (methods.window.window_summary) from the folder's records, where they say how far
    past the window they read and run.json does not say it yet; True where it wrote."""
    path = folder / "run.json"
    if not path.is_file() or not any("beyond_window" in r for r in records):
        return False
    info = read_run_info(folder)
    if "window" in info:
        return False
    window, _ = model_window(config)
    allowed = config.get("allow_beyond_window", True)          # a run from before the setting: nothing refused
    info["window"] = window_summary(window, allowed, records)
    atomic_write(path, json.dumps(info, indent=2))
    return True
