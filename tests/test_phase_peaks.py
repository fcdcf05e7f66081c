"""Which phase raised the device's memory peak (methods/phase_peaks.py): noted on a GPU only, where the allocator's
running peak rose during the phase (the GPU tier reads the real allocator: tests/test_gpu.py)."""

import torch

from methods.backends.kv_prefix import KVPrefixBackend
from methods.memdefrag import MemDefrag
from methods.phase_peaks import PeakWatch
from methods.session import Session
from tests.conftest import tiny_model

MIB = 2**20


def test_a_phase_is_noted_only_where_it_raised_the_allocators_running_peak(monkeypatch):
    """The allocator's statistics as CUDA reports them, scripted (a CPU has none): a phase that raised the running
    peak is noted with what was allocated as it began and the peak it rose to; one that did not is not."""
    moments = iter([(100, 50), (100, 60), (300, 70), (300, 80), (250 * MIB, 90 * MIB), (400 * MIB, 100 * MIB)])

    def memory_stats(device=None):
        peak, current = next(moments)
        return {"allocated_bytes.all.peak": peak, "allocated_bytes.all.current": current}

    monkeypatch.setattr(torch.cuda, "memory_stats", memory_stats)
    watch = PeakWatch(torch.device("cuda", 0))
    for phase in ("compression", "formation", "forgetting", "plan", "decode"):
        watch.end(phase)
    assert watch.raised == {"formation": {"start": 60 / MIB, "peak": 300 / MIB},
                            "plan": {"start": 80 / MIB, "peak": 250.0}, "decode": {"start": 90.0, "peak": 400.0}}


def test_off_a_gpu_answers_and_records_carry_no_device_peak(tokenizer):
    """A CPU's records stay as they were (no `peak_mb`): the regression cache's records are a CPU's."""
    model = tiny_model("llama")
    session = Session(model, tokenizer, KVPrefixBackend(model), MemDefrag(2, 1, "mean"), "shared_sink", "plain", 4)
    session.store("the cat sat on the mat")
    answer = session.ask("where is the cat?")
    assert answer.peak_mb == {} and answer.peaks() == {}
