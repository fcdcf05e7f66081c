"""results/run_gpu.sh on an offline GPU node, its commands stood in for by stubs that log their arguments: what the
node's pack (.gpu/enter.sh) sets reaches every command, and the random checkpoints go where CKPT says, their size
said first, one on the disk at a time."""

import itertools
import os
import subprocess
import sys
from pathlib import Path

from transformers import AutoTokenizer

from harness.models.shapes import SHAPES
from harness.models.loading import check_source
from harness.running.runner import preflight
from methods.window import trained_window
from tests.conftest import NO_TENSORS, sweep_points
from tests.test_config import composed

ROOT = Path(__file__).resolve().parents[1]
STUB = """#!/bin/sh
echo "$(basename "$0") $*" >> "$LOG"
if [ "$1" = - ]; then exec {python} "$@"; fi
while [ $# -gt 0 ]; do [ "$1" = --save-random ] && mkdir -p "$2" && touch "$2/model.safetensors"; shift; done
"""


def run_gpu(tmp_path: Path, *parts: str, ok: bool = True, on_the_gpu: str | None = None,
            **settings: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """results/run_gpu.sh PARTS through the stubs, `settings` added to its environment: what it printed and the
    commands it ran, in order. on_the_gpu: the processes a stub nvidia-smi lists as computing there, beside 17795
    MiB in use (no nvidia-smi by default; "fail": one that fails)."""
    bin_dir, log, ckpt = tmp_path / "bin", tmp_path / "log", tmp_path / "checkpoints"
    bin_dir.mkdir(parents=True)
    stubs = {name: STUB.format(python=sys.executable) for name in ("memdefrag", "memdefrag-bench", "python3")}
    if on_the_gpu is not None:
        stubs["nvidia-smi"] = ("#!/bin/sh\nexit 9\n" if on_the_gpu == "fail" else
                               f"#!/bin/sh\n[ \"$1\" = --query-gpu=memory.used ] && echo '17795 MiB' || printf "
                               f"'{on_the_gpu}'\n")
    for name, text in stubs.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "LOG": str(log), "OUT": str(tmp_path / "out"),
           "CKPT": str(ckpt), "MEMDEFRAG_DATA": str(tmp_path / "data"), "GPU_TOKENIZER": str(tmp_path / "tok"),
           "PYTHONPATH": str(ROOT), **settings}
    env.pop("TOKENIZER", None)
    done = subprocess.run(["bash", str(ROOT / "results" / "run_gpu.sh"), *parts], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    assert (done.returncode == 0) == ok, done.stderr
    return done, log.read_text().splitlines() if log.exists() else []


def test_run_gpu_reads_the_packs_data_and_tokenizer_and_writes_one_checkpoint_at_a_time_where_told(tmp_path):
    ckpt = tmp_path / "checkpoints"
    done, calls = run_gpu(tmp_path)
    first = done.stdout.splitlines()[0]
    assert first.startswith(f"random checkpoints under {ckpt}, one at a time: llama31_8b 16.1 GB") and "free" in first
    bench = [c for c in calls if c.startswith("memdefrag-bench")]
    selfchecks = [c for c in calls if c.startswith("python3 -m harness.models.selfcheck")]
    assert len(selfchecks) == 3 and all(f"--tokenizer {tmp_path / 'tok'}" in c for c in bench + selfchecks)
    assert all(f"--data-dir {tmp_path / 'data'}" in c for c in bench if "--save-random" not in c)
    saved = [c.split("--save-random ")[1].split()[0] for c in bench if "--save-random" in c]
    assert saved == [str(ckpt / shape) for shape in ("llama31_8b", "memoryllm_8b", "mplus_8b")]
    runs = [c for c in calls if c.startswith("memdefrag experiment=")]
    assert runs and all(f"task.data_dir={tmp_path / 'data'}" in c for c in runs)
    assert not any(ckpt.iterdir())                                    # each removed after its runs


def test_every_memdefrag_run_passes_preflight_and_reads_past_its_window_only_where_allowed(tmp_path, tiny_checkpoint):
    """Each run of each `memdefrag` line (its experiment's axes, then its own) on a checkpoint of the shape it names
    (config and tokenizer, empty weights: the same window as harness.models.shapes.SHAPES declares) passes preflight. A
    memory past the window (model.memory_capacity, else a MemoryLLM's pool) needs allow_beyond_window=true, which
    preflight cannot see where a method reads a pool of its own: MemoryLLM-8B's 12,800 slots past 8,192 positions."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    beyond = set()
    for call in run_gpu(tmp_path)[1]:
        if not call.startswith("memdefrag experiment="):
            continue
        line = dict(arg.split("=", 1) for arg in call.split()[1:] if not arg.startswith(("hydra.", "task.data_dir")))
        shape = Path(line["model.source"]).name
        folder = tmp_path / "shapes" / shape
        if not folder.is_dir():
            SHAPES[shape].config_class(**SHAPES[shape].config).save_pretrained(folder)
            tokenizer.save_pretrained(folder)
            (folder / "model.safetensors").write_bytes(NO_TENSORS)
        line["model.source"] = str(folder)
        runs = {}                                 # the line's own axes replace the experiment's: each run once
        for point in sweep_points(line["experiment"]):
            settings = {**dict(arg.split("=", 1) for arg in point), **line}
            for values in itertools.product(*(value.split(",") for value in settings.values())):
                runs[tuple(f"{key}={value}" for key, value in zip(settings, values))] = None
        for run in runs:
            cfg = composed(*run)
            spec, *_ = preflight(cfg)
            config = check_source(spec)[0]
            memory = cfg.model.memory_capacity or config.num_blocks * config.num_tokens
            if memory > trained_window(config):
                beyond.add(shape)
                assert cfg.allow_beyond_window, call
    assert beyond == {"memoryllm_8b"}


def test_named_parts_run_alone_in_their_order_and_an_unknown_part_is_refused_before_anything_runs(tmp_path):
    """A short lease runs the parts it has time for: `decode runtime` benches the decode and runs tab:runtime on its
    own checkpoint, removed at the end; each part's start names what computes on the GPU then (a job an earlier
    part left would share it); a misspelt part is one line naming the parts, and nothing ran."""
    done, calls = run_gpu(tmp_path / "two", "decode", "runtime", on_the_gpu="1630, python3, 17795 MiB\\n9, x, 1 MiB",
                          RUNTIME_DECODE="compiled")
    started = [line.split(" (")[0] for line in done.stdout.splitlines()[1:]]
    assert started == ["run_gpu.sh: decode", "run_gpu.sh: runtime"]
    assert all(line.endswith("; computing on the GPU: 1630, python3, 17795 MiB;9, x, 1 MiB, memory used 17795 MiB)")
               for line in done.stdout.splitlines()[1:])
    assert [c for c in calls if "experiment=runtime" in c and " decode=compiled " in c]     # RUNTIME_DECODE's
    for gpu, said in (("", "memory used 17795 MiB"), ("fail", "unknown (nvidia-smi failed)"),
                      (None, "unknown (no nvidia-smi)")):
        assert run_gpu(tmp_path / f"{gpu}-gpu", "decode", on_the_gpu=gpu)[0].stdout.splitlines()[1].endswith(
            f"; computing on the GPU: {said})")
    benches = [c for c in calls if c.startswith("memdefrag-bench")]
    assert len(benches) == 4 and all("--decode" in c and "--profile" in c for c in benches[:3])
    assert "--save-random" in benches[3]
    runs = [c.split()[1] for c in calls if c.startswith("memdefrag ")]
    assert runs == ["experiment=runtime"] and not any((tmp_path / "two" / "checkpoints").iterdir())
    for bad in ("runtimes", "decode peers"):
        done, calls = run_gpu(tmp_path / bad.replace(" ", "_"), "decode", bad, ok=False)
        assert done.stderr == (f"run_gpu.sh: no part '{bad}'; the parts: selfcheck speed decode peers runtime "
                               "gpu_memory variants memoryllm report\n") and calls == [] and done.stdout == ""


def test_methods_narrows_both_tables_to_the_methods_a_short_lease_measures(tmp_path, monkeypatch):
    """METHODS=memdefrag_top2 DATASETS=nqa: tab:runtime and tab:gpu-memory run Top-2 alone, tab:runtime on NaturalQA
    (issue 56's two figures); unset, each runs its own rows; the variants part runs Top-2 the other ways whatever
    METHODS says."""
    monkeypatch.setenv("METHODS", "memdefrag_top2")
    monkeypatch.setenv("DATASETS", "nqa")
    calls = run_gpu(tmp_path / "short", "runtime", "gpu_memory", "variants")[1]
    runs = [c for c in calls if c.startswith("memdefrag ")]
    assert "task.dataset=nqa" in runs[0].split()
    assert [c.split()[1] for c in runs] == ["experiment=runtime", "experiment=gpu_memory"] + [
        "experiment=runtime", "experiment=gpu_memory", "experiment=gpu_memory"]
    assert all("method=memdefrag_top2" in c.split() for c in runs)
    monkeypatch.delenv("METHODS")
    monkeypatch.delenv("DATASETS")
    runs = [c for c in run_gpu(tmp_path / "whole", "runtime", "gpu_memory")[1] if c.startswith("memdefrag ")]
    assert "method=vanilla,memdefrag_top1,memdefrag_top2" in runs[0].split()
    assert not any(arg.startswith("task.dataset=") for arg in runs[0].split())      # the experiment's: both
    assert not any(arg.startswith("method=") for arg in runs[1].split())
