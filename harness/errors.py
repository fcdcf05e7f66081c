"""Bad input at the command: a ConfigError (methods.errors) or a bad argument ends it with one line."""

import argparse
import os
import signal
import sys
import threading
from contextlib import contextmanager

from methods.errors import ConfigError


@contextmanager
def stops_on_config_error(prog: str):
    """Bad input ends the command with one line on stderr and exit status 2, never a traceback; Ctrl-C, or SIGTERM
    (`kill`, `timeout`), with one line and 130, as a shell's interrupted command, after the `finally`s on the way
    have run. Inside a submitit job either is raised: the job ends failed and its launcher brings the line back
    (harness.running.slurm, whose handlers own the job's signals)."""
    in_job = bool(os.environ.get("SUBMITIT_EXECUTOR"))
    ours = not in_job and threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler) if ours else None
    try:
        yield
    except (ConfigError, KeyboardInterrupt) as err:
        if in_job:
            raise
        if isinstance(err, KeyboardInterrupt):
            print(f"{prog}: interrupted{f': {err}' if str(err) else ''}", file=sys.stderr)
            sys.exit(130)
        print(f"{prog}: error: {err}", file=sys.stderr)
        sys.exit(2)
    finally:
        if ours:
            put_back(signal.SIGTERM, previous)


def put_back(signum: int, previous) -> None:
    """A signal's handler as signal.signal returned it, put back; None (one installed from C, which Python cannot
    put back) as the default."""
    signal.signal(signum, signal.SIG_DFL if previous is None else previous)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a run, said with what it keeps and how to go on (a run folder's finished groups): still an
    interruption, which no `except Exception` on the way takes for a failure."""


def raised(err: BaseException, limit: int = 200) -> str:
    """What an exception raised, as one line: its type and its message, lines joined and cut at `limit`
    characters (its type alone where it says nothing)."""
    said = " ".join(str(err).split())
    return f"{type(err).__name__}: {said[:limit]}" if said else type(err).__name__


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line and exit status 2, as every other bad input here."""

    def error(self, message: str):
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)

    def parse_known_args(self, args=None, namespace=None):
        """Refuse an empty argument (`''`, `--out=`) before parsing: argparse takes it as an option not given, or as
        a path to the current folder."""
        given = sys.argv[1:] if args is None else list(args)
        for before, value in zip([None, *given], given):
            option, equals, rest = value.partition("=") if value.startswith("--") else ("", "", value)
            if (equals or not option) and not rest.strip():
                taking = self._option_string_actions.get(before or "")          # the option the value is for
                named = option or (before if taking is not None and taking.nargs != 0 else "")
                self.error(f"an empty argument{f' for {named}' if named else ''}: give a value (a path, a name, a "
                           f"number)")
        return super().parse_known_args(args, namespace)
