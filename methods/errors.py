"""The one error type for bad input, defined at the bottom so every layer can raise it: a ValueError whose
message names the value and what is allowed, printed by the command as one line."""

import math


class ConfigError(ValueError):
    """A configuration or input value that is not allowed; the message names it and what is."""


def one_of(key: str, value, choices) -> None:
    """Refuse a value outside an enum of choices, naming the key, the value and the choices."""
    if value not in [choice.value for choice in choices]:
        raise ConfigError(f"{key}={value!r} is not one of {[choice.value for choice in choices]}")


def whole_number(key: str, value, least: int = 1, or_null: bool = False) -> None:
    """Refuse anything but an integer of at least `least` (or None, where `or_null`), naming the key and the
    value."""
    if or_null and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(f"{key}={value!r} must be an integer >= {least}{', or null' if or_null else ''}")


def number_in(key: str, value, low: float, high: float | None = None, why: str = "") -> None:
    """Refuse anything but a finite number above `low` (within [low, high] where `high` is given), naming the
    key, the value and why it matters."""
    number = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    fits = number and (low <= value <= high if high is not None else value > low)
    if not fits:
        allowed = f"a finite number in [{low:g}, {high:g}]" if high is not None else f"a finite number > {low:g}"
        raise ConfigError(f"{key}={value!r} must be {allowed}{f' ({why})' if why else ''}")


def returned(value, expected: type, where: str, how: str) -> None:
    """Refuse what a plugin's member returned where it is not an `expected` (a generator for a list, the memory
    for a Plan), naming the member (`where`), what it returned and `how` to give what is expected."""
    if not isinstance(value, expected):
        raise ConfigError(f"{where} returned a {type(value).__name__}; it must return {how}")


def given(name: str, value, kind: type | tuple[type, ...]) -> None:
    """A library argument is an instance of `kind` (a class itself is not one): anything else is one TypeError
    naming it, before any forward."""
    if not isinstance(value, kind):
        kinds = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        got = f"the class {value.__name__} itself (make one: {value.__name__}(...))" if isinstance(value, type) \
            else f"{type(value).__name__} ({value!r:.60})"
        raise TypeError(f"{name} must be a {kinds}, not {got}")
