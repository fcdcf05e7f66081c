"""The peak-memory formula (harness/peak.py, docs/gpu.md) against the storage found alive after a question: its live
terms (the stored memory, the trace's placed memory and rows; the weights were alive before) within 10 % of every
tensor's storage that storing a memory and asking over it leave alive."""

import gc
import os

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from evals.retention import Retention
from harness import peak
from methods.backends.kv_prefix import KVPrefixBackend
from methods.memdefrag import MemDefrag
from methods.session import Session
from tests.conftest import COMMON

WORDS = "the cat sat on a mat while quick brown foxes jumped over lazy dogs near old red barns".split()


def storages() -> dict[int, int]:
    """Every live tensor's storage (data pointer -> bytes), each counted once however many views share it."""
    found = {}
    for obj in gc.get_objects():
        if issubclass(type(obj), torch.Tensor) and obj.untyped_storage().data_ptr():
            found[obj.untyped_storage().data_ptr()] = obj.untyped_storage().nbytes()
    return found


def held_by_a_question(model, tokenizer, texts, question: str, tracer_layer: int, tokens: int):
    """(bytes of the storage that storing `texts` until `tokens` memory positions and asking `question` leave
    alive, the formula's live terms for it less the weights, which were alive before)."""
    gc.collect()
    before = storages()
    session = Session(model, tokenizer, KVPrefixBackend(model), MemDefrag(2, tracer_layer, "mean"), "shared_sink",
                      "plain", 8)
    for text in texts:
        if session.memory.prefix_length >= tokens:
            break
        session.store(text)
    answer = session.ask(question)
    gc.collect()
    alive = sum(size for ptr, size in storages().items() if ptr not in before)
    weights = sum(t.nbytes for t in [*model.parameters(), *model.buffers()])
    terms = peak.terms(peak.Dims.of(model.config), weights, next(model.parameters()).element_size(),
                       session.memory.prefix_length, answer.memory_tokens, answer.prompt_tokens, answer.tokens,
                       tracer_layer, max(len(f) for f in session.memory.fragments))
    assert session.memory.prefix_length >= tokens and terms["trace"] > terms["memory"] / 2
    return alive, peak.live(terms) - weights


def test_the_live_terms_of_the_peak_formula_hold_what_a_question_leaves_alive(tokenizer):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**{**COMMON, "max_position_embeddings": 4096})).eval()
    texts = [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(12)) for i in range(40)]
    alive, formula = held_by_a_question(model, tokenizer, texts, "where did the cat sit?", 1, 2000)
    assert abs(alive / formula - 1) < 0.10, (alive, formula)


@pytest.mark.slow
def test_the_formula_holds_smollm2_at_n_max(smollm2):
    """SmolLM2 in float32 with 12,800 NaturalQA memory tokens (N_max), traced at its layer 18 (docs/gpu.md)."""
    model, tokenizer = smollm2
    groups = Retention("nqa", os.environ.get("MEMDEFRAG_DATA", "../shared/data"), groups=2,
                       updates=40).groups(tokenizer)
    texts = [text for group in groups for text in group.texts()]
    alive, formula = held_by_a_question(model, tokenizer, texts, groups[0].target.question, 18, 12800)
    print(f"SmolLM2 at N_max: alive {alive / 1e6:.1f} MB, formula {formula / 1e6:.1f} MB (weights aside)")
    assert abs(alive / formula - 1) < 0.10, (alive, formula)


def test_a_jobs_peak_window_opens_after_the_self_check(tmp_path, tiny_checkpoint, monkeypatch):
    """The self-check holds the weights in fp32 for a moment (16 GB more for the 8B shape in bf16): a load
    transient, not the run's, so the job's CUDA peak is counted from after it."""
    from harness import runner, selfcheck
    from tests.conftest import tiny_run_config

    calls = []
    verify = selfcheck.verify
    monkeypatch.setattr(selfcheck, "verify", lambda *args: calls.append("self-check") or verify(*args))
    monkeypatch.setattr(runner, "reset_peak_memory", lambda: calls.append("peak reset"))
    runner.run(tiny_run_config(tiny_checkpoint, "method=memdefrag_top1", "task.groups=1"), str(tmp_path / "run"))
    assert calls == ["self-check", "peak reset"]
