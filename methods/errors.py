"""The one error type for bad input, defined at the bottom so every layer can raise it: a ValueError whose
message names the value and what is allowed, printed by the command as one line."""


class ConfigError(ValueError):
    """A configuration or input value that is not allowed; the message names it and what is."""


def one_of(key: str, value, choices) -> None:
    """Refuse a value outside an enum of choices, naming the key, the value and the choices."""
    if value not in [choice.value for choice in choices]:
        raise ConfigError(f"{key}={value!r} is not one of {[choice.value for choice in choices]}")
