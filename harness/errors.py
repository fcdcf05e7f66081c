"""The one error type for bad input: raised before work starts, printed as one line."""

import argparse
import sys
from contextlib import contextmanager


class ConfigError(ValueError):
    """A configuration or input value that is not allowed; the message names it and what is."""


@contextmanager
def stops_on_config_error(prog: str):
    """Bad input ends the command with one line on stderr and exit status 2, never a traceback."""
    try:
        yield
    except ConfigError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        sys.exit(2)


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line and exit status 2, as every other bad input here."""

    def error(self, message: str):
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)
