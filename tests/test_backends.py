"""The fast backend is the paper's hidden-prefix formulation, exactly, on every family."""

import pytest
import torch

from methods.attention.decoder import DecoderError, attentions, layers as layers_of
from methods.formation import Former
from methods.generation import greedy
from methods.backends.hidden_prefix import HiddenPrefixBackend
from methods.backends.kv_prefix import KVPrefixBackend, rows_after, run_after
from methods.base import Reading
from methods.memory import LatentMemory
from methods.prompting import prompt_header
from methods.attention.tracing import densities, prompt_attention
from tests.conftest import FRAGMENTS, tiny_model

VIEWS = {"vanilla": None, "reordered_top2": [4, 0], "reordered_all": [2, 1, 0, 4, 3]}


HEADER = [7, 8, 9, 10]         # a prompt header's ids: what formation=shared_prefix forms every fragment behind


def formed(model, tokenizer, formation, texts=FRAGMENTS):
    former = Former(model, tokenizer, formation, keep_kv=True, keep_states=True, header=HEADER)
    memory = LatentMemory()
    for text in texts:
        former.store(memory, text)
    return memory


@pytest.mark.parametrize("formation", ["reference", "shared_sink", "own_bos"])
@pytest.mark.parametrize("view", sorted(VIEWS))
def test_fast_equals_hidden_prefix(family_model, tokenizer, formation, view):
    fast_equals_hidden_prefix(family_model, tokenizer, formation, view)


def test_fast_equals_hidden_prefix_behind_a_shared_prefix(family_model, tokenizer):
    """A sink of several positions (formation=shared_prefix) moves every fragment after it."""
    fast_equals_hidden_prefix(family_model, tokenizer, "shared_prefix", "reordered_top2")


def fast_equals_hidden_prefix(family_model, tokenizer, formation, view):
    memory = formed(family_model, tokenizer, formation)
    if VIEWS[view] is not None:
        memory = memory.arranged(VIEWS[view])
    prompt = torch.tensor(tokenizer("where is the cat?", add_special_tokens=False)["input_ids"])
    fast, ref = KVPrefixBackend(family_model), HiddenPrefixBackend(family_model)
    fast_logits, fast_cache, fast_pos = fast.prefill(memory, prompt)
    ref_logits, ref_cache, ref_pos = ref.prefill(memory, prompt)
    assert fast_pos == ref_pos == memory.sink_length + memory.n_tokens + len(prompt)
    torch.testing.assert_close(fast_logits, ref_logits, atol=1e-4, rtol=0)
    stop = {tokenizer.eos_token_id}
    assert greedy(family_model, fast_logits, fast_cache, fast_pos, 8, stop) == \
        greedy(family_model, ref_logits, ref_cache, ref_pos, 8, stop)
    layers = list(range(family_model.config.num_hidden_layers))
    fast_rows = fast.attention_rows(memory, prompt, layers)
    ref_rows = ref.attention_rows(memory, prompt, layers)               # eager attention weights
    for layer in layers:
        for mode in ("last", "mean"):
            torch.testing.assert_close(densities(fast_rows[layer], memory.spans(), mode),
                                       densities(ref_rows[layer], memory.spans(), mode), atol=1e-5, rtol=0)


def test_own_bos_is_the_shared_sink_formation_with_each_fragments_sink_kept(llama, tokenizer):
    """EPIC's setting: every fragment begins with its own sink position, the states after it those of shared_sink
    (formed behind the same token), and the memory's sink the same."""
    shared, own = formed(llama, tokenizer, "shared_sink"), formed(llama, tokenizer, "own_bos")
    torch.testing.assert_close(own.sink.keys, shared.sink.keys, atol=0, rtol=0)
    for a, b in zip(shared.fragments, own.fragments):
        assert len(b) == len(a) + 1 and int(b.token_ids[0]) == int(own.sink.token_ids[0])
        torch.testing.assert_close(b.keys[:, :, 1:], a.keys, atol=0, rtol=0)
        torch.testing.assert_close(b.keys[:, :, :1], own.sink.keys, atol=0, rtol=0)


def test_one_fragment_behind_a_shared_prefix_is_the_prefill_of_prefix_fragment_and_prompt(llama, tokenizer):
    """formation=shared_prefix: the memory's sink is the sink token and the header; a fragment formed behind them
    and read by the fast backend, in order or in parallel (APE with T = S = 1), is the plain prefill of the
    same ids in one sequence."""
    memory = formed(llama, tokenizer, "shared_prefix", texts=FRAGMENTS[:1])
    assert memory.sink.token_ids.tolist() == [tokenizer.bos_token_id, *HEADER] and memory.sink_length == 5
    assert memory.spans() == [(5, 5 + len(memory.fragments[0]))]
    prompt = torch.tensor(tokenizer("where is the cat?", add_special_tokens=False)["input_ids"])
    whole = torch.cat([memory.text_ids(), prompt]).view(1, -1)
    expected = llama(input_ids=whole).logits[0, -len(prompt):]
    for reading in (Reading(), Reading(parallel=True)):
        with reading.attention(llama, memory):
            logits = KVPrefixBackend(llama).prefill(memory, prompt, reading=reading)[0]
        torch.testing.assert_close(logits, expected, atol=1e-4, rtol=0)


def test_under_a_plain_prompt_the_shared_prefix_is_the_shared_sink(llama, tokenizer):
    """A plain prompt puts nothing before its question: APE's shared prefix is then the one-token sink, and
    formation=shared_prefix forms the memory shared_sink forms (Gemma-3-270M, a base model, reads plain)."""
    assert prompt_header(tokenizer, "plain") == []
    shared = formed(llama, tokenizer, "shared_sink")
    prefix = LatentMemory()
    former = Former(llama, tokenizer, "shared_prefix", keep_kv=True, header=prompt_header(tokenizer, "plain"))
    for text in FRAGMENTS:
        former.store(prefix, text)
    assert prefix.sink_length == 1 and prefix.spans() == shared.spans()
    for a, b in zip([shared.sink, *shared.fragments], [prefix.sink, *prefix.fragments]):
        torch.testing.assert_close(a.keys, b.keys, atol=0, rtol=0)


def test_an_answer_computes_only_the_logits_it_reads(llama, tokenizer):
    """Both backends give the last prompt row alone when asked (an answer reads nothing else), equal to the
    last of all rows; the hidden-prefix backend never computes logits for the prefix's positions."""
    memory = formed(llama, tokenizer, "shared_sink")
    prompt = torch.tensor([5, 6, 7, 8])
    for backend in (KVPrefixBackend(llama), HiddenPrefixBackend(llama)):
        every, last = backend.prefill(memory, prompt)[0], backend.prefill(memory, prompt, logits_to_keep=1)[0]
        assert every.shape[0] == len(prompt) and last.shape[0] == 1
        torch.testing.assert_close(last, every[-1:], atol=1e-5, rtol=0)


def test_fast_backend_never_recomputes_the_prefix(llama, tokenizer):
    """Only the prompt's positions go through the network."""
    memory = formed(llama, tokenizer, "shared_sink")
    seen = []
    handle = llama.model.layers[0].register_forward_pre_hook(lambda m, a, k: seen.append(
        (a[0] if a else k["hidden_states"]).shape[1]), with_kwargs=True)
    try:
        KVPrefixBackend(llama).prefill(memory, torch.tensor([5, 6, 7]))
    finally:
        handle.remove()
    assert seen == [3]


def test_a_trace_reuses_what_did_not_move_and_gives_the_same_rows_bit_for_bit(family_model, tokenizer):
    """The trace keeps the placed memory between questions; after appends, reorders, selections,
    forgetting and another prompt (sharing no head with the last) its rows equal a fresh backend's exactly."""
    memory = formed(family_model, tokenizer, "shared_sink", FRAGMENTS[:3])
    grown = formed(family_model, tokenizer, "shared_sink", FRAGMENTS)
    grown.fragments[:3] = memory.fragments                      # the same objects, two appended
    forgotten = LatentMemory(grown.sink, list(grown.fragments))
    forgotten.keep(1, torch.arange(0, len(grown.fragments[1]), 2))
    first = torch.arange(min(len(f) for f in grown.fragments))
    same_length = [LatentMemory(grown.sink, [grown.fragments[i].take(first)]) for i in (0, 1)]
    layers = [0, family_model.config.num_hidden_layers // 2]
    resident = KVPrefixBackend(family_model)
    for view, prompt in [(memory, "where is the cat?"), (memory, "Who?"), (grown, "who?"),
                         (grown.arranged([0, 1, 4, 3, 2]), "who?"), (grown.arranged([4, 0]), "where?"),
                         (forgotten, "where is the cat?"), (memory, "where is the cat?"),
                         (same_length[0], "who?"), (same_length[1], "who?")]:
        ids = torch.tensor(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        reused, fresh = resident.attention_rows(view, ids, layers), KVPrefixBackend(family_model).attention_rows(
            view, ids, layers)
        assert all(torch.equal(reused[layer], fresh[layer]) for layer in layers)


def test_a_trace_over_the_same_memory_runs_only_the_prompt_after_the_head_it_shares(family_model, tokenizer):
    """Over the last trace's memory, the leading prompt tokens the last prompt had too keep their keys, values and
    rows (a repeated prompt runs its last token); a changed memory or a layer not traced before runs it all. The
    rows are a fresh backend's."""
    memory = formed(family_model, tokenizer, "shared_sink", FRAGMENTS[:3])
    grown = formed(family_model, tokenizer, "shared_sink", FRAGMENTS)
    grown.fragments[:3] = memory.fragments
    head = torch.arange(40, 52)
    asked, other = torch.cat([head, torch.arange(5, 12)]), torch.cat([head, torch.arange(20, 24)])
    middle, last = family_model.config.num_hidden_layers // 2, family_model.config.num_hidden_layers - 1
    ran = []
    hook = family_model.get_input_embeddings().register_forward_hook(lambda m, i, o: ran.append(i[0].shape[1]))
    resident = KVPrefixBackend(family_model)
    try:
        for view, prompt, layers, runs in [(memory, asked, [0, middle], len(asked)), (memory, other, [0, middle], 4),
                                           (memory, other, [0, middle], 1), (memory, asked, [middle], 7),
                                           (grown, asked, [middle], len(asked)), (grown, other, [0, middle], len(other)),
                                           (grown, asked, [0, middle, last], len(asked)), (grown, other, [last], 4)]:
            del ran[:]
            rows = resident.attention_rows(view, prompt, layers)
            assert ran == [runs]
            fresh = KVPrefixBackend(family_model).attention_rows(view, prompt, layers)
            for layer in layers:
                torch.testing.assert_close(rows[layer], fresh[layer], atol=1e-5, rtol=0)
                assert torch.equal(densities(rows[layer], view.spans(), "mean").argsort(),
                                   densities(fresh[layer], view.spans(), "mean").argsort())
    finally:
        hook.remove()


def test_a_trace_keeps_its_buffer_through_a_prompt_up_to_twice_as_long(llama, tokenizer):
    """Questions between two stores share the trace's placed memory: it is not moved (a copy of every placed key
    and value) because the next prompt is longer, up to twice the first's length; the rows are a fresh trace's."""
    memory = formed(llama, tokenizer, "shared_sink", FRAGMENTS * 4)
    resident = KVPrefixBackend(llama)
    resident.attention_rows(memory, torch.arange(5, 9), [1])
    buffer = resident.traced.keys[0].data_ptr()
    rows = resident.attention_rows(memory, torch.arange(5, 13), [1])
    assert resident.traced.keys[0].data_ptr() == buffer
    torch.testing.assert_close(rows[1], KVPrefixBackend(llama).attention_rows(memory, torch.arange(5, 13), [1])[1],
                               atol=1e-5, rtol=0)


def test_tracing_stops_at_the_traced_layer(llama, tokenizer):
    memory = formed(llama, tokenizer, "shared_sink")
    ran = []
    handles = [layer.register_forward_pre_hook(lambda m, a, k, i=i: ran.append(i), with_kwargs=True)
               for i, layer in enumerate(llama.model.layers)]
    try:
        rows = KVPrefixBackend(llama).attention_rows(memory, torch.tensor([5, 6, 7]), [0, 1])
    finally:
        for h in handles:
            h.remove()
    assert ran == [0, 1] and sorted(rows) == [0, 1]                   # all layers from one forward
    assert rows[1].shape == (3, 1 + memory.n_tokens + 3)
    torch.testing.assert_close(rows[1].sum(-1), torch.ones(3))


def test_a_family_whose_inline_attention_returns_no_weights_is_one_decoder_error(tokenizer):
    """Falcon computes attention inline and returns its weights under eager attention; one that returned none
    (another such family, or another transformers) cannot be traced: one line naming it, not a TypeError."""
    falcon = tiny_model("falcon")
    memory = formed(falcon, tokenizer, "shared_sink")
    handles = [attention.register_forward_hook(lambda m, a, output: (output[0], None)) for attention in
               attentions(falcon)]
    try:
        with pytest.raises(DecoderError, match="model type 'falcon': layer 1's attention returned no weights"):
            KVPrefixBackend(falcon).attention_rows(memory, torch.tensor([5, 6, 7]), [1])
    finally:
        for handle in handles:
            handle.remove()


def test_traced_layers_pass_on_the_models_own_attention_output(family_model, tokenizer):
    """Tracing computes a layer's output from its own scores: what reaches the next layer is unchanged."""
    memory = formed(family_model, tokenizer, "shared_sink")
    prompt = torch.tensor(tokenizer("where is the cat?", add_special_tokens=False)["input_ids"])
    backend, n_layers = KVPrefixBackend(family_model), family_model.config.num_hidden_layers
    into_last = []
    handle = layers_of(family_model)[-1].register_forward_pre_hook(
        lambda m, a, k: into_last.append(a[0] if a else k["hidden_states"]), with_kwargs=True)
    try:
        run_after(family_model, backend.cache(memory, room=len(prompt)), prompt, 1 + memory.n_tokens)
        rows_after(family_model, backend.cache(memory, room=len(prompt)), prompt, 1 + memory.n_tokens,
                   list(range(n_layers)))
    finally:
        handle.remove()
    plain, traced = into_last
    torch.testing.assert_close(traced, plain, atol=1e-5, rtol=1e-5)


def test_traced_scores_mask_the_prompts_future_alike_without_a_mask():
    """Attention functions may get no mask for causal attention: the rows are the masked ones."""
    torch.manual_seed(0)
    query, key, value = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 7, 8), torch.randn(1, 2, 7, 8)
    visible = torch.ones(3, 7, dtype=torch.bool).tril(diagonal=4).view(1, 1, 3, 7)
    implicit, explicit = prompt_attention(None, query, key, value, None), \
        prompt_attention(None, query, key, value, visible)
    for a, b in zip(implicit, explicit):
        torch.testing.assert_close(a, b)
    assert (explicit[2][0, 5:] == 0).all() and (explicit[2][1, 6:] == 0).all()


def test_grouped_sdpa_on_cpu_changes_no_number(family_model, tokenizer, monkeypatch):
    """transformers' grouped-head sdpa (turned on for CPU models at load) gives the very same logits,
    attention rows and answer as copying keys and values per head."""
    from harness.models.loading import SDPA_GROUPED

    memory = formed(family_model, tokenizer, "shared_sink").arranged([2, 1, 0, 4, 3])
    prompt = torch.tensor(tokenizer("where is the cat?", add_special_tokens=False)["input_ids"])
    layers = list(range(family_model.config.num_hidden_layers))
    results = []
    for grouped in ("0", "1"):
        monkeypatch.setenv(SDPA_GROUPED, grouped)
        backend = KVPrefixBackend(family_model)
        logits, cache, position = backend.prefill(memory, prompt)
        results.append((logits, backend.attention_rows(memory, prompt, layers),
                        greedy(family_model, logits, cache, position, 8, {tokenizer.eos_token_id})))
    (logits, rows, answer), (grouped_logits, grouped_rows, grouped_answer) = results
    assert torch.equal(logits, grouped_logits) and answer == grouped_answer
    assert all(torch.equal(rows[layer], grouped_rows[layer]) for layer in layers)


@pytest.mark.parametrize("check_every", [1, 3, 8])
def test_decoding_that_looks_for_a_stop_every_few_tokens_gives_the_same_ids(llama, tokenizer, check_every):
    """The device-side loop (stops looked for every few tokens, the steps past one dropped) against a plain
    loop that reads every id on the host and stops at once, for every stop id it meets."""
    memory = formed(llama, tokenizer, "shared_sink")
    prompt = torch.tensor(tokenizer("where is the cat?", add_special_tokens=False)["input_ids"])
    backend = KVPrefixBackend(llama)
    logits, cache, position = backend.prefill(memory, prompt, room=16)
    plain = greedy(llama, logits, cache, position, 12, set(), check_every=1)
    assert len(plain) == 12
    for stop in {plain[0], plain[3], plain[-1]}:
        logits, cache, position = backend.prefill(memory, prompt, room=16)
        assert greedy(llama, logits, cache, position, 12, {stop}, check_every) == plain[:plain.index(stop)]
