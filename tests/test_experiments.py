"""Every shipped experiment runs, every sweep point of it, in a tiny form: one group of contexts cut to 200 tokens
on the tiny checkpoint (capacity 5,000 tokens, so forgetting starts about half way through 50 updates)."""

import itertools
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

from harness.runner import run
from tests.conftest import tiny_run_config

EXPERIMENTS = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "conf" / "experiment").glob("*.yaml"))


def sweep_points(experiment):
    with initialize_config_module("conf", version_base="1.3"):
        sweep = compose("config", overrides=[f"experiment={experiment}"], return_hydra_config=True)
    params = {key: str(values).split(",") for key, values in sweep.hydra.sweeper.params.items()}
    return [[f"{k}={v}" for k, v in zip(params, values)] for values in itertools.product(*params.values())]


@pytest.mark.slow
@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiment_runs_in_tiny_form(tmp_path, tiny_checkpoint, experiment):
    for i, point in enumerate(sweep_points(experiment)):
        cfg = tiny_run_config(tiny_checkpoint, f"experiment={experiment}", *point, "task.groups=1",
                              "max_new_tokens=2", "task.max_context_tokens=200", "model.memory_capacity=5000",
                              small_task=False)
        metrics = run(cfg, str(tmp_path / str(i)))
        assert len(metrics) and (tmp_path / str(i) / "run.json").is_file(), point
