"""The captured decode (methods/generation.py): fixed buffers and inputs, a CUDA graph on a GPU. On a CPU its step
runs as is on the same fixed tensors, so its answers can be held to the eager loop's, token for token: on every
tiny family, for every backend and every kind of read (none, text, the whole memory, a Top-2 view, APE's parallel
read, CacheBlend's recomputed one), and on the embedded models over the regression cache's experiments. The step
traces whole under torch.compile(fullgraph=True): no branch on a device value, so no host sync inside what a GPU
captures. A question's attention per key/value head on CUDA (methods/attention/grouped.py) is held here too: made
to apply on the CPU, the same attention as copied heads and the same answers on every read. On CUDA a read laid out
as a kept captured one replays that graph."""

import copy
from collections import Counter

import pytest
import torch
from torch._dynamo.utils import counters
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import StaticCache
from hydra import compose, initialize_config_module

from harness.running.runner import run
from methods.backends.hidden_prefix import HiddenPrefixBackend
from methods.backends.kv_prefix import KVPrefixBackend
from methods.baselines import NoMemory, TextMemory, Vanilla
from methods.attention.decoder import cache_keyword
from methods.errors import ConfigError
from methods import session as session_module
from methods.generation import CapturedStep, compiled_next_id, default_decode, fixed, greedy, replays
from methods.memdefrag import MemDefrag
from methods.peers.ape import APE
from methods.peers.cacheblend import CacheBlend
from methods.session import Session
from tests.conftest import EXPERIMENTS, FRAGMENTS, sweep_points
from tests.test_host_syncs import PROMPT, formed, llama_of

READS = {"none": (NoMemory, "shared_sink"), "text": (TextMemory, "shared_sink"), "vanilla": (Vanilla, "shared_sink"),
         "top2": (lambda: MemDefrag(2, 1, "mean"), "shared_sink"), "ape": (APE, "shared_prefix"),
         "cacheblend": (lambda: CacheBlend(0.5), "shared_sink")}


def asked(model, tokenizer, backend, read: str, decode: str, new_tokens: int = 12) -> list:
    """Two questions' Answers (the full budget: no stop id) over FRAGMENTS, decoding as `decode` says."""
    method, formation = READS[read]
    session = Session(model, tokenizer, backend(model), method(), formation, "plain", new_tokens, decode=decode)
    session.stop = set()
    for text in FRAGMENTS:
        session.store(text)
    return [session.ask(q) for q in ("where did the cat sit", "what jumps")]


def answers(model, tokenizer, backend, read: str, decode: str, new_tokens: int = 12) -> list[str]:
    """The texts of `asked`."""
    return [answer.text for answer in asked(model, tokenizer, backend, read, decode, new_tokens)]


def test_captured_answers_are_the_eager_ones_on_every_family(family_model, tokenizer):
    """A Top-2 view on every family (sliding windows, latent attention, sinks, no-rotary layers included)."""
    assert answers(family_model, tokenizer, KVPrefixBackend, "top2", "captured") == \
        answers(family_model, tokenizer, KVPrefixBackend, "top2", "eager")


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("read", sorted(READS))
def test_captured_answers_are_the_eager_ones_for_every_read(tokenizer, family, read):
    from tests.conftest import tiny_model
    model = tiny_model(family)
    assert answers(model, tokenizer, KVPrefixBackend, read, "captured") == \
        answers(model, tokenizer, KVPrefixBackend, read, "eager")


def test_captured_answers_are_the_eager_ones_on_hidden_prefix(llama, tokenizer):
    """hidden_prefix decodes from a grown DynamicCache: the fixed cache copies it into buffers with room."""
    for read in ("vanilla", "top2"):
        assert answers(llama, tokenizer, HiddenPrefixBackend, read, "captured") == \
            answers(llama, tokenizer, HiddenPrefixBackend, read, "eager")


@pytest.mark.parametrize("split", [False, True])
def test_compiled_answers_are_the_eager_ones_and_reads_of_every_length_share_one_compile(llama, tokenizer,
                                                                                       monkeypatch, split):
    """decode=compiled: inductor's step (C++ kernels here, Triton's on a GPU) answers as the eager loop token for
    token, and reads whose caches differ in length (none, the whole memory, a Top-2 view) reuse one compiled step:
    compiling per read would cost a question its compile. So too with every step's attention packed and split along
    its keys as on CUDA (in chunks of 5 here), whatever the number of chunks: one branch, one compile."""
    if split:
        from methods.attention import grouped
        for name, value in (("PACKING_DEVICES", {"cpu"}), ("KEY_CHUNK", 5)):
            monkeypatch.setattr(grouped, name, value)
    torch._dynamo.reset()
    compiled_next_id.cache_clear()
    compiled = counters["stats"]["unique_graphs"]
    for read in ("none", "vanilla", "top2"):
        assert answers(llama, tokenizer, KVPrefixBackend, read, "compiled") == \
            answers(llama, tokenizer, KVPrefixBackend, read, "eager")
    assert counters["stats"]["unique_graphs"] - compiled == 1


@pytest.mark.parametrize("attention", ["own", "packed", "split"])
def test_the_captured_step_has_no_branch_on_a_device_value(llama, tokenizer, monkeypatch, attention):
    """What a CUDA graph captures must not wait for the device: dynamo traces the step whole (fullgraph) only if
    no Python branch reads a tensor's value (a host sync on a GPU); so too with its attention packed per key/value
    head as on CUDA (a one-token query's two matrix products; their float32 products as a CPU makes them), and
    split along the keys (its read's buffers in whole chunks: of 5 positions here, as of 256 on CUDA)."""
    from methods.attention import grouped
    from methods.attention.grouped import grouped_attention
    if attention == "split":
        for name, value in (("PACKING_DEVICES", {"cpu"}), ("KEY_CHUNK", 5)):
            monkeypatch.setattr(grouped, name, value)
    backend = KVPrefixBackend(llama)
    session = Session(llama, tokenizer, backend, Vanilla(), "shared_sink", "plain", 8)
    for text in FRAGMENTS:
        session.store(text)
    prompt = session.prompt_ids("where did the cat sit")
    logits, cache, position = backend.prefill(session.memory, prompt, room=8, logits_to_keep=1)
    step = CapturedStep(llama, cache, position, 8)
    step.ids.copy_(logits[-1].argmax().view(1, 1))
    calls = grouped_here(monkeypatch) if attention != "own" else []
    torch._dynamo.reset()
    with torch.no_grad(), grouped_attention(llama):
        torch.compile(step.forward, fullgraph=True, backend="eager")()
    assert int(step.position) == position + 1
    assert (attention != "own") == bool(calls) and all(shape[2] == 1 for shape in calls)
    read = step.cache.layers[0].keys.shape[2]
    assert attention != "split" or read % 5 == 0


def test_decode_defaults_to_the_device_and_refuses_an_unknown_one(llama, tokenizer):
    assert default_decode(torch.device("cpu")) == "eager" and default_decode(torch.device("cuda")) == "captured"
    assert Session(llama, tokenizer, KVPrefixBackend(llama), Vanilla(), "shared_sink", "plain").decode == "eager"
    with pytest.raises(ConfigError, match=r"decode='graph' is not one of \['eager', 'captured', 'compiled'\]"):
        Session(llama, tokenizer, KVPrefixBackend(llama), Vanilla(), "shared_sink", "plain", decode="graph")


UPDATES, CAPACITY, ANSWER_TOKENS = 4, 400, 4     # the embedded models' runs below: updates, memory, answer at most


@pytest.mark.slow
@pytest.mark.parametrize("model", ["smollm2", "gemma3_270m"])
@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_captured_answers_are_the_eager_ones_on_the_embedded_models(tmp_path, monkeypatch, experiment, model):
    """Every regression-cache experiment's first point on the embedded model, one group, answers of at most
    ANSWER_TOKENS (a task's own budget too: LoCoMo's 50, LongBench's per subset): each question's answer is decoded
    both ways from the same read (the captured step on a copy of its prefilled cache), token for token the same,
    so every record field scored from it is too. Four tokens are three steps, the first on the fixed cache as the
    read left it, two on it grown (a CPU step reads every weight once, Gemma-3's 262k-row head alone 0.67 GB: at
    8 tokens the steps were 40 % of this test's time). One run, not one per decode: the memory is formed and each
    read prefilled once. As the regression cache's tiny form, contexts are cut to 200 tokens; a run of updates
    stops at the 4th (the steps it asks at before there, and the 4th) and holds at most 400 tokens, so that
    forgetting cuts whole 200-token fragments from about the 3rd update and every run asks at its last update
    (formation is most of these rows' time: 6 updates into 600 tokens took a third more)."""
    if experiment in ("memoryllm_comparison", "mplus_comparison"):
        pytest.skip("MemoryLLM and M+ decode with their own model's generate, not methods/generation.py")
    if experiment in ("probe", "top_tracing_layer_summary"):
        pytest.skip("the probe ranks fragments and decodes no answer")
    point = [o for o in sweep_points(experiment, keep_first=("model", "compression.rate"))[0]
             if not o.startswith("model=")]
    decoded = {"captured": [], "eager": []}

    def both_ways(model, logits, cache, position, max_new_tokens, stop, check_every=None, decode="eager"):
        max_new_tokens = min(max_new_tokens, ANSWER_TOKENS)
        for way, read in (("captured", copy.deepcopy(cache)), ("eager", cache)):
            decoded[way].append(greedy(model, logits, read, position, max_new_tokens, stop, check_every, way))
        return decoded["eager"][-1]

    monkeypatch.setattr(session_module, "greedy", both_ways)
    with initialize_config_module("conf", version_base="1.3"):
        cfg = compose("config", overrides=[f"experiment={experiment}", *point, f"model={model}", "logger=none",
                                           "task.groups=1", f"max_new_tokens={ANSWER_TOKENS}", "threads=1"])
    if "max_context_tokens" in cfg.task:
        cfg.task.max_context_tokens = 200
    if cfg.task.get("updates", 0) > UPDATES:
        cfg.task.updates = UPDATES
        if cfg.task.get("eval_steps"):
            cfg.task.eval_steps = [s for s in cfg.task.eval_steps if s < UPDATES] + [UPDATES]
        cfg.model.memory_capacity = min(cfg.model.memory_capacity, CAPACITY)
    run(cfg, str(tmp_path))
    assert decoded["eager"] and decoded["captured"] == decoded["eager"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("read", sorted(READS))
def test_the_cuda_graph_answers_as_the_eager_loop_on_cuda(tokenizer, read):
    """On CUDA the captured step is a CUDA graph, replayed from the third token on: its answers are the eager
    loop's (float32, so that no near tie of two logits flips under another kernel's order), and it was captured."""
    from tests.conftest import tiny_model
    model = tiny_model("llama").cuda()
    captured = []
    real = CapturedStep.__call__

    def noted(step, last):
        out = real(step, last)
        captured.append(step.graph is not None)
        return out

    CapturedStep.__call__ = noted
    try:
        on_graph = answers(model, tokenizer, KVPrefixBackend, read, "captured")
    finally:
        CapturedStep.__call__ = real
    assert on_graph == answers(model, tokenizer, KVPrefixBackend, read, "eager") and any(captured)


ON_CUDA = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                          reason="needs a CUDA device")])


@pytest.mark.parametrize("device", ["cpu", ON_CUDA])
@pytest.mark.parametrize("decode", ["captured", "compiled"])
def test_a_read_laid_out_as_the_last_replays_its_graph_and_answers_as_the_eager_loop(tokenizer, monkeypatch, decode,
                                                                                   device):
    """One prefilled read decoded twice, on the same buffers: on CUDA the second answer replays the graph the
    first captured (one capture in all); both are the eager loop's answer (on a CPU, where nothing is captured,
    too)."""
    from methods.attention.grouped import in_chunks
    from methods.backends.kv_prefix import PrefixLayer
    from tests.conftest import tiny_model
    from transformers.cache_utils import Cache
    model = tiny_model("llama").to(device)
    ids = torch.tensor([tokenizer("where did the cat sit")["input_ids"]], device=device)
    config, new_tokens = model.config, 12
    shape = (1, config.num_key_value_heads, in_chunks(ids.shape[1] + new_tokens, model.device),
             getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)

    def prefilled() -> tuple:
        cache = Cache(layers=[PrefixLayer(torch.zeros(shape, device=device), torch.zeros(shape, device=device))
                              for _ in range(config.num_hidden_layers)])
        logits = model(input_ids=ids, **{cache_keyword(model): cache}, use_cache=True).logits[0]
        return logits, cache

    captures, graph = [], torch.cuda.CUDAGraph

    class Counted(graph):
        def capture_begin(self, *args, **kwargs):
            captures.append(1)
            return super().capture_begin(*args, **kwargs)

    monkeypatch.setattr(torch.cuda, "CUDAGraph", Counted)
    with torch.no_grad():
        logits, cache = prefilled()
        twice = [greedy(model, logits, cache, ids.shape[1], new_tokens, set(), decode=decode) for _ in range(2)]
        eager = greedy(model, *prefilled(), ids.shape[1], new_tokens, set(), decode="eager")
    assert twice == [eager, eager] and len(eager) == new_tokens
    assert len(captures) == replays(model) == (device == "cuda")


def test_a_reads_layout_holds_what_the_attention_wraps_fix_and_none_under_a_wrap_that_does_not_say(llama,
                                                                                                     tokenizer):
    """Two APE reads over buffers alike but with other fragment bounds must not share a graph (the bounds are
    Python values a capture fixes), nor a read after the weights moved; a wrap that states nothing (a trace's) keeps
    and replays none."""
    from methods.attention.parallel import parallel_attention
    from methods.attention.tracing import attention_calls
    from methods.generation import layout
    backend = KVPrefixBackend(llama)
    cache = fixed(backend.cache(formed(llama, tokenizer, backend), room=4), 4)
    plain = layout(CapturedStep, llama, cache)
    with parallel_attention(llama, (1, 10), 1.0, 1.0):
        ape = layout(CapturedStep, llama, cache)
    with parallel_attention(llama, (1, 12), 1.0, 1.0):
        other = layout(CapturedStep, llama, cache)
    with attention_calls(llama, lambda inner, *args, **kwargs: inner(*args, **kwargs)):
        unstated = layout(CapturedStep, llama, cache)
    assert len({plain, ape, other}) == 3 and unstated is None and plain == layout(CapturedStep, llama, cache)
    weight = llama.lm_head.weight
    kept, weight.data = weight.data, weight.data.clone()          # moved, as a cast moves it
    try:
        assert layout(CapturedStep, llama, cache) != plain
    finally:
        weight.data = kept


def test_a_grown_caches_fixed_buffers_are_one_per_shape_holding_what_it_held(llama, tokenizer):
    """A cache the model grew (text memory's, hidden_prefix's) gets one keys and one values buffer for all of its
    layers, not two per layer: a later read of the same shapes is more often handed the same addresses, and so
    replays its graph. Each layer's filled part is its own, the room after it zeroed."""
    from transformers import DynamicCache
    ids = torch.tensor([tokenizer("where did the cat sit")["input_ids"]])
    cache = DynamicCache()
    with torch.no_grad():
        llama(input_ids=ids, **{cache_keyword(llama): cache}, use_cache=True)
    read = fixed(cache, 4)
    for part in ("keys", "values"):
        assert len({getattr(layer, part).untyped_storage().data_ptr() for layer in read.layers}) == 1
        assert all(torch.equal(getattr(new, part)[:, :, :ids.shape[1]], getattr(old, part)) and
                   not getattr(new, part)[:, :, ids.shape[1]:].any() for new, old in zip(read.layers, cache.layers))


def test_a_kept_graph_takes_the_new_reads_lengths_and_position(llama, tokenizer):
    """A read replaying a kept graph runs on that graph's tensors, set to its own lengths and position (the CPU
    captures nothing: the tensors are checked, the graph is the CUDA test's)."""
    from methods.generation import Kept
    backend = KVPrefixBackend(llama)
    step = CapturedStep(llama, backend.cache(formed(llama, tokenizer, backend), room=4), 9, 4)
    filled = int(step.cache.layers[0].cumulative_length)
    kept = Kept((), None, torch.zeros(1, 1, dtype=torch.long), torch.full((1, 1), 3),
                [torch.tensor(0) for _ in step.cache.layers], torch.zeros(1, 1, dtype=torch.long))
    step.take(kept, 9)
    assert step.position is kept.position and int(step.position) == 9 and step.ids is kept.ids
    assert all(layer.cumulative_length is length and int(length) == filled
               for layer, length in zip(step.cache.layers, kept.lengths))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_capture_leaves_the_allocators_cache_alone_where_the_device_has_room(tokenizer, monkeypatch):
    """A question's capture keeps what the allocator holds cached (torch.cuda.graph would hand it back to the driver
    before every capture, and the next question's allocations would ask for it again); on a device short of free
    memory (CAPTURE_HEADROOM raised past what it has) the cache is emptied first, and the answers stay the same."""
    import methods.generation as generation
    from tests.conftest import tiny_model
    model = tiny_model("llama").cuda()
    emptied = []
    real_empty = torch.cuda.empty_cache
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1) or real_empty())
    cached = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    del cached                                             # 256 MiB the allocator now holds cached
    reserved = torch.cuda.memory_reserved()
    roomy = answers(model, tokenizer, KVPrefixBackend, "vanilla", "captured")
    assert not emptied and torch.cuda.memory_reserved() >= reserved
    monkeypatch.setattr(generation, "CAPTURE_HEADROOM", torch.cuda.mem_get_info()[1] + 1)
    generation.GRAPHS.clear()                              # no read replays the first answers' graphs
    assert answers(model, tokenizer, KVPrefixBackend, "vanilla", "captured") == roomy and emptied


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("decode", ["captured", "compiled"])
def test_in_bf16_on_cuda_every_read_decodes_to_the_end_through_its_graph(tokenizer, decode):
    """In bf16, as the 8B runs decode: the step's packed attention (its float32 products from cuBLAS), captured
    as a graph, compiled by inductor or not, decodes every read's full budget (no stop id) on CUDA."""
    from tests.conftest import tiny_model
    model = tiny_model("llama").to("cuda", torch.bfloat16)
    for read in sorted(READS):
        assert [answer.tokens for answer in asked(model, tokenizer, KVPrefixBackend, read, decode)] == [12, 12], read


def packed_calls(monkeypatch) -> list:
    """The shapes of the queries methods/attention/grouped.py packs from now on."""
    from methods.attention import grouped
    calls, real = [], grouped.packed
    monkeypatch.setattr(grouped, "packed", lambda *args: calls.append(tuple(args[0].shape)) or real(*args))
    return calls


def grouped_here(monkeypatch) -> list:
    """methods/attention/grouped.py made to pack on the CPU; the shapes of the queries it packs."""
    from methods.attention import grouped
    monkeypatch.setattr(grouped, "PACKING_DEVICES", {"cpu"})
    return packed_calls(monkeypatch)


@pytest.mark.parametrize("q_len, split", [(1, False), (1, True), (3, False)])
@pytest.mark.parametrize("mask", ["bool", "additive"])
@pytest.mark.parametrize("kv_heads", [2, 8])
@pytest.mark.parametrize("scale", [0.3, None])
@pytest.mark.parametrize("masks", [2, 1])
def test_attention_per_key_value_head_is_attention_over_copied_heads(mask, q_len, kv_heads, scale, split, masks,
                                                                      monkeypatch):
    """methods/attention/grouped.py: the query heads of a key/value head as its rows, each under its query's mask
    row, give each head's output as copying the keys and values per query head does (transformers' repeat_kv); a
    one-token query's (a decoding step's) two matrix products, grouped heads or not, give sdpa's output too, split
    along the keys too (in chunks of 3 here, one of them masked whole); a mask of one batch row serves each."""
    from transformers.integrations.sdpa_attention import repeat_kv
    from methods.attention import grouped
    from methods.attention.grouped import packed
    monkeypatch.setattr(grouped, "KEY_CHUNK", 3 if split else 4)        # 9 keys: three chunks, or no split
    generator = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(*shape, generator=generator)
                         for shape in ((2, 8, q_len, 16), (2, kv_heads, 9, 16), (2, kv_heads, 9, 12)))
    seen = torch.rand(masks, 1, q_len, 9, generator=generator) > 0.3
    seen[..., 0] = True
    seen[..., 3:6] = not split
    given = seen if mask == "bool" else torch.zeros(seen.shape).masked_fill(~seen, torch.finfo(torch.float).min)
    group = 8 // kv_heads
    copied = torch.nn.functional.scaled_dot_product_attention(query, repeat_kv(key, group), repeat_kv(value, group),
                                                              attn_mask=given, scale=scale).transpose(1, 2)
    torch.testing.assert_close(packed(query, key, value, given, scale), copied)


def test_a_call_is_packed_only_where_packing_is_the_same_attention_in_less_memory(monkeypatch):
    """Not packed: a device outside PACKING_DEVICES, what sdpa applies beside the mask (soft-capping, dropout,
    sinks), no mask (sdpa groups heads itself then), a prompt so long that its mask repeated per group outweighs
    the keys and values repeat_kv would copy, or a prompt over ungrouped heads (a one-token query over them is)."""
    from types import SimpleNamespace
    from methods.attention import grouped
    module, key = SimpleNamespace(num_key_value_groups=4), torch.zeros(1, 2, 100, 16)
    query, mask = torch.zeros(1, 8, 5, 16), torch.ones(1, 1, 5, 100, dtype=torch.bool)
    assert not grouped.packs(module, query, key, mask, {})                  # a CPU
    monkeypatch.setattr(grouped, "PACKING_DEVICES", {"cpu"})
    assert grouped.packs(module, query, key, mask, {"scaling": 0.25})
    assert not grouped.packs(module, query, key, None, {})
    for applied in ({"softcap": 0.0}, {"dropout": 0.1}, {"s_aux": torch.zeros(8)}):
        assert not grouped.packs(module, query, key, mask, applied)
    assert not grouped.packs(SimpleNamespace(num_key_value_groups=1), torch.zeros(1, 2, 5, 16), key, mask, {})
    assert grouped.packs(SimpleNamespace(num_key_value_groups=1), torch.zeros(1, 2, 1, 16), key, mask[:, :, :1], {})
    # per key position: 3 more rows of 4 bytes per query against 2·8·16·4 bytes copied: packed below 85.3 queries
    assert grouped.packs(module, torch.zeros(1, 8, 85, 16), key, torch.ones(1, 1, 85, 100, dtype=torch.bool), {})
    assert not grouped.packs(module, torch.zeros(1, 8, 86, 16), key, torch.ones(1, 1, 86, 100, dtype=torch.bool), {})


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("read", sorted(READS))
@pytest.mark.parametrize("split", [False, True])
def test_grouped_attention_gives_every_read_the_same_answers(tokenizer, monkeypatch, family, read, split):
    """A question's attention per key/value head (methods/attention/grouped.py) stands aside on a CPU; made to
    apply there, it gives every read (sliding windows included) the answers of the model's own attention, its
    prompts over a memory and its one-token steps packed (APE's merged attention is left as it is); so too with
    every step split along its keys (chunks of 5 positions here), its read's buffers sized in whole chunks."""
    from methods.attention import grouped
    from tests.conftest import tiny_model
    model = tiny_model(family)
    calls = packed_calls(monkeypatch)
    own = answers(model, tokenizer, KVPrefixBackend, read, "captured")
    assert not calls
    calls = grouped_here(monkeypatch)
    if split:
        monkeypatch.setattr(grouped, "KEY_CHUNK", 5)
        products = []
        real = grouped.float32_products
        monkeypatch.setattr(grouped, "float32_products",
                            lambda a, b: products.append((a.shape, b.shape)) or real(a, b))
    assert answers(model, tokenizer, KVPrefixBackend, read, "captured") == own
    # a chunk's weights [.., rows, 5] meeting its values [.., 5, d]: 5 is no head width of these models
    assert not split or read == "ape" or any(a[-1] == 5 == b[-2] for a, b in products)
    assert (read == "ape") != any(shape[2] == 1 for shape in calls)
    assert read not in ("vanilla", "top2", "cacheblend") or any(shape[2] > 1 for shape in calls)  # a memory's prompt


def test_a_trace_inside_grouped_attention_packs_the_layers_before_its_own(llama, tokenizer, monkeypatch):
    """Attention wraps nest (tracing.attention_calls): a trace's forward inside grouped attention packs the layers
    before the traced one, and its rows are the model's own."""
    from methods.attention.grouped import grouped_attention
    session = Session(llama, tokenizer, KVPrefixBackend(llama), Vanilla(), "shared_sink", "plain")
    for text in FRAGMENTS:
        session.store(text)
    memory, prompt = session.memory, session.prompt_ids("where did the cat sit")
    own = KVPrefixBackend(llama).attention_rows(memory, prompt, [2])
    calls = grouped_here(monkeypatch)
    with grouped_attention(llama):
        rows = KVPrefixBackend(llama).attention_rows(memory, prompt, [2])
    assert len(calls) == 2 and all(shape[2] == len(prompt) for shape in calls)
    torch.testing.assert_close(rows[2], own[2])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_a_questions_attention_is_grouped_and_answers_as_without(tokenizer, monkeypatch):
    """On CUDA a question's masked attention, its prompt over the memory and its captured steps, is packed per
    key/value head: in bf16 the packed attention (a step's two matrix products, over a read as long as vanilla's
    at N_max, included) is the copied one's within bf16's rounding, and a Top-2 read in
    float32 answers as with packing turned off."""
    from transformers.integrations.sdpa_attention import repeat_kv
    from methods.attention import grouped
    from tests.conftest import tiny_model
    for q_len, kv_len in ((3, 37), (1, 37), (1, 12958), (1, 13056)):   # a prompt, a short and a long decoding
                                                                            # step, one split in 51 chunks
        query, key, value = (torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
                             for shape in ((1, 8, q_len, 64), (1, 2, kv_len, 64), (1, 2, kv_len, 64)))
        mask = torch.rand(1, 1, q_len, kv_len, device="cuda") > 0.3
        mask[..., 0] = True
        exact = torch.nn.functional.scaled_dot_product_attention(    # float32 over the same bf16 inputs
            query.float(), repeat_kv(key, 4).float(), repeat_kv(value, 4).float(), attn_mask=mask).transpose(1, 2)
        # bf16's rounding of the output and, in a step, of its weights (as flash attention rounds them): within
        # a 64th of the output's scale, not relative to outputs near 0
        torch.testing.assert_close(grouped.packed(query, key, value, mask).float(), exact, rtol=1.6e-2,
                                   atol=2 ** -6 * exact.abs().max().item())
    model = tiny_model("llama").cuda()
    calls = packed_calls(monkeypatch)
    packed_answers = answers(model, tokenizer, KVPrefixBackend, "top2", "captured")
    assert any(shape[2] == 1 for shape in calls) and any(shape[2] > 1 for shape in calls)
    monkeypatch.setattr(grouped, "PACKING_DEVICES", set())
    assert answers(model, tokenizer, KVPrefixBackend, "top2", "captured") == packed_answers


class Ops(TorchDispatchMode):
    """Every aten op run inside, by name."""

    def __init__(self):
        super().__init__()
        self.ran = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ran[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def ops_per_layer(step) -> Counter:
    """The ops one decoding step (`step(layers)` runs one on a tiny Llama of that many layers) adds per layer."""
    fewer, more = step(2), step(4)
    return Counter({op: (more[op] - fewer[op]) // 2 for op in more if more[op] != fewer[op]})


def test_a_captured_step_runs_per_layer_the_ops_of_transformers_own_static_cache_step(tokenizer):
    """The ~1,450 kernels a step runs on an 8B shape are the model's own: over a prefilled read, CapturedStep adds
    not one op per layer to transformers' StaticCache step (what `decode=compiled` fuses is theirs)."""
    def ours(layers: int) -> Counter:
        model = llama_of(layers)
        backend = KVPrefixBackend(model)
        logits, cache, position = backend.prefill(formed(model, tokenizer, backend), PROMPT, room=4, logits_to_keep=1)
        step = CapturedStep(model, cache, position, 4)
        last = step(logits[-1].argmax().view(1, 1))
        with Ops() as ops:
            step(last)
        return ops.ran

    def theirs(layers: int) -> Counter:
        model = llama_of(layers)
        cache = StaticCache(config=model.config, max_cache_len=64)
        model(input_ids=PROMPT.view(1, -1), position_ids=torch.arange(len(PROMPT)).view(1, -1), use_cache=True,
              **{cache_keyword(model): cache})
        with Ops() as ops:
            model(input_ids=torch.tensor([[5]]), position_ids=torch.tensor([[len(PROMPT)]]), use_cache=True,
                  **{cache_keyword(model): cache})
        return ops.ran

    with torch.no_grad():
        assert ops_per_layer(ours) == ops_per_layer(theirs)
