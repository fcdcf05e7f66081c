"""The LoCoMo task: LoCoMo's released format read the same way for the real file and the embedded set, every
malformed file refused in one line naming the file, sample and field, the authors' serialization and filter,
each protocol's prompt word for word, and the text baseline cut to the model's window as LoCoMo cuts it."""

import copy
import json
from pathlib import Path

import pytest
import torch
from transformers import PretrainedConfig

from evals import synthetic_dialogue
from evals.locomo import (ABSTAIN, PROTOCOLS, LoCoMo, Question, contains, evidence_sessions, first_line, gold,
                          layers_table, locomo_reply, locomo_table, scores_by_category, serialized)
from harness.errors import ConfigError
from methods.baselines import TextMemory
from methods.formation import Former
from methods.memory import LatentMemory

REAL = Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo" / "locomo10.json"


class Words:
    """One id per whitespace-separated word: token counts that are easy to check."""

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [5] * len(text.split())}


def written(tmp_path, samples) -> str:
    path = tmp_path / "locomo.json"
    path.write_text(json.dumps(samples))
    return str(path)


def test_the_embedded_set_is_locomos_format_with_every_category_and_reads_as_a_file(tmp_path):
    samples = synthetic_dialogue.generate(7)
    assert samples == synthetic_dialogue.generate(7) != synthetic_dialogue.generate(8)
    assert {q["category"] for s in samples for q in s["qa"]} == {1, 2, 3, 4, 5}
    from_file = LoCoMo("locomo", file=written(tmp_path, samples), categories=[1, 2, 3, 4, 5]).groups(Words())
    embedded = LoCoMo("synthetic", categories=[1, 2, 3, 4, 5], seed=42).groups(Words())
    assert [g.sample_id for g in embedded] == [s["sample_id"] for s in synthetic_dialogue.generate(42)]
    assert len(from_file) == len(samples) and all(len(g.questions) == 6 for g in from_file)
    adversarial = [q for q in from_file[0].questions if q.category == 5][0]
    assert adversarial.answer == samples[0]["qa"][2]["adversarial_answer"]


def test_a_session_is_its_date_then_speaker_and_text_per_turn_with_a_photos_caption():
    conversation = synthetic_dialogue.generate(0)[0]["conversation"]
    text = serialized(conversation, 2)
    date = conversation["session_2_date_time"]
    assert text.startswith(f"Session 2 ({date}):\n") and text.endswith("\n\n")
    assert "[shared photo: a photo of a harbour in " in text
    assert all(f"{t['speaker']}: {t['text']}" in text for t in conversation["session_2"])


def test_evidence_ids_as_the_released_file_spells_them():
    assert evidence_sessions(["D3:12", "D8:6; D9:17", "D:11:26", "D9:1 D4:4", "D"]) == (3, 4, 8, 9, 11)
    assert evidence_sessions([]) == ()
    assert first_line("\n  Paris.\nQuestion: and you?") == "Paris."


def test_over_long_conversations_are_skipped_and_counted_and_questions_sampled_with_the_seed():
    samples = synthetic_dialogue.generate(42)
    tokens = [sum(len(serialized(s["conversation"], k).split()) for k in range(1, 9)) for s in samples]
    limit = sorted(tokens)[len(tokens) // 2]                 # one conversation has exactly this many: skipped
    task = LoCoMo("synthetic", max_tokens=limit, questions=1)
    kept = task.groups(Words())
    assert [g.sample_id for g in kept] == [s["sample_id"] for s, n in zip(samples, tokens) if n < limit]
    assert task.describe()["skipped"] == [{"sample_id": s["sample_id"], "tokens": n}
                                          for s, n in zip(samples, tokens) if n >= limit]
    assert all(sorted(q.category for q in g.questions) == [1, 2, 3, 4, 5] for g in kept)   # one per category
    again = LoCoMo("synthetic", max_tokens=limit, questions=1).groups(Words())
    assert [g.questions for g in again] == [g.questions for g in kept]


def test_the_authors_filter_skips_a_conversation_of_exactly_18000_tokens():
    """LoCoMo_benchmark.py keeps `total < max_conv_tokens`: 17,999 tokens stay, 18,000 go."""
    sample = synthetic_dialogue.generate(0, conversations=1)[0]
    words = sum(len(serialized(sample["conversation"], k).split()) for k in range(1, 9))

    class Padded(Words):
        def __init__(self, total):
            self.extra = total - words

        def __call__(self, text, add_special_tokens=True):
            pad = self.extra if text.startswith("Session 1 ") else 0
            return {"input_ids": [5] * (len(text.split()) + pad)}

    task = LoCoMo("synthetic", protocol="authors")
    assert task.max_tokens == 18_000 and task.categories == [4] and task.max_new_tokens == 32
    one = [sample]
    task.samples = lambda: one
    assert [g.tokens for g in task.groups(Padded(17_999))] == [17_999]
    with pytest.raises(ConfigError, match="no conversation under task.max_tokens=18000"):
        task.groups(Padded(18_000))
    assert task.skipped == [{"sample_id": sample["sample_id"], "tokens": 18_000}]


def test_the_sample_of_one_category_does_not_depend_on_the_others_asked():
    """The single-hop questions drawn with all five categories asked are those drawn with category 4 alone
    (the first bare-question runs' sample, paired with the protocol runs)."""
    alone = LoCoMo("synthetic", protocol="authors", questions=1).groups(Words())
    together = LoCoMo("synthetic", questions=[None, None, None, 1, None]).groups(Words())
    assert [[q for q in g.questions if q.category == 4] for g in together] == [list(g.questions) for g in alone]
    assert all(len([q for q in g.questions if q.category == 1]) >= 1 for g in together)   # the rest all asked


BROKEN = [     # (how a valid file is broken, what the one line says)
    (lambda s: {"samples": s}, "must hold a non-empty list of samples"),
    (lambda s: [], "must hold a non-empty list of samples"),
    (lambda s: [*s[:1], "conv"], "sample 1: is not an object"),
    (lambda s: [{**s[0], "sample_id": 3}], "sample 0: field 'sample_id' must be a str"),
    (lambda s: [{k: v for k, v in s[0].items() if k != "qa"}], "sample 0: field 'qa' must be a list"),
    (lambda s: [{**s[0], "conversation": {**s[0]["conversation"], "speaker_b": None}}],
     "sample 'synthetic-0': conversation.speaker_b must be a string"),
    (lambda s: [{**s[0], "conversation": {k: v for k, v in s[0]["conversation"].items()
                                          if not k.startswith("session")}}],
     "sample 'synthetic-0': conversation has no session_<k> list of turns"),
    (lambda s: [{**s[0], "conversation": {**s[0]["conversation"], "session_3": []}}],
     "conversation.session_3 must be a non-empty list of turns"),
    (lambda s: [{**s[0], "conversation": {**s[0]["conversation"], "session_2": [{"speaker": "A"}]}}],
     r"conversation.session_2\[0\] must be a turn with string 'speaker' and 'text'"),
    (lambda s: [{**s[0], "qa": [{"answer": "x", "category": 4}]}], r"qa\[0\].question is NoneType, not a string"),
    (lambda s: [{**s[0], "qa": [{"question": " ", "answer": "x", "category": 4}]}], r"qa\[0\].question is empty"),
    (lambda s: [{**s[0], "qa": [{"question": "q\ud800", "answer": "x", "category": 4}]}],
     r"qa\[0\].question is no valid text \(a lone surrogate"),
    (lambda s: [{**s[0], "qa": [{"question": "q", "answer": "", "category": 4}]}],
     r"qa\[0\]'s answer \(or, category 5, 'adversarial_answer'\) is empty: a non-empty string or a finite number"),
    (lambda s: [{**s[0], "qa": [{"question": "q", "answer": float("nan"), "category": 4}]}],
     r"qa\[0\]'s answer .* is nan, not a finite number"),
    (lambda s: [{**s[0], "qa": [{"question": "q", "answer": "x", "category": True}]}],
     r"qa\[0\].category=True must be one of"),
    (lambda s: [{**s[0], "qa": [{"question": "q", "answer": "x", "category": 4.0}]}],
     r"qa\[0\].category=4.0 must be one of"),
    (lambda s: [{**s[0], "conversation": {("session_01" if k == "session_1" else k): v
                                          for k, v in s[0]["conversation"].items()}}],
     r"conversation key 'session_01': LoCoMo numbers sessions without leading zeros \(session_1\)"),
    (lambda s: [s[0], {**s[1], "sample_id": s[0]["sample_id"]}], "sample_id 'synthetic-0' is given to more than one"),
    (lambda s: [{**s[0], "qa": [{"question": "q", "answer": "x", "category": 6}]}],
     r"qa\[0\].category=6 must be one of \[1, 2, 3, 4, 5\]"),
    (lambda s: [{**s[0], "qa": [{"question": "q", "category": 5}]}],
     r"qa\[0\]'s answer \(or, category 5, 'adversarial_answer'\) is NoneType, not a number"),
    (lambda s: [{**s[0], "qa": [{"question": "q", "answer": "x", "category": 4, "evidence": "D1:2"}]}],
     r"qa\[0\].evidence must be a list of turn ids"),
]


@pytest.mark.parametrize("mutate, says", BROKEN)
def test_a_malformed_file_is_refused_in_one_line_naming_the_file_sample_and_field(tmp_path, mutate, says):
    path = written(tmp_path, mutate(copy.deepcopy(synthetic_dialogue.generate(0, conversations=2))))
    with pytest.raises(ConfigError, match=says) as caught:
        LoCoMo("locomo", file=path).check()
    assert "\n" not in str(caught.value) and str(caught.value).startswith(path)


@pytest.mark.parametrize("contents, says", [
    (None, "is not a file"), ("{not json", "is not valid JSON"), (b"\xff\xfe", "is not UTF-8 text"),
    ("[" * 100_000, "its JSON nests deeper than Python's parser reads")])
def test_an_unreadable_file_is_refused_in_one_line(tmp_path, contents, says):
    path = tmp_path / "locomo.json"
    if isinstance(contents, bytes):
        path.write_bytes(contents)
    elif contents is not None:
        path.write_text(contents)
    with pytest.raises(ConfigError, match=says):
        LoCoMo("locomo", file=str(path)).check()


@pytest.mark.parametrize("options, says", [
    (dict(categories=[0]), r"task.categories=\[0\] must name some of \[1, 2, 3, 4, 5\]"),
    (dict(categories=[]), r"task.categories=\[\] must name some of"),
    (dict(groups=0), "task.groups=0 must be an integer >= 1, or null"),
    (dict(questions=0), "task.questions=0 must be an integer >= 1"),
    (dict(questions=[None, None, None, 0, None]), r"task.questions\[3\]=0 must be an integer >= 1"),
    (dict(questions=["a", 2, 2, 2, 2]), r"task.questions\[0\]='a' must be an integer >= 1, or null"),
    (dict(questions="abc"), "task.questions='abc' must be an integer"), (dict(questions=2.5), "task.questions=2.5"),
    (dict(questions=True), "task.questions=True must be an integer"),
    (dict(questions=[1, 1]), r"task.questions=\[1, 1\] must give one number \(or null\) per category 1-5"),
    (dict(protocol="official"), r"task.protocol='official' is not one of \['locomo', 'authors', 'bare'\]"),
    (dict(dataset="locomo10"), "task.dataset"), (dict(file="x.json"), "set task.dataset=locomo")])
def test_bad_options_are_refused_in_one_line(options, says):
    with pytest.raises(ConfigError, match=says):
        LoCoMo(**options)


@pytest.mark.skipif(not REAL.is_file(), reason="LoCoMo's released file is not beside the project")
def test_the_released_file_reads_whole():
    """Ten conversations, 1,986 questions in the five categories; a category-5 item's adversarial answer."""
    task = LoCoMo("locomo", file=str(REAL), categories=[1, 2, 3, 4, 5], max_tokens=10**6)
    conversations = task.groups(Words())
    assert len(conversations) == 10 and sum(len(c.questions) for c in conversations) == 1986
    assert all(q.evidence for c in conversations for q in c.questions if q.category == 4)


def test_text_cut_to_the_window_keeps_the_latest_whole_lines_and_each_kept_fragments_first_line(llama, tokenizer):
    """As LoCoMo truncates its conversation: whole turns, the latest first, from the verbatim text (not the memory
    after forgetting), a session's date line kept with any of its turns, older sessions dropped."""
    memory = LatentMemory()
    former = Former(llama, tokenizer, "shared_sink", keep_kv=False)
    sessions = ["Session 1 (May):\nA: one\nB: two\n\n", "Session 2 (June):\nA: three\nB: four four\n\n",
                "Session 3 (July):\nA: five\nB: six\n\n"]
    for text in sessions:
        former.store(memory, text)
    memory.keep(2, torch.arange(3))                       # forgetting left three tokens of session 3
    window = llama.config.max_position_embeddings
    method = TextMemory(fit_window=True, answer_room=64)
    method.with_tokenizer(tokenizer)
    backend = type("Backend", (), {"model": llama})()

    def cut(room):                                        # the text kept when `room` tokens are free for it
        prompt = torch.arange(window - 64 - memory.sink_length - room)
        ids = method.plan(memory, prompt, backend).text_ids
        assert torch.equal(ids[: memory.sink_length], memory.text_ids()[: memory.sink_length])
        return ids[memory.sink_length:].tolist()

    def ids(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    everything = "".join(sessions)
    assert cut(len(everything)) == ids(everything)                                  # verbatim, all of it
    latest = "Session 2 (June):\nB: four four\n\n" + sessions[2]
    assert cut(len(latest)) == ids(latest) and cut(len(latest) + 5) == ids(latest)   # no part of a turn
    assert cut(len("Session 3 (July):\n") + 2) == ids("Session 3 (July):\n\n")      # the date line, the blank
    assert cut(3) == []
    assert torch.equal(TextMemory().plan(memory, torch.arange(5), backend).text_ids, memory.text_ids())
    undeclared = type("Backend", (), {"model": type("M", (), {"config": PretrainedConfig()})})   # ALiBi, say
    uncut = method.plan(memory, torch.arange(5), undeclared)                           # no positions: nothing cut
    assert uncut.text_ids[memory.sink_length:].tolist() == ids(everything)


def test_each_protocol_asks_as_its_source_does(tokenizer):
    """LoCoMo's QA prompt (its instruction, the category-2 date hint, category 5 as an (a)/(b) choice in
    seeded random order) and the authors' bare question; the style each is read in."""
    locomo, authors = PROTOCOLS["locomo"], PROTOCOLS["authors"]
    frame = ("\nBased on the above conversations, write a short answer for the following question in a few words. "
             "Do not write complete and lengthy sentences. Answer with exact words from the conversations "
             "whenever possible.\n\nQuestion: {}\n")
    single = Question("Where did Caroline move from?", "Sweden", 4, (1,))
    temporal = Question("When did Melanie paint a sunrise?", "2022", 2, (1,))
    assert locomo.ask(single, "42:conv-26") == (frame.format("Where did Caroline move from?"), None)
    assert locomo.ask(temporal, "42:conv-26")[0] == frame.format(
        "When did Melanie paint a sunrise? Use DATE of CONVERSATION to answer with an approximate date.")
    orders = set()
    for index in range(20):
        asked, options = locomo.ask(Question("Is Oscar Melanie's pet?", "Yes", 5, (13,), index), "42:conv-26")
        assert asked == frame.format(f"Is Oscar Melanie's pet? (a) {options['a']} (b) {options['b']}. "
                                     f"Select the correct answer by writing (a) or (b).")
        assert sorted(options.values()) == sorted([ABSTAIN, "Yes"])
        assert locomo.ask(Question("Is Oscar Melanie's pet?", "Yes", 5, (13,), index), "42:conv-26")[1] == options
        orders.add(options["a"])
    assert orders == {ABSTAIN, "Yes"}                      # both orders occur
    assert authors.ask(single, "42:conv-26") == ("Where did Caroline move from?", None)
    assert authors.ask(Question("Is Oscar Melanie's pet?", "Yes", 5, (13,)), "s") == ("Is Oscar Melanie's pet?",
                                                                                        None)
    assert (locomo.answer_tokens, authors.answer_tokens) == (50, 32)
    bare = PROTOCOLS["bare"]
    assert locomo.prompt_style(tokenizer, "plain") == "raw" and authors.prompt_style(tokenizer, "chat") == "plain"
    chat = type("Chat", (), {"chat_template": "{{ messages }}"})()
    assert locomo.prompt_style(chat, "plain") == "chat" and authors.prompt_style(chat, "chat") == "plain"
    assert bare.prompt_style(chat, "chat") == "chat" and bare.prompt_style(tokenizer, "plain") == "plain"
    assert bare.ask(single, "s") == ("Where did Caroline move from?", None) and bare.max_tokens is None


def test_an_a_or_b_reply_is_mapped_to_its_option_and_other_replies_cleaned_as_locomo_does():
    options = {"a": "Yes", "b": ABSTAIN}
    assert locomo_reply("(A) Yes, he is.", options) == "Yes"
    assert locomo_reply("b", options) == ABSTAIN and locomo_reply("(b)", options) == ABSTAIN
    assert locomo_reply("I think (a) is right", {"a": ABSTAIN, "b": "Yes"}) == ABSTAIN
    assert locomo_reply("Answer: (a) Paris", None) == "paris"
    assert locomo_reply("Florida)", None) == "florid"            # LoCoMo removes `a)` wherever it stands
    assert PROTOCOLS["authors"].reply("Paris.", None) == "Paris."


def test_gold_and_substring_accuracy_per_category():
    both = {"question": "Is Oscar Melanie's pet?", "adversarial_answer": "Yes", "answer": "No", "category": 5}
    assert gold(both) == "Yes" and gold({"question": "q", "answer": 2022, "category": 2}) == "2022"
    assert contains("she went in may", "May; she likes spring", 3) and not contains("spring", "May; spring", 3)
    assert contains("rome and paris", "Paris, Rome", 1) and not contains("paris", "Paris, Rome", 1)
    assert contains("it was in paris", "Paris", 4) and contains("x", "Yes", 5) is None


def test_the_table_has_a_row_per_run_and_category_with_intervals():
    records = [{"run": run, "sample_id": "c", "category": c, "f1": f, "f1_authors": f / 2, "correct": f == 1.0,
                "target_rank": 1, "target_read": f > 0,
                "seconds": {"formation": 5.0, "index": 2.0, "trace": 0.5, "prefill": 1.0}}
               for run, c, f in [("vanilla", 4, 1.0), ("vanilla", 4, 0.0), ("vanilla", 2, 0.5),
                                 ("memdefrag_top2", 4, 1.0), ("memdefrag_top2", 4, 1.0)]]
    table = locomo_table(records)
    assert list(table.index) == [(2, "vanilla"), (4, "vanilla"), (4, "memdefrag_top2")]
    row = table.loc[(4, "vanilla")]
    assert row["f1"].startswith("50.0 [") and row["accuracy"].startswith("50.0 [") and row["n"] == 2
    assert row["f1 authors"] == 25.0 and row["evidence hit"] == 50.0 and row["s/question"] == 1.5
    assert row["ranked by"] == "density"


def test_the_f1_interval_resamples_conversations_not_questions():
    """Two conversations, one all right, one all wrong: resampling conversations gives [0, 100]; resampling
    the questions one by one would give a narrow interval around 50."""
    records = [{"sample_id": conv, "category": 4, "f1": f, "correct": f == 1.0, "target_rank": None,
                "seconds": {}} for conv, f in [("a", 1.0)] * 10 + [("b", 0.0)] * 10]
    row = scores_by_category(records).iloc[0]
    assert (row["f1"], row["f1 low"], row["f1 high"]) == (50.0, 0.0, 100.0)


def test_the_rank_column_says_what_ranked():
    """A retriever's own rank is labelled by the retriever, attention density's as density."""
    records = [{"run": run, "sample_id": "c", "category": 4, "f1": 0.0, "correct": False, "target_rank": rank,
                "ranked_by": by, "seconds": {}}
               for run, rank, by in [("bm25", 1, "bm25"), ("top2", 3, "density"), ("vanilla", None, "density")]]
    table = locomo_table(records)
    assert table.loc[(4, "bm25"), "ranked by"] == "bm25" and table.loc[(4, "top2"), "ranked by"] == "density"
    assert table.loc[(4, "vanilla"), "ranked by"] == ""


def test_a_retrievers_run_says_in_its_records_and_summary_that_the_retriever_ranked(tmp_path, tiny_checkpoint):
    """method=select method.ranker=bm25 on task=locomo: the evidence rank is BM25's, and the run's own summary
    (its metrics.csv, the console's) says so, not "density"."""
    from harness.running.runner import run
    from tests.conftest import tiny_run_config

    cfg = tiny_run_config(tiny_checkpoint, "task=locomo", "method=select", "method.ranker=bm25", "task.groups=1",
                          small_task=False)
    metrics = run(cfg, str(tmp_path))
    records = [json.loads(line) for line in (tmp_path / "predictions.jsonl").read_text().splitlines()]
    assert {r["ranked_by"] for r in records} == {"bm25"}
    assert set(metrics.loc[metrics["evidence rank"].notna(), "ranked by"]) == {"bm25"}


@pytest.mark.slow
@pytest.mark.parametrize("method", ["none", "text", "text_window", "vanilla", "memdefrag_top2", "select", "ape",
                                    "epic", "cacheblend", "memoryllm_defrag", "mplus_defrag"])
def test_every_method_answers_the_embedded_dialogues(tmp_path, request, method):
    """Every method end to end on task=locomo (the embedded set, every category): a record per question with
    LoCoMo's score; the methods that choose fragments say whether they read an evidence session."""
    from harness.running.runner import run
    from tests.conftest import tiny_run_config

    own = {"memoryllm_defrag": "tiny_memoryllm", "mplus_defrag": "tiny_mplus"}
    checkpoint = request.getfixturevalue(own.get(method, "tiny_checkpoint"))
    extra = ["backend=hidden_prefix"] if method in own else []
    cfg = tiny_run_config(checkpoint, "task=locomo", f"method={method}", "task.groups=1",
                          "task.categories=[1,2,3,4,5]", *extra, small_task=False)
    metrics = run(cfg, str(tmp_path))
    assert sorted(metrics["category"]) == [1, 2, 3, 4, 5]
    records = [json.loads(line) for line in (tmp_path / "predictions.jsonl").read_text().splitlines()]
    assert len(records) == 6 and all(0 <= r["f1"] <= 1 for r in records)
    choosers = ("memdefrag_top2", "select", "memoryllm_defrag", "mplus_defrag")     # read some fragments only
    assert all(("target_read" in r) == (method in choosers) for r in records), [r.keys() for r in records]


def test_traced_layers_give_the_evidence_rank_at_every_layer_and_the_best_layer(tmp_path, tiny_checkpoint):
    """task.trace_layers: each record ranks its evidence session at every layer in both query modes (from the
    same densities the ranker reads), and tab:locomo_layers names the layer where it is most often in the
    first two."""
    from harness.running.runner import run
    from tests.conftest import tiny_run_config

    cfg = tiny_run_config(tiny_checkpoint, "task=locomo", "method=vanilla", "task.groups=1",
                          "task.trace_layers=true", small_task=False)
    run(cfg, str(tmp_path))
    records = [json.loads(line) for line in (tmp_path / "predictions.jsonl").read_text().splitlines()]
    layers = 3                                          # the tiny checkpoint's
    for record in records:
        ranks = record["evidence_rank_by_layer"]
        assert sorted(ranks) == ["last", "mean"] and all(len(v) == layers for v in ranks.values())
        assert all(1 <= r <= 8 for v in ranks.values() for r in v)
    table = layers_table([{**r, "run": "vanilla"} for r in records])
    assert list(table.columns) == ["vanilla (last)", "vanilla (mean)"] and table.index[-1] == "best layer"
