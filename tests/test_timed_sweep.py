"""A timed study charges every method the formation of every fragment it reads, whatever ran before it in the
process (issue 56): experiment=runtime and gpu_memory set reuse_formed=false, so the second job of a sweep forms
exactly what it forms alone, where a sweep outside them serves it the first job's distractors."""

import json

import pytest
import torch

from harness.running import runner
from harness.running.runner import run
from tests.conftest import tiny_run_config


def decoder_forwards(cfg, run_dir) -> int:
    """Forwards through the decoder (formation, traces, prefills, steps) while the run in `cfg` runs."""
    count = 0

    def counted(module, args, output):
        nonlocal count
        count += type(module).__name__ == "LlamaModel"

    handle = torch.nn.modules.module.register_module_forward_hook(counted)
    try:
        run(cfg, str(run_dir))
    finally:
        handle.remove()
    return count


@pytest.mark.parametrize("reuse", ["false", "true"])
def test_the_second_job_of_a_timed_sweep_forms_what_it_forms_alone(tmp_path, tiny_checkpoint, reuse):
    def job(method, folder):
        return tiny_run_config(tiny_checkpoint, "experiment=runtime", f"method={method}", "task.dataset=nqa",
                               "task.groups=2", "model.memory_capacity=5000", "threads=1", "max_new_tokens=2",
                               f"reuse_formed={reuse}", small_task=False), tmp_path / folder

    run(*(lambda cfg, folder: (cfg, str(folder)))(*job("vanilla", "warm")))     # the model's self-check, once:
    runner._FORMED.clear()                                 # its verdict is cached, so neither count holds it
    alone = decoder_forwards(*job("memdefrag_top2", "alone"))
    runner._FORMED.clear()
    run(*(lambda cfg, folder: (cfg, str(folder)))(*job("vanilla", "first")))
    after = decoder_forwards(*job("memdefrag_top2", "second"))
    if reuse == "false":                # runtime's own setting: charged in full
        assert after == alone
        assert json.loads((tmp_path / "second" / "run.json").read_text())["reuse_formed"] is False
    else:                               # served the first job's distractors: the timing the issue found unfair
        assert after < alone
