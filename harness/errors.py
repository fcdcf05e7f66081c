"""The one error type for bad input: raised before work starts, printed as one line."""


class ConfigError(ValueError):
    """A configuration or input value that is not allowed; the message names it and what is."""
