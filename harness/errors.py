"""Bad input at the command: a ConfigError (methods.errors) or a bad argument ends it with one line."""

import argparse
import os
import sys
from contextlib import contextmanager

from methods.errors import ConfigError


@contextmanager
def stops_on_config_error(prog: str):
    """Bad input ends the command with one line on stderr and exit status 2, never a traceback. Inside a
    submitit job it is raised: the job ends failed and its launcher brings the line back (harness.running.slurm)."""
    try:
        yield
    except ConfigError as err:
        if os.environ.get("SUBMITIT_EXECUTOR"):
            raise
        print(f"{prog}: error: {err}", file=sys.stderr)
        sys.exit(2)


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line and exit status 2, as every other bad input here."""

    def error(self, message: str):
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)
