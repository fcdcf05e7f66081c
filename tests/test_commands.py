"""The commands besides a run refuse a missing or wrong folder with one line and exit status 2: each through its
installed console script's entry point in this process (a warning is an error here, as it would be a second line
on the user's terminal), and each console script once as the process a user starts."""

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import as_in_a_terminal, refusal

pytestmark = pytest.mark.filterwarnings("error")


@pytest.mark.parametrize("argv, message", [
    (["memdefrag", "report", "{tmp}/nowhere"], "memdefrag report: error: {tmp}/nowhere: no such folder"),
    (["memdefrag", "merge", "{tmp}/nowhere"], "memdefrag merge: error: {tmp}/nowhere: no such folder"),
    (["memdefrag", "merge", "{tmp}"], "memdefrag merge: error: {tmp}: holds no sharded runs"),
    (["memdefrag-bench", "--data-dir", "{tmp}/nowhere"], "memdefrag-bench: error: --data-dir "),
    (["memdefrag-bench", "--sizes", "0", "5"], "memdefrag-bench: error: --sizes 0: must be >= 1"),
    (["memdefrag-bench", "--new-tokens", "0", "--k", "-1"], "memdefrag-bench: error: --new-tokens 0, --k -1: "
                                                            "must be >= 1"),
    (["memdefrag-bench", "--device", "gpu"], "memdefrag-bench: error: --device='gpu' is not a device"),
])
def test_a_wrong_folder_or_value_is_refused_with_one_line(tmp_path, argv, message, monkeypatch, capsys):
    err = refusal([a.format(tmp=tmp_path) for a in argv], monkeypatch, capsys)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message.format(tmp=tmp_path)), err[-1000:]


@pytest.mark.parametrize("command, args, prefix", [("memdefrag", ["report"], "memdefrag report: error: "),
                                                   ("memdefrag-bench", ["--data-dir"], "memdefrag-bench: error: ")])
def test_each_console_script_refuses_in_one_line_as_a_process(tmp_path, command, args, prefix):
    script = shutil.which(command, path=str(Path(sys.executable).parent))
    done = subprocess.run([script, *args, str(tmp_path / "nowhere")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr[-1000:]
    assert done.stderr.startswith(prefix), done.stderr


def catches(pid: int, signum: int) -> bool:
    """Whether the process has a handler of its own for the signal (Linux: SigCgt in /proc/<pid>/status)."""
    try:
        mask = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("SigCgt"))
    except FileNotFoundError:
        return False
    return bool(int(mask.split()[1], 16) >> (signum - 1) & 1)


def until_catching(process: subprocess.Popen) -> None:
    """Wait (up to 60 s) until the command has a SIGTERM handler of its own: Python catches SIGINT from its start,
    SIGTERM only once the command's code does."""
    deadline = time.monotonic() + 60
    while not catches(process.pid, signal.SIGTERM):
        assert process.poll() is None and time.monotonic() < deadline, "the command never caught SIGTERM"
        time.sleep(0.005)


@pytest.mark.parametrize("command, signum", [("memdefrag", signal.SIGINT), ("memdefrag", signal.SIGTERM),
                                             ("memdefrag-bench", signal.SIGINT)])
def test_ctrl_c_or_sigterm_while_a_command_starts_is_one_line_and_130(command, signum):
    """The signal as soon as the command catches it, while its modules import (seconds: torch, transformers,
    Hydra): its one line and 130, as later in the run, not Python's traceback (Ctrl-C) or a silent 143."""
    script = shutil.which(command, path=str(Path(sys.executable).parent))
    process = subprocess.Popen([script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=as_in_a_terminal)
    until_catching(process)
    importing = "libtorch" not in Path(f"/proc/{process.pid}/maps").read_text()
    process.send_signal(signum)
    assert importing, "torch was loaded before the command caught SIGTERM: the signal came after its imports"
    err = process.communicate(timeout=60)[1]
    assert process.returncode == 130 and err == f"{command}: interrupted\n", (process.returncode, err[-2000:])


def test_a_command_started_ignoring_ctrl_c_goes_on_through_one_during_its_imports(tmp_path):
    """A script's `memdefrag ... &` starts with SIGINT ignored: a Ctrl-C then, while the modules import, is ignored
    as before, and the command goes on to its own end (here a refusal, exit 2)."""
    script = shutil.which("memdefrag", path=str(Path(sys.executable).parent))
    process = subprocess.Popen([script, "report", str(tmp_path / "nowhere")], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    until_catching(process)
    process.send_signal(signal.SIGINT)
    err = process.communicate(timeout=60)[1]
    assert process.returncode == 2 and "no such folder" in err, (process.returncode, err[-2000:])
