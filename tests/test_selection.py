"""Selection as its own axis: size rules and arrangements by hand, the text rankers on a hand-made memory, the
oracle on the tasks that mark targets, and density + Top-K + best last + latent answering as method=memdefrag."""

import pytest
import torch

from harness.results.folder import read_jsonl
from harness.running.runner import run
from methods.base import Question
from methods.memory import Fragment, LatentMemory
from methods.selection.arrange import adaptive_k, best_window, defragment, rotated
from methods.selection.rankers import BM25, Dense, Oracle, Recency
from methods.selection.selection import Selection
from tests.conftest import tiny_run_config


@pytest.mark.parametrize("scores, tau, k_max, expected", [
    ([0.5, 0.3, 0.1, 0.05], 2.0, 4, 2),          # 0.5/0.3 <= 2 grows, 0.3/0.1 > 2 stops
    ([0.4, 0.2, 0.01], 2.0, 4, 2),               # a ratio of exactly tau still grows
    ([0.41, 0.2, 0.19], 2.0, 4, 1),              # just past tau: one
    ([1.0] * 6, 2.0, 4, 4),                      # equal scores grow to the cap
    ([1.0] * 3, 2.0, 4, 3),                      # and never past the memory
    ([0.5, 0.0, 0.0], 2.0, 4, 1),                # a zero next score ends it
    ([0.1, 0.4, 0.3], 1.5, 4, 2),                # order of the memory does not matter: 0.4/0.3 <= 1.5, 0.3/0.1 > 1.5
])
def test_adaptive_k_by_hand(scores, tau, k_max, expected):
    assert adaptive_k(torch.tensor(scores), tau, k_max) == expected


def test_the_rotate_window_by_hand_wrap_included():
    scores = torch.tensor([0.6, 0.1, 0.1, 0.1, 0.5])
    assert best_window(scores, 2) == 4                                  # fragments 4 and 0, around the end
    assert rotated(scores, 2, cut=False) == [1, 2, 3, 4, 0]             # the window ends next to the prompt
    assert rotated(scores, 2, cut=True) == [4, 0]
    middle = torch.tensor([0.1, 0.3, 0.4, 0.1])
    assert rotated(middle, 2, cut=False) == [3, 0, 1, 2] and rotated(middle, 2, cut=True) == [1, 2]
    assert rotated(middle, 9, cut=True) == [0, 1, 2, 3]                 # wider than the memory: clipped, in order
    assert defragment(torch.tensor([0.2, 0.9, 0.1]), 2) == [0, 1]       # best last, as MemDefrag


def text_memory(texts: list[str]) -> LatentMemory:
    return LatentMemory(None, [Fragment(i, text, torch.zeros(1, dtype=torch.long), torch.zeros(1))
                               for i, text in enumerate(texts)])


MEMORY = ["The lighthouse keeper Orla feeds three gulls every dawn on the northern cliff.",
          "A baker in Velmora sells rye loaves with caraway seeds each market day.",
          "The river Tamsin floods the valley every spring and the farmers move their goats uphill.",
          "Professor Idris repairs antique clocks in a workshop behind the cathedral."]


@pytest.mark.parametrize("ranker", [BM25(), Dense()], ids=["bm25", "dense"])
@pytest.mark.parametrize("question, right", [("Who repairs antique clocks?", 3),
                                             ("What seeds are in the rye loaves sold in Velmora?", 1),
                                             ("When does the river Tamsin flood the valley?", 2)])
def test_text_rankers_find_the_right_fragment_of_a_hand_made_memory(ranker, question, right):
    scores = ranker.scores(text_memory(MEMORY), None, None, Question(question))
    assert int(torch.argmax(scores)) == right


def test_oracle_and_recency_by_hand():
    memory = text_memory(MEMORY)
    memory.reorder([2, 0, 3, 1])
    assert Oracle().scores(memory, None, None, Question("?", frozenset({3}))).tolist() == [0, 0, 1, 0]
    assert Recency().scores(memory, None, None, Question("?")).tolist() == [2, 0, 3, 1]


def test_text_rankers_run_no_model_forward_and_dense_embeds_each_text_once_when_stored(llama, tokenizer):
    from methods.backends.kv_prefix import KVPrefixBackend
    from methods.session import Session

    forwards = []
    llama.model.layers[0].register_forward_pre_hook(lambda *_: forwards.append(1))     # any forward runs it
    for ranker, forward in (("bm25", False), ("dense", False), ("recency", False), ("random", False),
                            ("density", True)):
        method = Selection(ranker=ranker, k=1, reading="text", tracer_layer=1)
        session = Session(llama, tokenizer, KVPrefixBackend(llama), method, "shared_sink", "plain", max_new_tokens=1)
        for text in MEMORY[:3]:
            session.store(text)
        assert ("index" in session.update_seconds) == (ranker == "dense")
        forwards.clear()
        plan = method.plan(session.memory, torch.tensor([5, 6, 7]), session.backend, Question("antique clocks"))
        assert bool(forwards) == forward, ranker
        assert plan.text_ids is not None and plan.latent is None
        if ranker == "dense":
            assert set(method.ranker.embeddings) == set(MEMORY[:3])


def records(tmp_path, checkpoint, *overrides, small_task=True):
    run(tiny_run_config(checkpoint, *overrides, small_task=small_task), str(tmp_path))
    return read_jsonl(tmp_path / "predictions.jsonl")


def test_density_topk_best_last_latent_is_memdefrag_answer_for_answer(tmp_path, tiny_checkpoint):
    reference = records(tmp_path / "memdefrag", tiny_checkpoint, "method=memdefrag_top2", "task.updates=5")
    chosen = records(tmp_path / "select", tiny_checkpoint, "method=select", "method.ranker=density", "method.k=2",
                     "method.size=topk", "method.arrangement=best_last", "method.reading=latent", "task.updates=5")
    keys = ("group", "step", "output", "target_rank", "used_tokens")
    assert [{k: r[k] for k in keys} for r in chosen] == [{k: r[k] for k in keys} for r in reference]


@pytest.mark.slow
def test_density_topk_best_last_latent_is_memdefrag_on_smollm2(tmp_path):
    # answers of 8 tokens, not 32: the ranks compared are the same, the answers their first 8 tokens
    common = ["task.groups=3", "task.updates=6", "task.eval_steps=[2,6]", "max_new_tokens=8", "logger=none",
              "threads=1"]
    from hydra import compose, initialize_config_module

    outputs = []
    for name, method in (("memdefrag", ["method=memdefrag_top1"]),
                         ("select", ["method=select", "method.ranker=density", "method.k=1"])):
        with initialize_config_module("conf", version_base="1.3"):
            run(compose("config", overrides=method + common), str(tmp_path / name))
        outputs.append([(r["output"], r["target_rank"]) for r in read_jsonl(tmp_path / name / "predictions.jsonl")])
    assert outputs[0] == outputs[1] and len(outputs[0]) == 6


def test_the_oracle_puts_the_target_first_on_retention_and_longbench(tmp_path, tiny_checkpoint):
    for record in records(tmp_path / "retention", tiny_checkpoint, "method=select", "method.ranker=oracle",
                          "method.k=1", "task.updates=5"):
        assert record["target_rank"] == 1
        assert record["used_tokens"] == 1 + record["target_tokens"]
    chunks = records(tmp_path / "longbench", tiny_checkpoint, "method=select", "method.ranker=oracle",
                     "method.k=1", "task=longbench", "task.groups=1", "task.max_tokens=100000", small_task=False)
    assert chunks and all(r["target_rank"] == 1 for r in chunks if r["answer_chunks"])
