"""Host syncs on the CPU: under a phantom second device (tests/phantom.py) every read of device values, every
data-dependent shape and every blocking host-to-device copy is counted. Prefill, trace and eviction make none,
however many layers and fragments; decoding makes none per token; a question reads to the host only what its
host work needs (counted below, each with why)."""

from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from evals.distortion import Distortion
from methods.backends.hidden_prefix import HiddenPrefixBackend
from methods.backends.kv_prefix import KVPrefixBackend
from methods.forgetting import Informativeness, RandomForgetting, RandomLayerwise
from methods.formation import Former
from methods.generation import greedy
from methods.memdefrag import MemDefrag
from methods.memory import Fragment, LatentMemory
from methods.memoryllm.checkpoint import MemoryLLMConfig, MemoryLLMForCausalLM
from methods.memoryllm.mplus import MPlusWriter, retrieval_view
from methods.selection.selection import Selection
from methods.session import Session
from tests.conftest import COMMON, FRAGMENTS
from tests.phantom import PhantomDevice
from tests.testdata.memoryllm.tiny import fill
from methods.window import Window

PROMPT = torch.tensor([1, 40, 41, 42, 43, 44])


def llama_of(layers: int):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(LlamaConfig(**{**COMMON, "num_hidden_layers": layers})).eval()


def formed(model, tokenizer, backend, texts=FRAGMENTS[:4], self_info=False) -> LatentMemory:
    memory = LatentMemory()
    former = Former(model, tokenizer, keep_kv=backend.keep_kv, keep_states=backend.keep_states,
                    keep_self_info=self_info)
    for text in texts:
        former.store(memory, text)
    return memory


# transformers' look for packed sequences in position ids given without a cache (masking_utils): one per forward
PACKED = {"__bool__": 1}


@pytest.mark.parametrize("backend_class, trace", [(KVPrefixBackend, {}), (HiddenPrefixBackend, PACKED)])
def test_prefill_and_trace_make_no_host_sync_whatever_the_layers(backend_class, trace, tokenizer):
    """The fast backend's trace runs on a cache; the reference's runs without one."""
    counts = {}
    for layers in (2, 6):
        model = llama_of(layers)
        with PhantomDevice(model) as mode:
            backend = backend_class(model)
            memory = formed(model, tokenizer, backend)
            mode.reset()
            backend.prefill(memory.arranged([3, 1, 0]), PROMPT, logits_to_keep=1)
            prefill = dict(mode.syncs)
            mode.reset()
            backend.attention_rows(memory, PROMPT, [layers - 1])
            counts[layers] = (prefill, dict(mode.syncs))
    assert counts[2] == counts[6], "host syncs grow with the layers"
    assert counts[6] == ({}, trace)


def test_decoding_makes_no_host_sync_per_token(llama, tokenizer):
    """The stop look every 8 tokens (a GPU's) is read once it has landed; the ids are read once, at the end."""
    counts = []
    with PhantomDevice(llama) as mode:
        backend = KVPrefixBackend(llama)
        memory = formed(llama, tokenizer, backend)
        for tokens in (9, 33):
            logits, cache, position = backend.prefill(memory, PROMPT, room=tokens, logits_to_keep=1)
            mode.reset()
            greedy(llama, logits, cache, position, tokens, stop={2}, check_every=8)
            counts.append(dict(mode.syncs))
    assert counts == [{"tolist": 1}, {"tolist": 1}]


@pytest.mark.parametrize("forgetting", [Informativeness, RandomForgetting, RandomLayerwise])
def test_eviction_makes_no_host_sync(forgetting, llama, tokenizer):
    with PhantomDevice(llama) as mode:
        backend = KVPrefixBackend(llama)
        memory = formed(llama, tokenizer, backend, self_info=True)
        fragment = Former(llama, tokenizer, keep_self_info=True).next_fragment(memory, "one more fragment")
        strategy = forgetting(memory.n_tokens - 8)
        mode.reset()
        assert strategy.admit(memory, fragment) > 0
    assert len(memory) > 3 and dict(mode.syncs) == {}


def test_a_question_reads_to_the_host_only_its_order_densities_and_answer(llama, tokenizer):
    """MemDefrag's question: the order of the fragments (host work on the scores), the densities the answer
    records, the answer's ids and the last positions its reads took (the window's check, all at once after the
    answer), each read once; nothing else waits for the device."""
    with PhantomDevice(llama) as mode:
        session = Session(llama, tokenizer, KVPrefixBackend(llama), MemDefrag(k=2, tracer_layer=2), "shared_sink",
                          "plain", max_new_tokens=12)
        for text in FRAGMENTS:
            session.store(text)
        mode.reset()
        session.ask("where is the cat?")
    by_file = Counter((kind, where.split(":")[0]) for (kind, where), n in mode.sites.items() for _ in range(n))
    assert by_file == {("cpu", "selection/selection.py"): 1, ("tolist", "methods/session.py"): 1,
                       ("tolist", "methods/generation.py"): 1, ("tolist", "methods/window.py"): 1}


@pytest.mark.parametrize("arrangement, size", [("best_last", "topk"), ("best_last", "adaptive"),
                                               ("rotate", "topk"), ("window", "topk")])
def test_an_order_reads_the_scores_once(arrangement, size):
    scores = torch.rand(12, generator=torch.Generator().manual_seed(0))
    selection = Selection(ranker="random", size=size, arrangement=arrangement, window=3)
    expected = selection.order(scores)
    with PhantomDevice(scores) as mode:
        assert selection.order(scores) == expected
    assert mode.total() == 1


def test_distortion_reads_each_query_mode_once():
    layers = 6
    rows = {layer: torch.rand(3, 25) for layer in range(layers)}
    memory = LatentMemory(Fragment(0, "", torch.ones(1, dtype=torch.long), torch.zeros(1)),
                          [Fragment(fid, "", torch.ones(6, dtype=torch.long), torch.zeros(6)) for fid in range(4)])
    session = SimpleNamespace(model=SimpleNamespace(config=LlamaConfig(num_hidden_layers=layers)), memory=memory,
                              prompt_ids=lambda question: PROMPT, trace=lambda view, prompt, asked: rows)
    group = SimpleNamespace(target=SimpleNamespace(question="q"))
    with PhantomDevice(*rows.values()) as mode:
        observed = Distortion.observe(None, session, 2, group)
    assert {mode: len(values) for mode, values in observed["density"].items()} == {"last": layers, "mean": layers}
    assert mode.syncs == {"tolist": 2}


def test_mplus_retrieval_makes_no_host_sync_whatever_the_layers():
    reference = torch.load(Path(__file__).parent / "testdata" / "memoryllm" / "reference.pt")
    counts = {}
    for layers in (2, 4):
        config = MemoryLLMConfig.from_dict({**reference["mplus/config"], "num_hidden_layers": layers})
        model = fill(MemoryLLMForCausalLM(config))
        with PhantomDevice(model) as mode:
            writer = MPlusWriter(model, None, torch.Generator().manual_seed(reference["seed"]))
            for context in [*reference["contexts"], reference["mplus"]["third"]]:
                writer.admit(writer.memory, writer.next_fragment(writer.memory, "", kept=context.tolist()))
            mode.reset()
            retrieval_view(model, writer.memory, reference["question"])
            counts[layers] = dict(mode.syncs)
    assert counts[2] == counts[4] == PACKED


def test_the_window_reads_a_questions_positions_once_at_its_end_not_per_forward(llama, tokenizer):
    """The trained-window check watches every forward; on a device it keeps each forward's last position there
    and reads them all as the question ends (one host read a question, none more at the record's take),
    counting what a host run counts."""
    beyond = []
    for on_device in (True, False):
        window = Window(1, allow=True)
        session = Session(llama, tokenizer, KVPrefixBackend(llama), MemDefrag(k=2, tracer_layer=2), "shared_sink",
                          "plain", max_new_tokens=12, window=window)
        with PhantomDevice(*([llama] if on_device else [])) as mode, window.watching(llama):
            for text in FRAGMENTS:
                session.store(text)
            session.ask("where is the cat?")
            asked = [site for site in mode.sites if site[1].startswith("methods/window.py")]
            beyond.append(window.take())
            taken = [(site, n) for site, n in mode.sites.items() if site[1].startswith("methods/window.py")]
        if on_device:
            assert [(kind, n) for (kind, _), n in taken] == [("tolist", 1)] and len(asked) == 1
    assert beyond[0] == beyond[1] > 0
