"""Every shipped experiment runs, every sweep point of it, and answers exactly as its cached run in
tests/testdata/regression/ (`make regression-cache` rewrites them), in a tiny form: one group (of contexts cut to 200
tokens, where the task cuts them) on the tiny checkpoint (capacity 5,000 tokens, so forgetting starts about half
way through 50 updates). The tiny checkpoint stands in for every model (a tiny MemoryLLM or M+ for theirs), so a
model axis runs once, and a compression-rate axis too (the same code at another number; tests/test_config.py
preflights every point)."""

import pytest

from harness.running.runner import run
from tests.conftest import EXPERIMENTS, matches_cached, sweep_points, tiny_run_config


STAND_INS = {"memoryllm_comparison": "tiny_memoryllm", "mplus_comparison": "tiny_mplus"}


@pytest.mark.slow
@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiment_runs_in_tiny_form(tmp_path, request, experiment):
    checkpoint = request.getfixturevalue(STAND_INS.get(experiment, "tiny_checkpoint"))
    for i, point in enumerate(sweep_points(experiment, keep_first=("model", "compression.rate"))):
        cfg = tiny_run_config(checkpoint, f"experiment={experiment}", *point, "task.groups=1",
                              "max_new_tokens=2", "model.memory_capacity=5000", "threads=1", small_task=False)
        if "max_context_tokens" in cfg.task:
            cfg.task.max_context_tokens = 200
        metrics = run(cfg, str(tmp_path / str(i)))
        assert len(metrics) and (tmp_path / str(i) / "run.json").is_file(), point
        matches_cached(tmp_path / str(i), f"{experiment}/{i}")
