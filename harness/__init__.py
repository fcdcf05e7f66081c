"""The harness; its console commands start here (pyproject's [project.scripts], `python -m harness`)."""

import importlib
import os
import signal
import sys

from harness.errors import put_back
from harness.models import tracer_layers  # noqa: F401 - registers the ${tracer:...} config resolver


def started(prog: str, entry: str) -> None:
    """Run the command `prog` from `entry` (module:function). Ctrl-C or SIGTERM while its modules import (seconds:
    torch, transformers, Hydra; from the end of this package's own import, ~0.06 s) ends it with one line and exit
    status 130, as it does later (harness.errors.stops_on_config_error), not with a traceback (Ctrl-C) or silently
    (SIGTERM). It exits at once: nothing is written yet, and an exception raised inside an import can be caught
    and recast on its way (by transformers' lazy modules). A signal the command was started ignoring (`&` in a
    script) stays ignored."""
    def stop(signum, frame):
        print(f"{prog}: interrupted", file=sys.stderr, flush=True)
        os._exit(130)

    previous = {signum: signal.signal(signum, stop) for signum in (signal.SIGINT, signal.SIGTERM)
                if signal.getsignal(signum) is not signal.SIG_IGN}
    try:
        module, name = entry.split(":")
        main = getattr(importlib.import_module(module), name)
    finally:
        for signum, handler in previous.items():
            put_back(signum, handler)
    main()


def memdefrag() -> None:
    started("memdefrag", "harness.cli:main")


def memdefrag_bench() -> None:
    started("memdefrag-bench", "harness.measurement.benchmark:main")
