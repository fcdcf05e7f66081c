"""The peers' shared mechanism is exact: recomputing memory positions (EPIC, CacheBlend) and reading fragments in
parallel (APE) reduce to prefilling the text, to vanilla, and to the paper's hidden-prefix formulation where
they must; and each peer chooses what its paper says."""

import pytest
import torch
from transformers import DynamicCache

from methods.attention.parallel import merged_probabilities
from methods.backends.hidden_prefix import HiddenPrefixBackend
from methods.backends.kv_prefix import KVPrefixBackend
from methods.backends.text_prefix import TextPrefix
from methods.attention.decoder import cache_keyword
from methods.base import Reading
from methods.baselines import Vanilla
from methods.errors import ConfigError
from methods.peers.ape import APE
from methods.peers.cacheblend import CacheBlend, most_deviating
from methods.peers.epic import EPIC
from methods.session import Session
from tests.conftest import FAMILIES, FRAGMENTS, tiny_model
from tests.test_backends import formed

INLINE = {"falcon"}                       # computes attention inline: refused (test below)
PER_LAYER_INPUTS = {"gemma4", "gemma4_wide"}   # the hidden-prefix formulation cannot recompute there (refused)
READABLE = sorted(set(FAMILIES) - INLINE)


def prompt_of(tokenizer):
    return torch.tensor(tokenizer("where is the cat?", add_special_tokens=False)["input_ids"])


def last_logits(backend, memory, prompt, reading=Reading()):
    return backend.prefill(memory, prompt, logits_to_keep=1, reading=reading)[0]


@pytest.mark.parametrize("family", READABLE)
def test_recomputing_every_position_is_prefilling_the_fragments_text_as_one_sequence(family, tokenizer):
    model = tiny_model(family)
    memory, prompt = formed(model, tokenizer, "shared_sink"), prompt_of(tokenizer)
    every = Reading(recompute=torch.arange(1, memory.n_tokens + 1))
    text = TextPrefix(model).prefill(memory.text_ids(), prompt)[0]
    torch.testing.assert_close(last_logits(KVPrefixBackend(model), memory, prompt, every), text, atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", ["llama", "gemma3", "gpt_oss", "deepseek_v3"])
def test_recomputing_no_position_and_epic_with_k_0_are_vanilla_exactly(family, tokenizer):
    model = tiny_model(family)
    memory, prompt = formed(model, tokenizer, "shared_sink"), prompt_of(tokenizer)
    backend = KVPrefixBackend(model)
    vanilla = last_logits(backend, memory, prompt)
    none = Reading(recompute=torch.empty(0, dtype=torch.long))
    assert torch.equal(last_logits(backend, memory, prompt, none), vanilla)
    plan = EPIC(k=0).plan(memory, prompt, backend)
    assert len(plan.reading.recompute) == 0
    assert torch.equal(last_logits(backend, plan.latent, prompt, plan.reading), vanilla)


@pytest.mark.parametrize("family", sorted(set(READABLE) - PER_LAYER_INPUTS))
def test_partial_recomputation_equals_the_hidden_prefix_formulation(family, tokenizer):
    """The fast backend's masks by position (sliding windows included) against the paper's formulation, whose
    layers simply keep the recomputed positions' own inputs: EPIC's first tokens, and CacheBlend's reading (every
    position through the check layer, then its chosen ones)."""
    model = tiny_model(family)
    memory, prompt = formed(model, tokenizer, "shared_sink"), prompt_of(tokenizer)
    fast, reference = KVPrefixBackend(model), HiddenPrefixBackend(model)
    for method in (EPIC(k=3), CacheBlend(ratio=0.2, check_layer=1)):
        reading = method.plan(memory, prompt, fast).reading
        torch.testing.assert_close(last_logits(fast, memory, prompt, reading),
                                   last_logits(reference, memory, prompt, reading), atol=1e-4, rtol=0)


def test_the_hidden_prefix_formulation_refuses_to_recompute_where_layers_read_every_input_token(tokenizer):
    model = tiny_model("gemma4")
    memory = formed(model, tokenizer, "shared_sink")
    with pytest.raises(ValueError, match="per-layer embeddings of every input token"):
        HiddenPrefixBackend(model).prefill(memory, prompt_of(tokenizer), reading=Reading(recompute=torch.tensor([1])))


def test_epic_recomputes_the_first_k_tokens_of_every_fragment_of_the_view(llama, tokenizer):
    memory = formed(llama, tokenizer, "shared_sink")
    view = memory.arranged([3, 0])
    reading = EPIC(k=4).reading(view, KVPrefixBackend(llama))
    (a, b), (c, d) = view.spans()
    assert reading.recompute.tolist() == [*range(a, min(a + 4, b)), *range(c, min(c + 4, d))]
    assert reading.recomputed(view.n_tokens, 3) == len(reading.recompute)


def test_cacheblend_chooses_the_tokens_whose_values_deviate_most_at_the_check_layer(llama, tokenizer):
    """Hand-check: the memory's text prefilled as one sequence gives the recomputed values at the check layer; the
    stored ones are each fragment's own (Llama's values carry no position); the chosen are the int(ratio * N)
    largest squared distances, and every position is recomputed through the check layer."""
    memory, prompt = formed(llama, tokenizer, "shared_sink"), prompt_of(tokenizer)
    layer, ratio = 1, 0.1
    full = DynamicCache()
    llama(input_ids=memory.text_ids().view(1, -1), **{cache_keyword(llama): full}, use_cache=True)
    recomputed = full.layers[layer].values[0]                                  # [kv_heads, 1+N, d]
    stored = torch.cat([f.values[layer] for f in [memory.sink, *memory.fragments]], dim=1)
    by_hand = ((recomputed - stored) ** 2).sum(dim=(0, 2))[1:]
    backend = KVPrefixBackend(llama)
    torch.testing.assert_close(backend.deviations(memory, layer), by_hand, atol=1e-5, rtol=1e-4)
    reading = CacheBlend(ratio=ratio, check_layer=layer).plan(memory, prompt, backend).reading
    count = int(ratio * memory.n_tokens)
    assert len(reading.recompute) == count == 14
    assert set(reading.recompute.tolist()) == set((torch.topk(by_hand, count).indices + 1).tolist())
    assert reading.recompute_through == layer and reading.recompute.tolist() == sorted(reading.recompute.tolist())


def test_most_deviating_counts_as_the_authors_and_breaks_ties_to_the_earlier_position():
    deviations = torch.tensor([0.5, 2.0, 2.0, 0.1, 3.0])
    assert most_deviating(deviations, 0.5).tolist() == [2, 5]            # int(0.5 * 5) = 2: positions 5 and 2
    assert most_deviating(deviations, 0.0).tolist() == []
    assert most_deviating(deviations, 1.0).tolist() == [1, 2, 3, 4, 5]


def test_cacheblend_check_pass_is_reused_by_the_prefill_of_the_same_memory(llama, tokenizer, monkeypatch):
    memory, prompt = formed(llama, tokenizer, "shared_sink"), prompt_of(tokenizer)
    backend = KVPrefixBackend(llama)
    reading = CacheBlend().plan(memory, prompt, backend).reading
    runs = []
    monkeypatch.setattr("methods.backends.kv_prefix.recompute_through", lambda *a: runs.append(a))
    backend.prefill(memory, prompt, reading=reading)
    assert runs == []                                      # the check's cache, not a second pass
    backend.prefill(memory, prompt, reading=reading)
    assert len(runs) == 1                                  # used once: a later prefill recomputes


@pytest.mark.parametrize("family", ["llama", "gemma2", "gemma3", "gpt_oss", "qwen2"])
def test_ape_with_t_and_s_1_over_one_fragment_is_vanilla(family, tokenizer):
    """Softcapping (Gemma-2), sliding windows (Gemma-2/3), attention sinks (GPT-OSS), biases (Qwen2)."""
    model = tiny_model(family)
    memory, prompt = formed(model, tokenizer, "shared_sink", FRAGMENTS[:1]), prompt_of(tokenizer)
    backend = KVPrefixBackend(model)
    plan = APE(temperature=1.0, scale=1.0).plan(memory, prompt, backend)
    with plan.reading.attention(model, plan.latent):
        logits, _, position = backend.prefill(plan.latent, prompt, reading=plan.reading)
    vanilla, _, vanilla_position = backend.prefill(memory, prompt)
    assert position == vanilla_position
    torch.testing.assert_close(logits, vanilla, atol=1e-5, rtol=0)


def test_ape_reads_every_fragment_at_the_same_positions_behind_the_sink(llama, tokenizer):
    """Two fragments of the same text are placed alike; the prompt starts after the longest fragment."""
    memory = formed(llama, tokenizer, "shared_sink", [FRAGMENTS[0], FRAGMENTS[0], FRAGMENTS[2]])
    cache = KVPrefixBackend(llama).cache(memory, room=8, parallel=True)
    (a, b), (c, d), _ = memory.spans()
    for layer in cache.layers:
        assert torch.equal(layer.keys[:, :, a:b], layer.keys[:, :, c:d])
    prompt = prompt_of(tokenizer)
    reading = APE().reading(memory, None)
    with reading.attention(llama, memory):
        _, _, position = KVPrefixBackend(llama).prefill(memory, prompt, reading=reading)
    assert position == 1 + max(len(f) for f in memory.fragments) + len(prompt)


def test_merged_attention_is_softmax_at_t_s_1_and_t_s_move_the_fragments_share():
    torch.manual_seed(0)
    scores = torch.randn(1, 2, 4, 7)
    scores[..., 0, 1:4] = float("-inf")                  # a row that sees no fragment token
    context = (1, 4)
    torch.testing.assert_close(merged_probabilities(scores, context, 1.0, 1.0), torch.softmax(scores, -1))
    sharp = merged_probabilities(scores, context, 0.5, 1.0)[..., 1:, 1:4]
    plain = torch.softmax(scores, -1)[..., 1:, 1:4]
    within = lambda p: p / p.sum(-1, keepdim=True)       # noqa: E731 - the distribution inside the block
    assert (within(sharp).amax(-1) >= within(plain).amax(-1) - 1e-6).all()
    damped = merged_probabilities(scores, context, 1.0, 0.5)[..., 1:, 1:4].sum(-1)
    assert (damped < plain.sum(-1)).all()
    torch.testing.assert_close(merged_probabilities(scores, context, 0.7, 0.6).sum(-1), torch.ones(1, 2, 4))


def test_peers_answer_end_to_end_and_say_how_much_they_recomputed(llama, tokenizer):
    for method, share in ((EPIC(k=2), lambda n, m: 2 * 5), (CacheBlend(ratio=0.5, check_layer=0),
                                                             lambda n, m: (n + 2 * int(0.5 * n)) / 3),
                          (APE(0.5, 0.8), lambda n, m: 0), (EPIC(k=2, select=2), lambda n, m: 4),
                          (Vanilla(), lambda n, m: 0)):
        session = Session(llama, tokenizer, KVPrefixBackend(llama), method, "shared_sink", "plain", 4)
        for text in FRAGMENTS:
            session.store(text)
        answer = session.ask("where is the cat?")
        assert answer.tokens >= 1 and answer.recomputed == pytest.approx(share(session.memory.n_tokens, 3))


def test_a_family_computing_attention_inline_is_refused_before_its_weights_load():
    for method in (EPIC(), CacheBlend(), APE()):
        with pytest.raises(ConfigError, match="computes attention inline"):
            method.check_model(FAMILIES["falcon"]())
        method.check_model(FAMILIES["llama"]())


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), -float("inf")])
def test_a_library_caller_gets_the_same_refusal_of_a_non_finite_number(bad):
    with pytest.raises(ConfigError, match="must be a finite number > 0"):
        APE(temperature=bad)
    with pytest.raises(ConfigError, match=r"must be a finite number in \[0, 1\]"):
        CacheBlend(ratio=bad)
