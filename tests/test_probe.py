"""Probing: every placement of the target, every layer from one forward, ranks from densities."""

import pytest
import torch

from evals.datasets import QAItem
from evals.probe import Probe, tracing_table
from evals.retention import Group
from methods.backends.kv_prefix import KVPrefixBackend
from methods.attention.positions import Rotary
from methods.session import Session
from methods.baselines import TextMemory
from methods.baselines import Vanilla

GROUP = Group(0, QAItem("the cat sat on the mat", "where is the cat?", "mat"),
              ("a quick brown fox", "hello world again", "zzz yy x"))


def probe_session(model, tokenizer, method=None):
    return Session(model, tokenizer, KVPrefixBackend(model), method or Vanilla(), "shared_sink", "plain")


@pytest.mark.parametrize("method, formed, memory_forwards", [(Vanilla(), 4, 0), (TextMemory(), 0, 1)])
def test_every_position_from_one_forward_each(llama, tokenizer, method, formed, memory_forwards):
    """Latent memory is formed once; text memory runs its changed tail (methods.backends.text_prefix) before the prompt."""
    session = probe_session(llama, tokenizer, method)
    Rotary.of(llama)                                   # its one probe forward, learned once per model
    calls, records, seen = [], [], []
    handle = llama.model.layers[0].register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        for record in Probe("synthetic", fragments=4).run_group(session, GROUP):
            records.append(record)
            seen.append(len(calls))
    finally:
        handle.remove()
    per_placement = 1 + memory_forwards                                 # all layers from one prompt forward
    assert seen == [formed + per_placement * i for i in (1, 2, 3, 4)]
    assert [r["position"] for r in records] == [1, 2, 3, 4]
    for record in records:
        for mode in ("last", "mean"):
            assert len(record["ranks"][mode]) == llama.config.num_hidden_layers
            assert all(1 <= r <= 4 for r in record["ranks"][mode])


def test_a_dominant_target_is_ranked_first_at_every_position(llama, tokenizer):
    session = probe_session(llama, tokenizer)
    probe = Probe("synthetic", fragments=4)
    original = session.former.next_fragment

    def dominant_target(memory, text, reuse=False, kept=None):   # the target's keys at layer 1 dominate
        fragment = original(memory, text, reuse, kept)
        if text.startswith("the cat"):
            fragment.keys[1] = 50.0
        return fragment

    session.former.next_fragment = dominant_target
    records = list(probe.run_group(session, GROUP))
    assert all(r["ranks"][mode][1] == 1 for r in records for mode in ("last", "mean"))


def test_tracing_table_ranks_layers_best_first():
    records = [{"ranks": {"last": [3, 1], "mean": [1, 2]}}, {"ranks": {"last": [2, 1], "mean": [1, 4]}}]
    table = tracing_table(records)
    last = table[table.query_mode == "last"]
    assert last.layer.tolist() == [1, 0] and last.mean_rank.tolist() == [1.0, 2.5]
    assert last.top1.tolist() == [100.0, 0.0] and last.top2.tolist() == [100.0, 50.0]
    assert table[table.query_mode == "mean"].layer.tolist() == [0, 1]


def test_one_position_per_group_rotates_through_the_positions(llama, tokenizer):
    probe = Probe("synthetic", fragments=4, positions=[2, 4], one_position_per_group=True)
    seen = [[r["position"] for r in probe.run_group(probe_session(llama, tokenizer), Group(g, GROUP.target, GROUP.distractors))]
            for g in range(3)]
    assert seen == [[2], [4], [2]]


def test_bad_probe_settings_are_refused():
    from harness.errors import ConfigError
    with pytest.raises(ConfigError, match="task.positions"):
        Probe(fragments=5, positions=[0, 3])
    with pytest.raises(ConfigError, match="task.fragments=1"):
        Probe(fragments=1)


def test_text_rows_equal_eager_attention_weights(family_model):
    """Only the prompt's rows are built, and they are the model's own attention (masks, soft-capping)."""
    from methods.attention.tracing import eager_attention
    from methods.backends.text_prefix import TextPrefix

    ids = torch.arange(3, 40)
    layers = list(range(family_model.config.num_hidden_layers))
    rows = TextPrefix(family_model).attention_rows(ids[:-5], ids[-5:], layers)
    with eager_attention(family_model), torch.no_grad():
        weights = family_model(input_ids=ids.view(1, -1), output_attentions=True).attentions
    for layer in layers:
        torch.testing.assert_close(rows[layer], weights[layer][0, :, -5:].float().mean(0), atol=1e-5, rtol=0)


def test_a_text_prefix_runs_only_what_changed_and_answers_as_a_fresh_one(family_model):
    """Appending runs the new tokens only; after holding other texts, rows and logits are a fresh cache's."""
    from methods.backends.text_prefix import TextPrefix

    ran = []
    hook = family_model.get_input_embeddings().register_forward_hook(lambda m, i, o: ran.append(i[0].shape[1]))
    prompt, layers = torch.arange(50, 55), list(range(family_model.config.num_hidden_layers))
    head, tail, other = torch.arange(3, 20), torch.arange(20, 31), torch.arange(60, 70)
    served = TextPrefix(family_model)
    served.attention_rows(head, prompt, layers)
    served.prefill(torch.cat([head, other]), prompt)
    del ran[:]
    rows = served.attention_rows(torch.cat([head, tail]), prompt, layers)
    logits, _, position = served.prefill(torch.cat([head, tail]), prompt)
    hook.remove()
    assert ran == [len(tail), len(prompt), len(prompt)]      # the head stayed cached, the prompt is forgotten
    fresh = TextPrefix(family_model)
    expected = fresh.attention_rows(torch.cat([head, tail]), prompt, layers)
    for layer in layers:
        torch.testing.assert_close(rows[layer], expected[layer], atol=1e-5, rtol=0)
    torch.testing.assert_close(logits, TextPrefix(family_model).prefill(torch.cat([head, tail]), prompt)[0],
                               atol=1e-4, rtol=0)
    assert position == len(head) + len(tail) + len(prompt)


def test_the_sweep_records_the_lowest_mean_rank_or_the_best_top_k_as_asked():
    """Qwen2.5-Coder-0.5B's sweep in small: an early layer ranks the target middling everywhere (the lowest mean
    rank, seldom first), a middle one puts it first often but far back otherwise."""
    from evals.probe import best_row

    records = [{"group": g, "layers": [3, 15], "ranks": {"mean": [4, rank], "last": [9, 9]}}
               for g, rank in enumerate([1, 1, 1, 12, 15, 18])]
    table = tracing_table(records)
    assert best_row(table)["layer"] == 3                       # mean rank 4 against 8
    chosen = best_row(table, "top1")
    assert (chosen["layer"], chosen["query_mode"], chosen["top1"]) == (15, "mean", 50.0)
