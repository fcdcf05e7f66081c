"""The harness; its console commands start here (pyproject's [project.scripts], `python -m harness`)."""

import importlib
import os
import signal
import sys

from harness.models import tracer_layers  # noqa: F401 - registers the ${tracer:...} config resolver


def started(prog: str, entry: str) -> None:
    """Run the command `prog` from `entry` (module:function). Ctrl-C or SIGTERM while its modules import (seconds:
    torch, transformers, Hydra) ends it with one line and exit status 130, as it does later
    (harness.errors.stops_on_config_error), not with a traceback (Ctrl-C) or silently (SIGTERM). It exits at once:
    nothing is written yet, and an exception raised inside an import can be caught and recast on its way (by
    transformers' lazy modules)."""
    def stop(signum, frame):
        print(f"{prog}: interrupted", file=sys.stderr, flush=True)
        os._exit(130)

    previous = {signum: signal.signal(signum, stop) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        module, name = entry.split(":")
        main = getattr(importlib.import_module(module), name)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
    main()


def memdefrag() -> None:
    started("memdefrag", "harness.cli:main")


def memdefrag_bench() -> None:
    started("memdefrag-bench", "harness.measurement.benchmark:main")
