"""Plugins from config: a `_target_` node instantiated, its bad values turned into ConfigErrors; what a
task plugin declares about its results."""

from __future__ import annotations

import functools

from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

from harness.errors import ConfigError


def build(node: DictConfig, what: str, **kwargs):
    """Instantiate a plugin config; a bad value becomes a ConfigError naming it."""
    fields = OmegaConf.to_container(node, resolve=True, enum_to_str=True)
    fields.pop("label", None)
    try:
        get_class(str(fields.get("_target_")))
    except (ImportError, ValueError, AttributeError) as err:        # a _target_ that names no class
        raise ConfigError(f"{what}._target_={fields.get('_target_')!r} names no class this harness can import "
                          f"({str(err).splitlines()[0]})") from None
    try:
        return instantiate(fields, **kwargs)
    except Exception as err:  # noqa: BLE001 - Hydra wraps the constructor's ValueError
        cause = err.__cause__ or err
        if isinstance(cause, (ValueError, TypeError)):
            raise ConfigError(f"{what}: {cause}") from None
        raise


@functools.cache
def table_titles(task: str) -> dict[str, str]:
    """The report tables a task class declares its runs make (`tables`: labels, or labels to titles), each with
    its title ('' where only the label is given); none where the class cannot be imported here (a plugin not
    installed)."""
    try:
        tables = getattr(get_class(task), "tables", ())
    except (ImportError, ValueError):
        return {}
    return dict(tables) if isinstance(tables, dict) else dict.fromkeys(tables, "")


def declared_tables(task: str) -> tuple[str, ...]:
    """The labels of the report tables a task class declares (table_titles)."""
    return tuple(table_titles(task))
