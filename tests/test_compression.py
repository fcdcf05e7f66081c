"""Compression before formation: the asked share of every fragment's tokens is kept, in order, the same
every time; it composes with forgetting and with both backends; bad settings are refused."""

import json

import pytest
import torch

from harness.runner import run
from methods.compression import NoCompression, kept_count
from methods.forgetting import Informativeness
from methods.hidden_prefix import HiddenPrefixBackend
from methods.kv_prefix import KVPrefixBackend
from methods.self_information import SelfInformation, self_information
from methods.session import Session
from methods.vanilla import Vanilla
from tests.conftest import FRAGMENTS, tiny_run_config


@pytest.mark.parametrize("rate", [0.3, 0.5, 0.8, 1.0])
def test_self_information_keeps_the_share_in_order_and_the_most_informative(llama, tokenizer, rate):
    for text in FRAGMENTS:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        kept = SelfInformation(rate).compress(text, llama, tokenizer)
        assert abs(len(kept) - rate * len(ids)) <= 1 and len(kept) == kept_count(len(ids), rate)
        assert kept == SelfInformation(rate).compress(text, llama, tokenizer)       # deterministic
        positions = SelfInformation(rate).positions(ids, llama, tokenizer)
        assert [ids[p] for p in positions] == kept and positions == sorted(positions)
        chosen = torch.zeros(len(ids), dtype=torch.bool)
        chosen[positions] = True
        info = self_information(llama, tokenizer, ids)
        if not chosen.all():
            assert info[chosen].min() >= info[~chosen].max()


def test_no_compression_forms_the_text_as_it_is(llama, tokenizer):
    assert NoCompression()("any text", llama, tokenizer) is None


@pytest.mark.parametrize("rate", [0, -0.5, 1.5, True])
def test_a_rate_outside_zero_to_one_is_refused(rate):
    with pytest.raises(ValueError, match="compression.rate=.* must lie in"):
        SelfInformation(rate)


def test_compressed_memory_composes_with_forgetting_and_both_backends(llama, tokenizer):
    compressor = SelfInformation(0.5)
    sessions = {}
    for name, backend in (("fast", KVPrefixBackend(llama)), ("hidden", HiddenPrefixBackend(llama))):
        session = Session(llama, tokenizer, backend, Vanilla(), "shared_sink", "plain", 6,
                          forgetting=Informativeness(capacity=40), compressor=compressor)
        for text in FRAGMENTS:
            session.store(text)
        sessions[name] = session
    fast, hidden = sessions["fast"], sessions["hidden"]
    assert [log["kept"] for log in fast.compressed] == \
        [kept_count(len(tokenizer(t, add_special_tokens=False)["input_ids"]), 0.5) for t in FRAGMENTS]
    assert fast.memory.n_tokens <= 40 < sum(log["kept"] for log in fast.compressed)      # forgetting ran
    assert [len(f) for f in fast.memory.fragments] == [len(f) for f in hidden.memory.fragments]
    prompt = torch.tensor(tokenizer("where is the cat?", add_special_tokens=False)["input_ids"])
    fast_logits, *_ = fast.backend.prefill(fast.memory, prompt)
    hidden_logits, *_ = hidden.backend.prefill(hidden.memory, prompt)
    torch.testing.assert_close(fast_logits, hidden_logits, atol=1e-4, rtol=0)
    assert fast.ask("where is the cat?").text == hidden.ask("where is the cat?").text


def test_a_compressed_run_records_the_compressor_and_the_share_it_kept(tmp_path, tiny_checkpoint):
    cfg = tiny_run_config(tiny_checkpoint, "compression=self_information", "compression.rate=0.4",
                          "method=memdefrag_top2")
    run(cfg, str(tmp_path))
    info = json.loads((tmp_path / "run.json").read_text())["compression"]
    assert info["compressor"] == "self_information" and info["rate"] == 0.4
    assert info["fragments"] == 4 * 3 and abs(info["kept_share"] - 0.4) < 0.02
    assert all(abs(f["kept"] - 0.4 * f["tokens"]) <= 1 for f in info["per_fragment"])
    records = [json.loads(line) for line in (tmp_path / "predictions.jsonl").read_text().splitlines()]
    assert all("compression" in r["seconds"] for r in records)
