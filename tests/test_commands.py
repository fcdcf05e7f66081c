"""The commands besides a run refuse a missing or wrong folder with one line and exit status 2 (each through its
installed console script's entry point, in this process)."""

import sys
from importlib.metadata import entry_points

import pytest


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
    command, *args = argv
    [script] = entry_points(group="console_scripts", name=command)
    monkeypatch.setattr(sys, "argv", [command, *(a.format(tmp=tmp_path) for a in args)])
    with pytest.raises(SystemExit) as exit_:
        script.load()()
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err[-1000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message.format(tmp=tmp_path)), err[-1000:]
