"""Methods: the defragmentation core, validation, and agreement where they must agree."""

import re

import pytest
import torch

from methods.attention.tracing import ranks
from methods.backends.kv_prefix import KVPrefixBackend
from methods.baselines import NoMemory, TextMemory, Vanilla
from methods.memdefrag import MemDefrag
from methods.selection.arrange import defragment
from methods.session import Session


def test_defragment_puts_the_densest_last_and_keeps_top_k():
    density = torch.tensor([0.1, 0.5, 0.2, 0.4])
    assert defragment(density, None) == [0, 2, 3, 1]
    assert defragment(density, 2) == [3, 1]
    assert defragment(density, 9) == [0, 2, 3, 1]


def test_ranks_are_a_permutation_densest_first():
    r = ranks(torch.tensor([0.1, 0.5, 0.2, 0.5]))
    assert sorted(r.tolist()) == [1, 2, 3, 4] and r.tolist() == [4, 1, 3, 2]


@pytest.mark.parametrize("k", [0, -1, "two", 1.5, True])
def test_memdefrag_rejects_bad_k(k):
    with pytest.raises(ValueError, match="method.k"):
        MemDefrag(k=k)


def test_memdefrag_rejects_a_tracer_layer_out_of_range():
    with pytest.raises(ValueError, match="tracer_layer=30.*0..29"):
        MemDefrag(tracer_layer=30).check(30)


def ask_after(model, tokenizer, method, texts, formation="shared_sink"):
    session = Session(model, tokenizer, KVPrefixBackend(model), method, formation, "plain", max_new_tokens=6)
    for text in texts:
        session.store(text)
    return session.ask("where is the cat?")


def test_single_fragment_methods_agree(llama, tokenizer):
    """With one fragment, Top-K and text memory are exactly vanilla (why step 1 is asked once)."""
    texts = ["the cat sat on the mat"]
    reference = ask_after(llama, tokenizer, Vanilla(), texts)
    for method in (MemDefrag(k=1, tracer_layer=1), MemDefrag(k="all", tracer_layer=1), TextMemory()):
        answer = ask_after(llama, tokenizer, method, texts)
        assert answer.text == reference.text and answer.memory_tokens == reference.memory_tokens


def test_a_dominant_fragment_is_kept(llama, tokenizer):
    """Make fragment 1 dominate the tracer layer's attention: Top-1 keeps exactly it."""
    session = Session(llama, tokenizer, KVPrefixBackend(llama), MemDefrag(k=1, tracer_layer=1), "shared_sink",
                      "plain", max_new_tokens=2)
    for text in ["aaaa", "bbbbbb", "ccc"]:
        session.store(text)
    session.memory.fragments[1].keys[1] *= 0
    session.memory.fragments[1].keys[1] += 50 * torch.ones(1)          # huge keys -> attended everywhere
    answer = session.ask("b?")
    top = max(answer.densities, key=answer.densities.get)
    assert top == session.memory.fragments[1].fid
    assert answer.memory_tokens == 1 + len(session.memory.fragments[1])


def test_no_memory_uses_the_prompt_alone(llama, tokenizer):
    answer = ask_after(llama, tokenizer, NoMemory(), ["the cat sat"])
    assert answer.memory_tokens == 0 and answer.densities == {}


@pytest.mark.parametrize("layer", [-1, 3, 1.5, "1", True])
def test_a_session_refuses_a_tracer_layer_its_model_lacks_as_it_is_made(layer, llama, tokenizer):
    """What the runner's preflight checks, checked for a library user too, before anything is stored."""
    with pytest.raises(ValueError, match=re.escape(f"method.tracer_layer={layer!r} is out of range: this model has 3 "
                                                   f"decoder layers, allowed the integers 0..2")):
        Session(llama, tokenizer, KVPrefixBackend(llama), MemDefrag(1, layer, "mean"), "shared_sink", "plain")


@pytest.mark.parametrize("call, value", [("store", None), ("ask", None), ("store", b"bytes"), ("ask", ["a list"])])
def test_a_session_given_no_text_says_so_in_one_line(call, value, llama, tokenizer):
    session = Session(llama, tokenizer, KVPrefixBackend(llama), NoMemory(), "shared_sink", "plain", 4)
    name = {"store": "text", "ask": "question"}[call]
    with pytest.raises(TypeError, match=rf"^Session.{call}: {name} must be a str, not {type(value).__name__} "):
        getattr(session, call)(value)


def test_a_question_before_anything_is_stored_is_refused_unless_the_method_reads_no_memory(llama, tokenizer):
    for method in (MemDefrag(1, 1, "mean"), Vanilla(), TextMemory()):
        session = Session(llama, tokenizer, KVPrefixBackend(llama), method, "shared_sink", "plain", 4)
        with pytest.raises(ValueError, match=f"nothing is stored yet for {type(method).__name__} to read"):
            session.ask("where did the cat sit?")
    none = Session(llama, tokenizer, KVPrefixBackend(llama), NoMemory(), "shared_sink", "plain", 4)
    assert none.ask("where did the cat sit?").prompt_tokens > 0           # answered, with no memory read
