"""The commands besides a run refuse a missing or wrong folder with one line and exit status 2 (each run as
`python -m` runs it, in this process)."""

import runpy
import sys

import pytest


@pytest.mark.parametrize("argv, message", [
    (["-m", "harness", "report", "{tmp}/nowhere"], "memdefrag report: error: {tmp}/nowhere: no such folder"),
    (["-m", "harness", "merge", "{tmp}/nowhere"], "memdefrag merge: error: {tmp}/nowhere: no such folder"),
    (["-m", "harness", "merge", "{tmp}"], "memdefrag merge: error: {tmp}: holds no sharded runs"),
    (["-m", "harness.measurement.benchmark", "--data-dir", "{tmp}/nowhere"], "memdefrag-bench: error: --data-dir "),
    (["-m", "harness.measurement.benchmark", "--sizes", "0", "5"], "memdefrag-bench: error: --sizes 0: must be >= 1"),
    (["-m", "harness.measurement.benchmark", "--new-tokens", "0", "--k", "-1"], "memdefrag-bench: error: --new-tokens 0, --k -1: "
                                                                  "must be >= 1"),
    (["-m", "harness.measurement.benchmark", "--device", "gpu"], "memdefrag-bench: error: --device='gpu' is not a device"),
])
def test_a_wrong_folder_or_value_is_refused_with_one_line(tmp_path, argv, message, monkeypatch, capsys):
    _, module, *args = argv
    monkeypatch.setattr(sys, "argv", [module, *(a.format(tmp=tmp_path) for a in args)])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err[-1000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message.format(tmp=tmp_path)), err[-1000:]
