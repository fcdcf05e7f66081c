"""What a job of a sequential sweep leaves to the next one in the same process: not its model (freed when the job
ends, with no garbage collection needed), and at most a bounded host-side cache of the fragments formed once."""

import gc
import weakref

import torch

from harness.running import runner
from harness.models.loading import ModelSpec
from methods.memory import Fragment
from tests.conftest import tiny_run_config

PROBE = ("experiment=probe", "task.groups=2", "task.updates=3")


def test_a_jobs_model_is_freed_when_the_job_ends_without_a_garbage_collection(tmp_path, tiny_checkpoint, monkeypatch):
    """Reference counting alone must free the model: a sweep's next job would otherwise load its own beside it."""
    monkeypatch.setattr(runner, "_FORMED", {})
    loaded = []
    load = runner.load
    monkeypatch.setattr(runner, "load", lambda spec: (lambda pair: loaded.append(weakref.ref(pair[0])) or pair)(
        load(spec)))
    gc.collect()
    gc.disable()
    try:
        runner.run(tiny_run_config(tiny_checkpoint, "method=memdefrag_top1"), str(tmp_path / "run"))
        assert len(loaded) == 1 and loaded[0]() is None, "the job's model outlived the job"
    finally:
        gc.enable()


def fragment(tokens: int, width: int = 8) -> Fragment:
    """A fragment whose keys are a view into a tensor twice its size, as a slice of a formed prompt is."""
    whole = torch.randn(2, 1, 2 * tokens, width)
    return Fragment(0, "t", torch.arange(tokens), torch.zeros(tokens), keys=whole[:, :, :tokens],
                    values=torch.randn(2, 1, tokens, width))


def held_bytes(fragments) -> int:
    return sum(t.untyped_storage().nbytes() for f in fragments.values() for t in (f.keys, f.values))


def test_the_formed_fragments_kept_between_jobs_are_bounded_trimmed_and_of_one_model(monkeypatch):
    """A formed fragment is kept as a compact copy (not the view of a larger tensor it was cut from), the oldest
    dropped beyond the budget, and only the current model's: a sweep moving to another model drops the last's."""
    monkeypatch.setattr(runner, "_FORMED", {})
    monkeypatch.setattr(runner, "FORMED_BYTES", 3 * 2 * 2 * 4 * 8 * 4, raising=False)    # three 4-token fragments
    first = runner.formed_fragments(ModelSpec("a", "a"))
    one = fragment(4)
    first[("former", (1,))] = one
    held = first[("former", (1,))]
    assert torch.equal(held.keys, one.keys) and held.keys.device == one.keys.device
    assert held_bytes(first) == one.values.nbytes * 2                     # the keys trimmed to their own size
    for i in range(2, 6):
        first[("former", (i,))] = fragment(4)
    assert held_bytes(first) <= runner.FORMED_BYTES and ("former", (1,)) not in first    # the oldest went first
    assert ("former", (5,)) in first
    second = runner.formed_fragments(ModelSpec("b", "b"))
    assert second is not first and list(runner._FORMED.values()) == [second]            # one model's at a time
