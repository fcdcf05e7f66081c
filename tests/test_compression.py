"""Compression before formation: the asked share of every fragment's tokens is kept, in order, the same
every time; it composes with forgetting and with both backends; bad settings are refused."""

import json

import pytest
import torch

from harness.running.runner import run
from methods.compression.compressor import NoCompression, kept_count
from methods.forgetting import Informativeness
from methods.backends.hidden_prefix import HiddenPrefixBackend
from methods.backends.kv_prefix import KVPrefixBackend
from methods.compression.llmlingua import LLMLingua, segment_quotas
from methods.compression.llmlingua2 import LLMLingua2, owners, select_words
from methods.compression.self_information import SelfInformation, self_information
from methods.session import Session
from methods.baselines import Vanilla
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


@pytest.mark.parametrize("rate", [0.3, 0.5, 0.8, 1.0])
@pytest.mark.parametrize("segment_tokens", [4, 7, 1000])
def test_llmlingua_keeps_the_share_in_order_scoring_each_segment_after_what_was_kept(llama, tokenizer, rate,
                                                                                      segment_tokens):
    compressor = LLMLingua(rate, segment_tokens=segment_tokens)
    for text in FRAGMENTS:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        positions = compressor.positions(ids, llama, tokenizer)
        assert len(positions) == kept_count(len(ids), rate) and positions == sorted(set(positions))
        assert compressor.compress(text, llama, tokenizer) == [ids[p] for p in positions]
        assert LLMLingua(rate, segment_tokens=segment_tokens).compress(text, llama, tokenizer) == \
            compressor.compress(text, llama, tokenizer)                                   # deterministic
        if segment_tokens >= len(ids):      # one segment: the fragment's own self-information decides
            assert positions == SelfInformation(rate).positions(ids, llama, tokenizer)
    # a later segment is scored after the compressed text, not the original one
    ids = tokenizer(FRAGMENTS[0], add_special_tokens=False)["input_ids"]
    first = LLMLingua(0.5, segment_tokens=4).positions(ids, llama, tokenizer)
    kept_first = [p for p in first if p < 4]
    info = self_information(llama, tokenizer, [ids[p] for p in kept_first] + ids[4:8])[len(kept_first):]
    expected = sorted(4 + i for i in (-info).sort(stable=True).indices[:len([p for p in first if 4 <= p < 8])])
    assert [p for p in first if 4 <= p < 8] == expected


def test_segment_quotas_add_up_to_the_kept_count():
    for tokens in (1, 5, 17, 100, 513):
        for kept in {1, tokens // 3 or 1, tokens}:
            for segment in (1, 4, 50, 1000):
                quotas = segment_quotas(tokens, kept, segment)
                lengths = [min(segment, tokens - s) for s in range(0, tokens, segment)]
                assert sum(quotas) == kept and all(0 <= q <= n for q, n in zip(quotas, lengths))


def test_llmlingua_scores_with_another_local_model_and_reads_its_text_back(llama, tokenizer, tiny_checkpoint):
    compressor = LLMLingua(0.5, model=tiny_checkpoint, segment_tokens=5)
    compressor.check()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    scorer, scorer_tokenizer = AutoModelForCausalLM.from_pretrained(tiny_checkpoint), \
        AutoTokenizer.from_pretrained(tiny_checkpoint)
    as_own_model = LLMLingua(0.5, segment_tokens=5).compress(FRAGMENTS[1], scorer, scorer_tokenizer)
    assert compressor.compress(FRAGMENTS[1], llama, tokenizer) == \
        tokenizer(scorer_tokenizer.decode(as_own_model), add_special_tokens=False)["input_ids"]
    assert compressor.describe()["model"] == tiny_checkpoint


def test_llmlingua_refuses_a_scoring_model_it_cannot_have_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="compression.model='nobody/missing' is neither a folder"):
        LLMLingua(0.5, model="nobody/missing").check()


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


@pytest.fixture(scope="module")
def tiny_llmlingua2(tmp_path_factory):
    """A tiny random LLMLingua-2 classifier (XLM-R shape, sentencepiece-style tokenizer): plumbing only,
    its choices are noise."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast, XLMRobertaConfig, XLMRobertaForTokenClassification

    from evals.synthetic import generate

    folder = tmp_path_factory.mktemp("llmlingua2") / "tiny-xlm-roberta-large"
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer, bpe.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    bpe.train_from_iterator([t.context for t in generate(0).targets[:100]],
                            trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "<pad>", "</s>", "<unk>"]))
    bpe.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                        unk_token="<unk>", cls_token="<s>", sep_token="</s>")
    torch.manual_seed(0)
    config = XLMRobertaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                              intermediate_size=64, max_position_embeddings=600, num_labels=2, pad_token_id=1,
                              bos_token_id=0, eos_token_id=2)
    XLMRobertaForTokenClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def test_words_are_taken_by_probability_while_they_fit_then_part_of_the_best_left():
    assert select_words([2, 1, 3, 1], [0.9, 0.1, 0.8, 0.5], 4) == {0: 2, 3: 1, 1: 1}   # 3 tokens do not fit in 2
    assert select_words([3, 3], [0.2, 0.7], 2) == {1: 2}                                # no whole word fits
    assert select_words([1, 1, 1], [0.5, 0.5, 0.5], 2) == {0: 1, 1: 1}                  # ties: the earlier word
    assert select_words([2, 2], [0.1, 0.2], 4) == {1: 2, 0: 2}


def test_tokens_belong_to_the_word_they_overlap_most_and_white_space_to_the_next():
    #        "ab cd\nef":  words ab (0-2), cd (3-5), ef (6-8)
    words = [(0, 2), (3, 5), (6, 8)]
    assert owners([(0, 1), (1, 2), (2, 5), (5, 6), (6, 8)], words, 8) == [0, 0, 1, 2, 2]
    assert owners([(1, 4)], words, 8) == [0]                                             # tie: the earlier
    assert owners([(8, 9)], words, 9) == [2]                                             # trailing: the last


@pytest.mark.parametrize("rate", [0.3, 0.6, 1.0])
def test_llmlingua2_keeps_the_exact_share_of_the_memory_tokens_in_order(tiny_llmlingua2, tiny_checkpoint, rate):
    from transformers import AutoTokenizer

    from evals.synthetic import generate

    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    compressor = LLMLingua2(rate, tiny_llmlingua2)
    compressor.check()
    for text in generate(0).unrelated[:4]:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        kept = compressor.compress(text, None, tokenizer)
        assert len(kept) == kept_count(len(ids), rate)
        assert kept == LLMLingua2(rate, tiny_llmlingua2).compress(text, None, tokenizer)   # deterministic
        rest = iter(ids)                                                                    # in order
        assert all(token in rest for token in kept)
        # the classifier's most probable words are the ones kept
        spans, probs = compressor.words(text)
        kept_text = tokenizer.decode(kept)
        best = max(range(len(spans)), key=lambda w: probs[w])
        assert text[slice(*spans[best])].strip() in kept_text


def test_llmlingua2_refuses_a_classifier_it_cannot_have_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="neither a folder here nor in the Hugging Face cache"):
        LLMLingua2(0.5, "nobody/xlm-roberta-large-missing").check()


def test_an_llmlingua2_run_goes_end_to_end(tmp_path, tiny_checkpoint, tiny_llmlingua2):
    cfg = tiny_run_config(tiny_checkpoint, "compression=llmlingua2", "compression.rate=0.5",
                          f"compression.model={tiny_llmlingua2}", "method=memdefrag_top2", "task.groups=2")
    run(cfg, str(tmp_path))
    info = json.loads((tmp_path / "run.json").read_text())["compression"]
    assert info["compressor"] == "llmlingua2" and info["model"] == tiny_llmlingua2
    assert info["fragments"] == 2 * 3 and 0 < info["kept_share"] < 1


@pytest.mark.parametrize("task", ["task=longbench", "task=probe"])
def test_every_task_that_stores_fragments_stores_them_compressed(tmp_path, tiny_checkpoint, task):
    overrides = ["task.groups=1", "task.max_tokens=100000"] if task == "task=longbench" else \
        ["task.groups=1", "task.fragments=3", "task.layers=[0,1]"]
    cfg = tiny_run_config(tiny_checkpoint, task, *overrides, "compression=self_information", "compression.rate=0.5",
                          "method=vanilla", small_task=False)
    run(cfg, str(tmp_path))
    info = json.loads((tmp_path / "run.json").read_text())["compression"]
    assert info["fragments"] > 2 and abs(info["kept_share"] - 0.5) < 0.02
