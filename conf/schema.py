"""Typed schemas of every config group, derived from the code that reads the configs and registered in
Hydra's ConfigStore, so an option is declared once: where it is used.

- A plugin's options are its constructor's typed parameters, with their defaults; keyword-only parameters
  are what the harness passes (a run folder, say), not options. A set of choices is an enum declared beside
  the code that uses it. The schema is named after the class that declares the options (the most general
  one sharing the plugin's constructor): `MemDefrag` -> `MemDefragSchema`, stored as `memdefrag_schema`
  in the plugin's group, which its YAML files extend (`defaults: [memdefrag_schema, _self_]`).
- The model's schema is `ModelSpec` (harness/models/loading.py); the run's own options are `RunSchema` below.

So Hydra refuses a wrong type, an unknown choice or an unknown key on the command line with the key, the
value and what is allowed, before any code of ours runs. Ranges (k >= 1, a layer within the model) and what
a type cannot say (an integer or 'all') are checked by the plugins, before any weights load.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from enum import Enum
from pathlib import Path
from typing import Any, List, Optional

import yaml
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, SI, OmegaConf

from harness.errors import ConfigError, raised
from harness.models.loading import ModelSpec
from harness.plugins.contracts import LABELLED, locate_class
from harness.results.folder import folder_name, folder_word
from harness.running.runner import Backend
from methods.formation import Formation, FormationBatch, Residence
from methods.generation import Decode
from methods.prompting import PromptStyle

CONF = Path(__file__).parent
OPTION = inspect.Parameter.POSITIONAL_OR_KEYWORD


def option_type(annotation) -> Any:
    """What OmegaConf can check of an annotation: a primitive or an enum, a list of them, optional or not;
    anything else (an integer or 'all') is left to the plugin."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        kinds = [a for a in typing.get_args(annotation) if a is not type(None)]
        inner = option_type(kinds[0]) if len(kinds) == 1 else Any
        return Any if inner is Any else Optional[inner]
    if typing.get_origin(annotation) is list:
        return List[option_type(typing.get_args(annotation)[0])]
    if annotation in (bool, int, float, str) or isinstance(annotation, type) and issubclass(annotation, Enum):
        return annotation
    return Any


def declaring(cls: type) -> type:
    """The class whose constructor declares a plugin's options: the most general one sharing it."""
    return [k for k in cls.__mro__ if k is not object and k.__init__ is cls.__init__][-1]


def options(cls: type) -> list[tuple[str, Any, dataclasses.Field]]:
    """(name, type, default) of every option of a class's constructor, for `dataclasses.make_dataclass`."""
    hints = typing.get_type_hints(cls.__init__)
    fields = []
    for name, parameter in list(inspect.signature(cls.__init__).parameters.items())[1:]:
        if parameter.kind != OPTION:
            continue
        default = MISSING if parameter.default is inspect.Parameter.empty else parameter.default
        default = dataclasses.field(default_factory=lambda d=default: list(d)) if isinstance(default, list) \
            else dataclasses.field(default=default)
        unannotated = type(parameter.default) if type(parameter.default) in (bool, int, float, str) else Any
        fields.append((name, option_type(hints.get(name, unannotated)), default))     # no annotation: the default's
    return fields


def schema(cls: type, name: str, extra: list | None = None) -> type:
    """A dataclass of a class's options (and `extra` fields first), for Hydra to check configs against."""
    return dataclasses.make_dataclass(name, [*(extra or []), *options(cls)])


def plugin_schema(group: str, target: str) -> tuple[str, type]:
    """The name a plugin's YAML files extend and the schema stored under it."""
    owner = declaring(locate_class(target))
    extra = [("_target_", str, dataclasses.field(default=MISSING))]
    if group in LABELLED:
        extra.append(("label", str, dataclasses.field(default=MISSING)))
    return f"{owner.__name__.lower()}_schema", schema(owner, f"{owner.__name__}Schema", extra)


ModelSchema = schema(ModelSpec, "ModelSchema")


@dataclasses.dataclass
class RunSchema:
    """The composed run: the model, one node per plugin group, and the runner's own options."""

    model: ModelSchema = MISSING
    method: Any = MISSING
    task: Any = MISSING
    forgetting: Any = MISSING
    compression: Any = MISSING
    logger: Any = MISSING
    backend: Backend = Backend.fast
    formation: Formation = Formation.shared_sink
    memory_on: Residence = Residence.model
    prompt: PromptStyle = SI("${model.prompt}")
    max_new_tokens: int = 32
    decode: Optional[Decode] = None         # methods/generation.py: eager, captured, compiled (null: per device)
    formation_batch: Optional[FormationBatch] = None   # methods/formation.py: solo | batched; null: batched on a GPU
    reuse_formed: bool = True               # false (timed studies): every group forms every fragment it reads
    allow_beyond_window: bool = False       # methods/window.py: reads past the trained window run, labelled
    threads: Optional[int] = None
    seed: int = 0
    shard: Optional[str] = None
    resume: bool = True
    study: Optional[str] = None             # the experiment a run belongs to, where its tables need to know


def register() -> None:
    """Store the run's schema and, for every YAML file of conf/ with a `_target_`, its plugin's; and the
    `folder` resolver that makes a label a plain folder name (harness.results.folder.folder_name, as `memdefrag collect`
    names them), and `folder_word` a setting's value one word of it (a sweep's folders told apart by their settings:
    harness/running/jobs.py)."""
    if not OmegaConf.has_resolver("folder"):
        OmegaConf.register_new_resolver("folder", lambda label: folder_name(str(label)))
        OmegaConf.register_new_resolver("folder_word", folder_word)
    ConfigStore.instance().store(name="run_schema", node=RunSchema)
    for path in sorted(CONF.glob("*/*.yaml")):
        register_file(path)


def register_file(path: Path) -> None:
    """Store the schema of a plugin YAML's `_target_` under its class's name and under the YAML's own
    (`own_jsonl.yaml` may extend `own_jsonl_schema` or `ownjsonl_schema`: the name a plugin is chosen by works
    for a class of several words); a YAML without `_target_` extends another and needs none."""
    config = yaml.safe_load(path.read_text()) or {}
    if not config.get("_target_"):
        return
    try:
        name, node = plugin_schema(path.parent.name, config["_target_"])
    except Exception as err:  # noqa: BLE001 - an author's module may raise anything as it is imported
        UNLOADABLE[path] = f"_target_={config['_target_']} cannot be loaded ({raised(err)})"
        return
    own = f"{path.stem}_schema"
    for stored in {name, own}:
        ConfigStore.instance().store(group=path.parent.name, name=stored, node=node)
    extended = [d for d in config.get("defaults", []) if isinstance(d, str) and d.endswith("_schema")]
    MISNAMED.update({path: (given, own) for given in extended if given not in (name, own)})


MISNAMED: dict[Path, tuple[str, str]] = {}     # a YAML file -> (the schema it extends, the one it may extend)
UNLOADABLE: dict[Path, str] = {}               # a YAML file -> why its _target_'s class cannot be had


def check_names() -> None:
    """Refuse a plugin YAML whose _target_ names no class that imports (a typo, a module that fails), or that
    extends a schema under another name than its class's (Hydra would say only that it cannot find the name
    given), naming the file and what to write."""
    if UNLOADABLE:
        path, why = next(iter(UNLOADABLE.items()))
        raise ConfigError(f"{path.relative_to(CONF.parent)}: {why}")
    if MISNAMED:
        path, (given, expected) = next(iter(MISNAMED.items()))
        raise ConfigError(f"{path.relative_to(CONF.parent)} extends {given}, but its schema is named {expected} (the "
                          f"file's name + _schema) or after its _target_'s class: write `defaults: [{expected}, "
                          f"_self_]`")
