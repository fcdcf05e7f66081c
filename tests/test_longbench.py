"""LongBench: chunking rules worked out by hand on a tokenizer of one token per character, the JSONL and
parquet loaders on fixture files in the official format, the embedded set, and whole runs."""

import json
import re
import shutil
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from evals import synthetic_long
from evals.longbench import (LongBench, scores_by_subset, split_fixed, split_passages, split_sentences,
                             truncate_middle)
from evals.metrics import METRICS
from harness.errors import ConfigError
from harness.plugins.contracts import answer_budget
from harness.results.folder import read_jsonl
from harness.running.runner import run
from tests.conftest import tiny_run_config

FIXTURES = Path(__file__).parent / "testdata"


@pytest.fixture(scope="module")
def chars():
    """A fast tokenizer with one token per (ASCII) character and offsets, so token counts are character counts."""
    bpe = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))},
                               merges=[]))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    bpe.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=bpe)


def test_passages_split_at_every_delimiter_and_keep_the_text_before():
    context = "Intro.\nPassage 1:\nA one.\nPassage 2:\nB two.\nPassage: 3:\nC.\n"
    assert split_passages(context) == ["Intro.\n", "Passage 1:\nA one.\n", "Passage 2:\nB two.\n", "Passage: 3:\nC.\n"]
    assert split_passages("  \nPassage 1:\nA.\n") == ["Passage 1:\nA.\n"]       # a blank head is dropped
    assert split_passages("no delimiter here.") == ["no delimiter here."]


def test_sentence_chunks_end_at_the_first_boundary_past_the_size_and_a_short_tail_joins_the_last(chars):
    context = "aaaa. bb. cc. dddddddd. e."          # sentence ends after 5, 9, 13, 23, 26 characters
    # 8: the first end at or past 8 is 9, then at or past 17 is 23; the tail " e." (3 < 8) joins the last chunk
    assert split_sentences(context, chars, 8) == ["aaaa. bb.", " cc. dddddddd. e."]
    # 3: every sentence reaches 3 tokens, the tail " e." too, so it stays a chunk of its own
    assert split_sentences(context, chars, 3) == ["aaaa.", " bb.", " cc.", " dddddddd.", " e."]
    assert split_sentences("ab\ncd", chars, 2) == ["ab\n", "cd"]       # a newline ends a sentence too
    assert split_sentences("abcdef", chars, 2) == ["abcdef"]           # no boundary: one chunk
    assert split_sentences(context, chars, 100) == [context]


def test_fixed_chunks_and_middle_truncation(chars):
    assert split_fixed("abcdefghij", chars, 4) == ["abcd", "efgh", "ij"]
    assert split_fixed("abc", chars, 4) == ["abc"]
    assert truncate_middle("abcdefghij", chars, 4) == "abij"
    assert truncate_middle("abcdefghij", chars, 5) == "abhij"
    assert truncate_middle("abc", chars, 4) == "abc"


@pytest.fixture
def data_dir(tmp_path):
    shutil.copytree(FIXTURES / "longbench", tmp_path / "longbench")
    return tmp_path


def test_jsonl_and_parquet_files_load_in_the_official_format(data_dir, chars):
    task = LongBench("longbench", str(data_dir), subsets=["hotpotqa", "qasper"], chunk_tokens=40, prompt="longbench")
    task.check()
    items = task.groups(chars)
    assert [(i.index, i.subset, i.id) for i in items] == [(0, "hotpotqa", "hp-1"), (1, "hotpotqa", "hp-2"),
                                                         (2, "qasper", "qa-1")]
    assert items[1].answers == ("Quenby", "Quenby harbour")
    assert [c.split("\n")[1] for c in items[0].chunks] == ["Orin river", "Velmora", "Sea otters"]    # passages
    record = read_jsonl(data_dir / "longbench" / "data" / "hotpotqa.jsonl")[0]
    assert "".join(items[0].chunks) == record["context"]
    qasper = items[2].chunks                                             # sentences of >= 40 tokens
    assert len(qasper) > 2 and all(len(c) >= 40 and c.endswith((".", "\n", ". ")) for c in qasper[:-1])
    assert task.question(items[0]) == ("Answer briefly.\nQuestion: Which town is the Orin river in?\nAnswer:", "raw")
    assert task.answer_lengths == {"hotpotqa": 32, "qasper": 128}


def test_too_long_contexts_are_skipped_or_cut_in_the_middle(data_dir, chars):
    skip = LongBench("longbench", str(data_dir), subsets=["hotpotqa"], max_tokens=150)
    assert [i.id for i in skip.groups(chars)] == ["hp-2"]                # hp-1 holds 226 characters
    cut = LongBench("longbench", str(data_dir), subsets=["hotpotqa"], max_tokens=150, overflow="truncate")
    first = cut.groups(chars)[0]
    assert first.context_tokens == 226 and sum(len(c) for c in first.chunks) == 150
    assert LongBench("longbench", str(data_dir), subsets=["hotpotqa"], groups=1).groups(chars)[0].id == "hp-1"


def test_skipped_and_cut_items_are_counted_per_subset_in_the_log_run_json_and_the_table(data_dir, chars, caplog):
    for overflow, counts in (("skip", {"items": 1, "skipped": 1, "truncated": 0}),
                             ("truncate", {"items": 2, "skipped": 0, "truncated": 1})):
        task = LongBench("longbench", str(data_dir), subsets=["hotpotqa"], max_tokens=150, overflow=overflow)
        with caplog.at_level("WARNING"):
            items = task.groups(chars)
        assert task.describe()["subsets"] == {"hotpotqa": counts}
        assert "longbench hotpotqa: 1 items longer than task.max_tokens=150" in caplog.text
        records = [{"subset": i.subset, "truncated": i.truncated, "subset_skipped": i.subset_skipped,
                    "target_rank": 1, "chunks": 1, "memory_tokens": 1, **dict.fromkeys(METRICS, 0.0)} for i in items]
        row = scores_by_subset(records).iloc[0]
        assert (row["items"], row["skipped"], row["truncated"]) == (counts["items"], counts["skipped"],
                                                                    counts["truncated"])


def test_prompts(data_dir, chars):
    item = LongBench("longbench", str(data_dir), subsets=["hotpotqa"]).groups(chars)[1]
    plain = LongBench("longbench", str(data_dir), subsets=["hotpotqa"], prompt="plain")
    chat = LongBench("longbench", str(data_dir), subsets=["hotpotqa"], prompt="chat")
    assert plain.question(item) == ("Question: What is the capital of Velmora?\nAnswer:", "raw")
    assert chat.question(item) == ("Answer briefly.\nQuestion: What is the capital of Velmora?\nAnswer:", "chat")


@pytest.mark.parametrize("change, message", [
    ({"subsets": ["hotpotqa", "nosuch"]}, "task.subsets=['hotpotqa', 'nosuch'] must name some of"),
    ({"subsets": ["musique"]}, "task.subsets: no data for 'musique'"),
    ({"chunk_tokens": 0}, "task.chunk_tokens=0 must be an integer >= 1"),
    ({"overflow": "wrap"}, "task.overflow='wrap' is not one of ['skip', 'truncate']"),
    ({"max_new_tokens": None, "subsets": ["hotpotqa"], "maxlen": {}}, "has no entry for ['hotpotqa']"),
    ({"max_new_tokens": None, "subsets": ["hotpotqa"], "maxlen": {"hotpotqa": -5}},
     "dataset2maxlen.json: 'hotpotqa'=-5 must be an integer >= 1"),
    ({"max_new_tokens": None, "subsets": ["hotpotqa"], "maxlen": {"hotpotqa": "32"}},
     "dataset2maxlen.json: 'hotpotqa'='32' must be an integer >= 1"),
    ({"max_new_tokens": None, "subsets": ["hotpotqa"], "maxlen": ["hotpotqa"]},
     "dataset2maxlen.json must hold a JSON object, one entry per subset"),
    ({"prompt": "longbench", "subsets": ["hotpotqa"], "prompts": {"hotpotqa": "{context} Answer the question."}},
     "dataset2prompt.json: 'hotpotqa' must be a string holding {context} and {input} and no other field"),
    ({"prompt": "longbench", "subsets": ["hotpotqa"], "prompts": {"hotpotqa": "{context} {input} {source}"}},
     "dataset2prompt.json: 'hotpotqa' must be a string holding"),
    ({"prompt": "chat", "subsets": ["hotpotqa"], "prompts": {"hotpotqa": 3}},
     "dataset2prompt.json: 'hotpotqa' must be a string holding"),
])
def test_bad_settings_are_refused(data_dir, change, message):
    for key, name in (("maxlen", "dataset2maxlen.json"), ("prompts", "dataset2prompt.json")):
        if key in change:
            (data_dir / "longbench" / name).write_text(json.dumps(change.pop(key)))
    with pytest.raises(ConfigError, match=re.escape(message)):
        LongBench("longbench", str(data_dir), **{"subsets": ["hotpotqa", "qasper"], **change}).check()


@pytest.mark.parametrize("key, value, message", [
    ("groups", 2.5, "task.groups=2.5 must be an integer >= 1, or null"),
    ("groups", 0, "task.groups=0 must be an integer >= 1, or null"),
    ("max_new_tokens", True, "task.max_new_tokens=True must be an integer >= 1, or null"),
    ("max_new_tokens", "a", "task.max_new_tokens='a' must be an integer >= 1, or null"),
    ("max_tokens", None, "task.max_tokens=None must be an integer >= 1"),
    ("chunk_tokens", 8.0, "task.chunk_tokens=8.0 must be an integer >= 1"),
])
def test_a_count_that_is_no_whole_number_is_refused_in_one_line_naming_it(key, value, message):
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        LongBench(**{key: value})


def test_the_declared_answer_budget_is_the_largest_its_questions_are_asked_with(data_dir):
    """harness.plugins.contracts.answer_budget (the window preflight's) reads the largest budget over the subsets: the
    setting where given, else dataset2maxlen.json's (the fixture: hotpotqa 32, qasper 128; the embedded set: 32)."""
    both = LongBench("longbench", str(data_dir), subsets=["hotpotqa", "qasper"])
    assert both.answer_lengths == {"hotpotqa": 32, "qasper": 128} and answer_budget(both, 32) == 128
    assert answer_budget(LongBench("longbench", str(data_dir), subsets=["hotpotqa"]), 64) == 32
    assert answer_budget(LongBench("longbench", str(data_dir), subsets=["hotpotqa", "qasper"], max_new_tokens=16),
                         32) == 16
    assert answer_budget(LongBench(), 4) == 32


@pytest.mark.parametrize("field, value, message", [
    ("answers", None, "item 0 has no 'answers'"), ("answers", [], "item 0 has no 'answers'"),
    ("context", "  ", "item 0 'context' is empty"), ("input", 3, "item 0 'input' is int, not a string"),
    ("input", "", "item 0 'input' is empty"), ("answers", ["Quenby", 7], "item 0 'answers[1]' is int, not a string"),
    ("input", "where\ud800?", "item 0 'input' is no valid text (a lone surrogate"),
])
def test_bad_items_are_refused(data_dir, field, value, message):
    path = data_dir / "longbench" / "data" / "hotpotqa.jsonl"
    records = read_jsonl(path)
    records[0][field] = value
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(ConfigError, match=re.escape(message)):
        LongBench("longbench", str(data_dir), subsets=["hotpotqa"]).check()


def test_the_embedded_set_is_long_deterministic_and_holds_each_answer_once():
    for subset in synthetic_long.SUBSETS:
        items = synthetic_long.generate(subset, seed=3, items=10)
        assert items == synthetic_long.generate(subset, seed=3, items=10)
        assert items != synthetic_long.generate(subset, seed=4, items=10)
        for item in items:
            assert set(item) == {"input", "context", "answers", "length", "dataset", "language", "all_classes", "_id"}
            [answer] = item["answers"]
            assert item["context"].count(answer) == 1 and answer not in item["input"]
        words = [item["length"] for item in items]
        assert min(words) < 1_200 and max(words) > 7_000            # ~2k to ~15k tokens
    document = synthetic_long.generate("fictional_document", items=5)
    for item in document:                                           # the fact lies mid-way
        where = item["context"].index(item["answers"][0]) / len(item["context"])
        assert 0.35 < where < 0.65
    passages = synthetic_long.generate("fictional_passages", items=1)[0]["context"]
    assert passages.startswith("Passage 1:\n") and len(split_passages(passages)) == synthetic_long.PARAGRAPHS[0]


def test_a_longbench_run_records_every_metric_and_the_answer_chunks_rank(tmp_path, tiny_checkpoint):
    cfg = tiny_run_config(tiny_checkpoint, "task=longbench", "task.groups=1", "task.max_tokens=100000",
                          "method=memdefrag_top2", "model.memory_capacity=null", small_task=False)
    metrics = run(cfg, str(tmp_path))
    assert list(metrics["subset"]) == list(synthetic_long.SUBSETS)
    records = read_jsonl(tmp_path / "predictions.jsonl")
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    for record, item in zip(records, LongBench(groups=1, max_tokens=100000).groups(tokenizer)):
        assert record["chunks"] == len(item.chunks) == len(record["chunk_tokens"])
        assert record["memory_tokens"] == sum(record["chunk_tokens"])
        assert [c for c, text in enumerate(item.chunks) if item.answers[0] in text] == record["answer_chunks"]
        assert 1 <= record["target_rank"] <= record["chunks"]
        assert all(0 <= record[m] <= 100 for m in ("string_match", "f1", "rouge_l", "bertscore"))
        assert record["bertscore_model"] == "minilm" and record["bertscore_rescaled"] is False
        assert {"formation", "trace", "prefill", "decode"} <= record["seconds"].keys()


def test_the_table_gives_every_metric_its_interval_and_f1_against_vanilla_on_the_same_items():
    """Items 0-3: vanilla scores F1 0, 0, 50, 50; Top-2 scores 10 more on each: a certain +10 (every resample).
    Vanilla is found by its method, whatever its row says besides (a mark that it read past the window); with two
    vanilla runs in a set there is no one reference, and the column is empty."""
    from evals.longbench import longbench_table

    rows = (("vanilla (past window)", "vanilla", 0.0), ("memdefrag_top2 (past window)", "memdefrag_top2", 10.0))
    records = [{"subset": "s", "run": run, "method": method, "group": g, "target_rank": 1, "chunks": 1,
                "memory_tokens": 1, **dict.fromkeys(METRICS, 50.0 * (g // 2) + bonus)}
               for run, method, bonus in rows for g in range(4)]
    table = longbench_table(records)
    assert table.loc[("s", "memdefrag_top2 (past window)"), "f1 vs vanilla"] == "+10.0 [+10.0, +10.0]"
    assert table.loc[("s", "vanilla (past window)"), "f1 vs vanilla"] == "reference"
    assert table.loc[("s", "vanilla (past window)"), "f1"] == "25.0 [0.0, 50.0]"
    twice = records + [{**r, "run": "vanilla seed=1"} for r in records if r["method"] == "vanilla"]
    assert set(longbench_table(twice)["f1 vs vanilla"]) == {""}
