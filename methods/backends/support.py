"""Which backend can hold a model, decided from its config before any weights load: each backend's own `check`
refuses what it cannot run (RotaryError, DecoderError); a refusal names the other backend where that one can."""

from __future__ import annotations

from methods.attention.decoder import DecoderError
from methods.attention.positions import RotaryError
from methods.backends.hidden_prefix import HiddenPrefixBackend
from methods.backends.kv_prefix import KVPrefixBackend

UNSUPPORTED = (RotaryError, DecoderError)       # what a backend's check raises for a model it cannot run


def alternative(backend_class: type, model_config) -> tuple[type, str | None]:
    """The other backend, and why its own check refuses this model too (None where it holds it)."""
    other = HiddenPrefixBackend if issubclass(backend_class, KVPrefixBackend) else KVPrefixBackend
    try:
        other.check(model_config)
    except UNSUPPORTED as err:
        return other, str(err)
    return other, None


def way_out(backend_class: type, model_config, named=lambda backend: f"backend={backend.name}") -> str:
    """What a refusal of `backend_class` offers: the other backend where its own check holds the model, else that
    neither runs it and why the other does not; each backend `named` as its reader sets it (the command line's
    `backend=...`, a library's class)."""
    other, refused = alternative(backend_class, model_config)
    if refused is not None:
        return f"neither can {named(other)}, which {refused}"
    slower = " (the paper's formulation, slower)" if other is HiddenPrefixBackend else ""
    return f"use {named(other)}{slower} for this model"
