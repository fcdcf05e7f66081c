"""Plugins from config: a `_target_` node instantiated, checked against what the harness uses of its kind
(CONTRACTS), its bad values turned into ConfigErrors; what a task plugin declares about its results."""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import os
import re
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import yaml
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from harness.errors import ConfigError, raised
from methods.base import A_PLAN, Plan
from methods.errors import returned
from methods.prompting import read_prompt

# What the harness uses of each kind of plugin (by config group) and how it calls it: a member and the arguments
# it passes (None: an attribute it reads). Subclassing methods.base.Method, methods.forgetting.Forgetting or
# methods.compression.compressor.Compression gives every member but the one the kind is about.
CONTRACTS: dict[str, dict[str, tuple[str, ...] | None]] = {
    "method": {"plan": ("memory", "prompt_ids", "backend", "question"), "check": ("num_layers",),
               "check_model": ("model_config",), "for_group": ("index",), "stored": ("fragment",),
               "with_tokenizer": ("tokenizer",), "backends": None, "needs_latent": None, "needs_targets": None,
               "keeps_own_memory": None, "recomputes": None},
    "task": {"check": (), "check_model": ("model_config", "tokenizer"), "groups": ("tokenizer",),
             "run_group": ("session", "group"), "metrics": ("records",), "describe": ()},
    "forgetting": {"for_group": ("index",), "admit": ("memory", "fragment"), "capacity": None, "layerwise": None,
                   "needs_self_info": None},
    "compression": {"__call__": ("text", "model", "tokenizer"), "check": (), "describe": ()},
}
OPTIONS = {"task": ("dataset",)}       # options the harness reads from a kind's config node (run tags, tables)
LABELLED = ("method", "forgetting", "compression")      # kinds whose runs are named by their config's `label`
# What a member must return where the harness takes its value, and how to give it: checked against the member's
# return annotation when the plugin is composed, against the value at its first use (methods.errors.returned).
RETURNS: dict[str, dict[str, tuple[type, str]]] = {
    "method": {"plan": (Plan, A_PLAN)},
    "task": {"groups": (list, "a list of groups (shard=i/n takes every n-th): `return [...]`, not `yield`"),
             "metrics": (pd.DataFrame, "a pandas DataFrame (the run's metrics.csv)"),
             "describe": (dict, "a dict (run.json's `task`)")},
}
# What a record holds besides what the task adds: `group` always; `step` and `correct` where its questions are
# asked after a number of stores or judged right or wrong (the report's step tables read both).
RECORD_FIELDS = {"step": ((int,), "an integer (the fragments stored when it was asked)"),
                 "correct": ((bool, type(None)), "a bool (None where the answer is not judged)")}


def locate_class(path: str) -> type:
    """The class a dotted `_target_` names (module.Class, or module.Outer.Inner). Hydra's get_class would do, but
    it logs an error line of its own before raising, and a refusal is one line."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as err:
            if err.name is None or not ".".join(parts[:cut]).startswith(err.name):
                raise                                           # the module exists; one of its imports does not
            continue
        for name in parts[cut:]:
            found = getattr(found, name)
        if not isinstance(found, type):
            raise ValueError(f"{path} is a {type(found).__name__}, not a class")
        return found
    raise ImportError(f"no module named {parts[0]!r}" if len(parts) > 1 else "not a dotted path module.Class")


def build(node: DictConfig, what: str, **kwargs):
    """Instantiate a plugin config and check it against its kind's contract; a bad value or a missing piece
    becomes a ConfigError naming it."""
    fields = OmegaConf.to_container(node, resolve=True, enum_to_str=True)
    fields.pop("label", None)
    try:
        cls = locate_class(str(fields.get("_target_")))
    except (ImportError, ValueError, AttributeError) as err:        # a _target_ that names no class
        raise ConfigError(f"{what}._target_={fields.get('_target_')!r} names no class this harness can import "
                          f"({str(err).splitlines()[0]})") from None
    for option in OPTIONS.get(what, ()):
        if option not in fields:
            raise ConfigError(f"{what} {cls.__name__} has no `{option}` option: the harness names each run by its "
                              f"{what}.{option} (give its constructor a `{option}` parameter)")
    with refused(what, f"{cls.__name__}()", node):
        try:
            plugin = instantiate(fields, **kwargs)
        except Exception as err:  # noqa: BLE001 - Hydra wraps the constructor's ValueError
            raise err.__cause__ or err from None
    check_contract(plugin, what)
    return plugin


@contextmanager
def refused(what: str, member: str = "", node: DictConfig | None = None) -> Iterator[None]:
    """A plugin's ValueError or TypeError (its constructor's, its `check`'s) as one ConfigError line, prefixed
    with its kind unless the message already starts with it (`method.k=0 ...`, `method mplus needs ...`), and the
    key its value comes from where `node` (its config) takes it from another (`set_where`); anything else it raises
    (a file it cannot read, a key its data lacks, a failed assert) as one line naming its kind, the `member` that
    raised it (`Passkey.check`) and the cause. MEMDEFRAG_DEBUG=1 shows the traceback instead."""
    try:
        yield
    except (ValueError, TypeError) as err:
        message = str(err).splitlines()[0] if str(err) else type(err).__name__
        named = message.startswith((f"{what}.", f"{what} ", f"{what}="))
        raise ConfigError(set_where(message if named else f"{what}: {message}", what, node)) from None
    except Exception as err:  # noqa: BLE001 - an author's check may fail any way: one line, the traceback on request
        if os.environ.get("MEMDEFRAG_DEBUG"):
            raise
        cause = (f"cannot read {err.filename}: {err.strerror or type(err).__name__}"
                 if isinstance(err, OSError) and err.filename else raised(err))
        raise ConfigError(f"{what} {member}: {cause} (a plugin's files and data are read before the run starts; "
                          f"raise ValueError naming what is wrong; MEMDEFRAG_DEBUG=1 shows the traceback)") from None


def set_where(message: str, what: str, node: DictConfig | None) -> str:
    """A message about `what.key=value` where the plugin's config takes that key from another (`method.tracer_layer:
    ${model.tracer_layer}`): said, with the key a user sets, since the one named is not it."""
    found = re.match(rf"{re.escape(what)}\.([\w.]+)=", message)
    if node is None or not found:
        return message
    raw = OmegaConf.to_container(node, resolve=False)
    for part in found[1].split("."):
        raw = raw.get(part) if isinstance(raw, dict) else None
    source = re.fullmatch(r"\$\{([A-Za-z_][\w.]*)\}", raw) if isinstance(raw, str) else None   # an absolute key
    return f"{message} ({what}.{found[1]} is ${{{source[1]}}}: set {source[1]})" if source else message


def checked_call(what: str, member: str, call, node: DictConfig | None = None) -> None:
    """Run a plugin's check as `refused` does; a value it returns is refused too (a check refuses by raising,
    and one returning its complaint would pass silently)."""
    with refused(what, member, node):
        result = call()
    if result is not None:
        raise ConfigError(f"{what} {member} returned {result!r:.80}: a check refuses by raising ValueError and "
                          f"returns nothing")


def check_contract(plugin, what: str) -> None:
    """Refuse a plugin that lacks a member its kind's contract names, or whose member cannot take the call the
    harness makes, naming the member and the call."""
    name = type(plugin).__name__
    for member, arguments in CONTRACTS.get(what, {}).items():
        if not hasattr(plugin, member):
            shown = member if arguments is None else f"{member}({', '.join(arguments)})"
            raise ConfigError(f"{what} {name} has no `{shown}`, which the harness uses")
        if arguments is None:
            continue
        found = getattr(plugin, member)
        try:
            inspect.signature(plugin if member == "__call__" else found).bind(*arguments)
        except TypeError:
            shown = "" if member == "__call__" else f".{member}"
            raise ConfigError(f"{what} {name}{shown}{inspect.signature(found)} cannot take the harness's call "
                              f"{member}({', '.join(arguments)})") from None
        except ValueError:          # a builtin without a signature: taken as it is
            continue
        expected, how = RETURNS.get(what, {}).get(member, (object, ""))
        declared = return_type(found)
        if isinstance(declared, type) and not issubclass(declared, expected):
            raise ConfigError(f"{what} {name}.{member} is declared to return {declared.__name__}; the harness "
                              f"needs {how}")


def return_type(member) -> type | None:
    """The class a member's return annotation names (its origin for `list[...]`, `Iterator[...]`); None where it
    names none (no annotation, a union, a name that cannot be resolved)."""
    try:
        declared = typing.get_type_hints(member).get("return")
    except Exception:  # noqa: BLE001 - an annotation that cannot be resolved says nothing to check
        return None
    return typing.get_origin(declared) or declared


def checked(value, plugin, what: str, member: str):
    """What a plugin's `member` returned, refused in one line where it is not what RETURNS says it must be."""
    expected, how = RETURNS[what][member]
    returned(value, expected, f"{what} {type(plugin).__name__}.{member}", how)
    return value


def metrics_table(task, records: list[dict], label: str):
    """The task's metrics of `records`, labelled with the method."""
    metrics = checked(task.metrics(records), task, "task", "metrics")
    metrics.insert(0, "method", label)
    return metrics


def answer_budget(task, run_budget: int) -> int:
    """The answer budget a task asks its questions with: its own `max_new_tokens` where it declares one, else the
    run's `run_budget`. A task whose questions ask with different budgets declares the largest (LoCoMo: its
    protocol's; LongBench: the largest over its subsets, task.max_new_tokens or else dataset2maxlen.json's)."""
    return getattr(task, "max_new_tokens", None) or run_budget


def prompt_frames(task, tokenizer, run_style: str) -> list[tuple[str, str]]:
    """Each way a task asks: the text around its question (`{question}` where the question goes) and the prompt
    style it is read in (methods.prompting). The task's own `prompt_frames(tokenizer, run_style)` where it
    words its questions itself (LoCoMo's instruction, LongBench's templates), else the bare question in the run's
    style."""
    frames = getattr(task, "prompt_frames", None)
    return frames(tokenizer, run_style) if frames else [("{question}", run_style)]


def prompt_positions(task, tokenizer, run_style: str, header: list[int], question: str = "") -> int:
    """The fewest positions `question`'s prompt takes after a memory whose sink holds `header`, over the ways the
    task asks (prompt_frames); the empty question: the least any of its prompts takes (the window preflight's,
    which pairs it with the largest answer budget: for LongBench, whose subsets differ in both, not one question's
    read but short of the longest by at most its templates' spread; the check at each read counts each
    question's own)."""
    return min(len(read_prompt(tokenizer, text.format(question=question), style, header))
               for text, style in prompt_frames(task, tokenizer, run_style))


def check_groups(groups: list, what: str = "task") -> None:
    """Refuse a task whose groups lack what the runner reads of them: at least one group, each with an integer
    `index` of its own and `texts()`, taken with no arguments, listing the non-empty strings it stores (a blank
    one, such as a chunk holding only a newline, is a token like any other)."""
    if not groups:
        raise ConfigError(f"{what}: groups() gave no group: a run needs at least one")
    seen = set()
    for group in groups:
        index = getattr(group, "index", None)
        if isinstance(index, bool) or not isinstance(index, int):
            raise ConfigError(f"{what}: its group {type(group).__name__} has index={index!r}; the runner needs an "
                              f"integer `index` per group (results and resume are kept per group)")
        if index in seen:
            raise ConfigError(f"{what}: two of its groups have index {index}; each group's index is its own "
                              f"(results and resume are kept per group)")
        seen.add(index)
        texts = getattr(group, "texts", None)
        try:
            inspect.signature(texts).bind()
        except (TypeError, ValueError):
            raise ConfigError(f"{what}: its group {type(group).__name__} needs `texts()`, taking no arguments, "
                              f"that lists the texts it stores (forgetting checks each fits its capacity)") from None
        stored = texts()
        if not isinstance(stored, (list, tuple)) or not all(isinstance(text, str) and text for text in stored):
            raise ConfigError(f"{what}: group {index}'s texts() gave {stored!r:.80}; it must list the non-empty "
                              f"strings the group stores, one per fragment")


def check_record(record, group: int, what: str = "task") -> None:
    """Refuse a record the results cannot keep: a dict, with the `group` it answers (resume counts by it), its
    RECORD_FIELDS of their types, that predictions.jsonl can hold."""
    if not isinstance(record, dict) or record.get("group") != group:
        found = record.get("group") if isinstance(record, dict) else type(record).__name__
        raise ConfigError(f"{what}: run_group yielded a record with group={found!r} for group {group}; each "
                          f"record must be a dict whose `group` is its group's index")
    for field, (kinds, how) in RECORD_FIELDS.items():
        value = record.get(field)
        if field in record and (not isinstance(value, kinds) or field != "correct" and isinstance(value, bool)):
            kind = type(value).__name__ if type(value).__module__ == "builtins" else \
                f"{type(value).__module__}.{type(value).__name__}"           # numpy's bool is no bool
            raise ConfigError(f"{what}: run_group yielded a record with {field}={value!r} (a {kind}) "
                              f"in group {group}; `{field}` must be {how}")
    try:
        json.dumps(record)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{what}: run_group yielded a record predictions.jsonl cannot hold in group {group} "
                          f"({err}); give strings, numbers, lists and dicts") from None


def check_first_record(task, record: dict, what: str = "task") -> bool:
    """A run's first record read by its task's `metrics` at once, so a field they read that the records lack
    stops the run at its first question, not after every group ran (one line naming the field)."""
    try:
        checked(task.metrics([record]), task, what, "metrics")
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 - the task's own code on its own record, said in one line
        if os.environ.get("MEMDEFRAG_DEBUG"):
            raise
        raise ConfigError(f"{what} {type(task).__name__}.metrics cannot read its first record (group "
                          f"{record['group']}, fields {', '.join(record)}): {type(err).__name__}: {err}; a record "
                          f"must hold every field its metrics read") from None
    return True


def config_name(group: str, target: str, conf: Path = Path(__file__).resolve().parents[2] / "conf") -> str:
    """The name a plugin is chosen by on the command line (`task=own_jsonl` for OwnJsonl): the YAML of
    conf/<group> whose `_target_` is `target` (where several are, the one named as the class), else the class's
    name in lower case."""
    name = target.rsplit(".", 1)[-1].lower()
    named = sorted(path.stem for path in (conf / group).glob("*.yaml")
                   if (yaml.safe_load(path.read_text()) or {}).get("_target_") == target)
    return min(named, key=lambda stem: stem.replace("_", "") != name, default=name)


@functools.cache
def table_titles(task: str) -> dict[str, str]:
    """The report tables a task class declares its runs make (`tables`: labels, or labels to titles), each with
    its title ('' where only the label is given); none where the class cannot be imported here (a plugin not
    installed)."""
    try:
        tables = getattr(locate_class(task), "tables", ())
    except (ImportError, ValueError):
        return {}
    return dict(tables) if isinstance(tables, dict) else dict.fromkeys(tables, "")


def declared_tables(task: str) -> tuple[str, ...]:
    """The labels of the report tables a task class declares (table_titles)."""
    return tuple(table_titles(task))
