"""The commands besides a run refuse a missing or wrong folder with one line and exit status 2."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("argv, message", [
    (["-m", "harness", "report", "{tmp}/nowhere"], "memdefrag report: error: {tmp}/nowhere: no such folder"),
    (["-m", "harness", "merge", "{tmp}/nowhere"], "memdefrag merge: error: {tmp}/nowhere: no such folder"),
    (["-m", "harness", "merge", "{tmp}"], "memdefrag merge: error: {tmp}: holds no sharded runs"),
    (["-m", "harness.benchmark", "--data-dir", "{tmp}/nowhere"], "memdefrag-bench: error: task.data_dir="),
    (["-m", "harness.benchmark", "--sizes", "0", "5"], "memdefrag-bench: error: --threads 2, --k 2, --repeats 1 and "
                                                        "--sizes [0, 5] must all be >= 1"),
])
def test_a_wrong_folder_or_value_is_refused_with_one_line(tmp_path, argv, message):
    done = subprocess.run([sys.executable, *(a.format(tmp=tmp_path) for a in argv)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message.format(tmp=tmp_path)), done.stderr[-1000:]
