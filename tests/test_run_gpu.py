"""results/run_gpu.sh on an offline GPU node, its commands stood in for by stubs that log their arguments: what the
node's pack (.gpu/enter.sh) sets reaches every command, and the random checkpoints go where CKPT says, their size
said first, one on the disk at a time."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STUB = """#!/bin/sh
echo "$(basename "$0") $*" >> "$LOG"
if [ "$1" = - ]; then exec {python} "$@"; fi
while [ $# -gt 0 ]; do [ "$1" = --save-random ] && mkdir -p "$2" && touch "$2/model.safetensors"; shift; done
"""


def test_run_gpu_reads_the_packs_data_and_tokenizer_and_writes_one_checkpoint_at_a_time_where_told(tmp_path):
    bin_dir, log, ckpt = tmp_path / "bin", tmp_path / "log", tmp_path / "checkpoints"
    bin_dir.mkdir()
    for name in ("memdefrag", "memdefrag-bench", "python3"):
        (bin_dir / name).write_text(STUB.format(python=sys.executable))
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "LOG": str(log), "OUT": str(tmp_path / "out"),
           "CKPT": str(ckpt), "MEMDEFRAG_DATA": str(tmp_path / "data"), "GPU_TOKENIZER": str(tmp_path / "tok"),
           "PYTHONPATH": str(ROOT)}
    env.pop("TOKENIZER", None)
    done = subprocess.run(["bash", str(ROOT / "results" / "run_gpu.sh")], cwd=ROOT, env=env, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines()
    first = done.stdout.splitlines()[0]
    assert first.startswith(f"random checkpoints under {ckpt}, one at a time: llama31_8b 16.1 GB") and "free" in first
    bench = [c for c in calls if c.startswith("memdefrag-bench")]
    selfchecks = [c for c in calls if c.startswith("python3 -m harness.selfcheck")]
    assert len(selfchecks) == 3 and all(f"--tokenizer {tmp_path / 'tok'}" in c for c in bench + selfchecks)
    assert all(f"--data-dir {tmp_path / 'data'}" in c for c in bench if "--save-random" not in c)
    saved = [c.split("--save-random ")[1].split()[0] for c in bench if "--save-random" in c]
    assert saved == [str(ckpt / shape) for shape in ("llama31_8b", "memoryllm_8b", "mplus_8b")]
    runs = [c for c in calls if c.startswith("memdefrag experiment=")]
    assert runs and all(f"task.data_dir={tmp_path / 'data'}" in c for c in runs)
    assert not any(ckpt.iterdir())                                    # each removed after its runs
