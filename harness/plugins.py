"""Plugins from config: a `_target_` node instantiated, its bad values turned into ConfigErrors."""

from __future__ import annotations

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from harness.errors import ConfigError


def build(node: DictConfig, what: str, **kwargs):
    """Instantiate a plugin config; a bad value becomes a ConfigError naming it."""
    fields = OmegaConf.to_container(node, resolve=True, enum_to_str=True)
    fields.pop("label", None)
    try:
        return instantiate(fields, **kwargs)
    except Exception as err:  # noqa: BLE001 - Hydra wraps the constructor's ValueError
        cause = err.__cause__ or err
        if isinstance(cause, (ValueError, TypeError)):
            raise ConfigError(f"{what}: {cause}") from None
        raise
