"""Batched formation (formation_batch=batched): the fragments a group announces are formed several per padded
forward, each exactly as its forward alone, and a whole run answers as the one-fragment-per-forward run."""

import json

import pytest
import torch

from harness.running.runner import run
from methods.formation import Former
from methods.memory import LatentMemory, parts
from tests.conftest import FRAGMENTS, tiny_model, tiny_run_config

TEXTS = [*FRAGMENTS, "x", "a short one"]          # lengths 2..66 ids with the sink; one crosses the sliding windows
HEADER = [7, 8, 9, 10]                           # a prompt header (formation=shared_prefix)


def forwards(monkeypatch) -> list[list[int]]:
    """The rows' lengths of every formation forward from now on."""
    seen = []
    original = Former._forward
    monkeypatch.setattr(Former, "_forward",
                        lambda self, rows: seen.append([len(r) for r in rows]) or original(self, rows))
    return seen


def stored(model, tokenizer, formation, batch, texts=TEXTS, reuse=None, **options) -> LatentMemory:
    former = Former(model, tokenizer, formation, keep_kv=True, keep_states=True, keep_self_info=True,
                    header=HEADER, batch=batch, reuse=reuse, **options)
    memory = LatentMemory()
    former.expect(texts, first=True)
    for i, text in enumerate(texts):
        former.store(memory, text, reuse=i > 0)
    return memory


def assert_same(solo: LatentMemory, batched: LatentMemory, atol: float = 1e-5) -> None:
    assert batched.ids() == solo.ids()
    for a, b in zip([solo.sink, *solo.fragments], [batched.sink, *batched.fragments]):
        assert (a.fid, a.text) == (b.fid, b.text) and torch.equal(a.token_ids, b.token_ids)
        for name in ("keys", "values", "states"):
            for x, y in zip(parts(getattr(a, name)), parts(getattr(b, name)), strict=True):
                torch.testing.assert_close(y, x, atol=atol, rtol=1e-5)
        torch.testing.assert_close(b.self_info, a.self_info, atol=atol, rtol=1e-5)     # inf at the first position


def test_each_fragment_of_a_batch_is_its_solo_prefill(family_model, tokenizer, monkeypatch):
    """Fragments of different lengths in one right-padded forward: keys, values, layer inputs and
    self-information each equal to the fragment's forward alone, on every family (sliding windows included)."""
    batched_equals_solo(family_model, tokenizer, "shared_sink", monkeypatch)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("formation", ["reference", "own_bos", "shared_prefix"])
def test_every_formation_batches_as_it_forms_alone(family, tokenizer, formation, monkeypatch):
    """The first fragment's own special tokens (reference), a kept sink (own_bos), a header (shared_prefix)."""
    batched_equals_solo(tiny_model(family), tokenizer, formation, monkeypatch)


def batched_equals_solo(model, tokenizer, formation, monkeypatch) -> None:
    seen = forwards(monkeypatch)
    solo = stored(model, tokenizer, formation, "solo")
    alone, seen[:] = list(seen), []
    batched = stored(model, tokenizer, formation, "batched")
    assert seen == [[rows[0] for rows in alone]]                 # one forward for all of them
    assert_same(solo, batched)


def test_a_batch_stays_within_its_padded_positions(llama, tokenizer, monkeypatch):
    """rows x the longest row <= batch_tokens; a fragment longer than that alone, as it was."""
    solo = stored(llama, tokenizer, "shared_sink", "solo")
    seen = forwards(monkeypatch)
    batched = stored(llama, tokenizer, "shared_sink", "batched", batch_tokens=60)
    assert len(seen) > 1 and any(len(rows) > 1 for rows in seen)
    assert all(len(rows) * max(rows) <= 60 for rows in seen if len(rows) > 1)
    assert [65] in seen                                          # the long fragment: 64 ids and the sink
    assert sum(map(len, seen)) == len(TEXTS)
    assert_same(solo, batched)


def test_fragments_served_already_are_not_formed_again(llama, tokenizer, monkeypatch):
    """A batch leaves out what `reuse` holds (the distractors of an earlier group) and a text announced twice."""
    reuse = {}
    stored(llama, tokenizer, "shared_sink", "batched", texts=TEXTS[:3], reuse=reuse)
    seen = forwards(monkeypatch)
    texts = ["a new target", *TEXTS[1:3], "a new target", TEXTS[4]]
    solo = stored(llama, tokenizer, "shared_sink", "solo", texts=texts)
    seen.clear()
    batched = stored(llama, tokenizer, "shared_sink", "batched", texts=texts, reuse=reuse)
    assert seen == [[13, 65], [13]]         # the target with the unseen distractor; the target's repeat (announced
                                            # twice, not kept for reuse the first time) formed again at its store
    assert_same(solo, batched)


def test_unannounced_texts_and_solo_formation_form_one_per_forward(llama, tokenizer, monkeypatch):
    seen = forwards(monkeypatch)
    stored(llama, tokenizer, "shared_sink", "solo")
    former, memory = Former(llama, tokenizer, batch="batched"), LatentMemory()
    for text in TEXTS:
        former.store(memory, text)
    assert all(len(rows) == 1 for rows in seen) and len(seen) == 2 * len(TEXTS)


def test_a_bad_setting_is_named(llama, tokenizer):
    with pytest.raises(ValueError, match="formation_batch='pairs'"):
        Former(llama, tokenizer, batch="pairs")


def records(folder) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k != "seconds"}
            for line in (folder / "predictions.jsonl").read_text().splitlines()]


def test_a_batched_run_answers_as_the_solo_run(tmp_path, tiny_checkpoint, monkeypatch):
    """The whole harness on the tiny checkpoint, every group forming every fragment (reuse_formed=false), with
    forgetting by self-information: the same records, answers token for token, ranks and evictions included."""
    options = ("method=memdefrag_top2", "forgetting=informativeness", "model.memory_capacity=200",
               "reuse_formed=false", "task.groups=1", "task.updates=4")
    run(tiny_run_config(tiny_checkpoint, *options, "formation_batch=solo"), str(tmp_path / "solo"))
    seen = forwards(monkeypatch)
    run(tiny_run_config(tiny_checkpoint, *options, "formation_batch=batched"), str(tmp_path / "batched"))
    assert any(len(rows) > 1 for rows in seen)
    assert records(tmp_path / "batched") == records(tmp_path / "solo")
    assert json.loads((tmp_path / "batched" / "run.json").read_text())["formation_batch"] == "batched"
    assert json.loads((tmp_path / "solo" / "run.json").read_text())["formation_batch"] == "solo"
