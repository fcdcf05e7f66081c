"""The LoCoMo task: LoCoMo's released format read the same way for the real file and the embedded set, every
malformed file refused in one line naming the file, sample and field, the authors' serialization and filter,
and the text baseline cut to the model's window."""

import copy
import json
from pathlib import Path

import pytest
import torch

from evals import synthetic_dialogue
from evals.locomo import LoCoMo, evidence_sessions, first_line, layers_table, locomo_table, serialized
from harness.errors import ConfigError
from methods.baselines import TextMemory
from methods.formation import Former
from methods.memory import LatentMemory
from tests.conftest import FRAGMENTS

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
    task = LoCoMo("synthetic", categories=[1, 2, 3, 4, 5], max_tokens=400, questions=2)
    samples = synthetic_dialogue.generate(42)
    tokens = [sum(len(serialized(s["conversation"], k).split()) for k in range(1, 9)) for s in samples]
    kept = task.groups(Words())
    assert [g.sample_id for g in kept] == [s["sample_id"] for s, n in zip(samples, tokens) if n <= 400]
    assert task.describe()["skipped"] == [{"sample_id": s["sample_id"], "tokens": n}
                                          for s, n in zip(samples, tokens) if n > 400]
    assert all(len(g.questions) == 2 for g in kept)
    again = LoCoMo("synthetic", categories=[1, 2, 3, 4, 5], max_tokens=400, questions=2).groups(Words())
    assert [g.questions for g in again] == [g.questions for g in kept]


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
    (lambda s: [{**s[0], "qa": [{"answer": "x", "category": 4}]}], r"qa\[0\] must have a string 'question'"),
    (lambda s: [{**s[0], "qa": [{"question": "q", "answer": "x", "category": 6}]}],
     r"qa\[0\].category=6 must be one of \[1, 2, 3, 4, 5\]"),
    (lambda s: [{**s[0], "qa": [{"question": "q", "category": 5}]}],
     r"qa\[0\] must have an 'answer' \(or, category 5, an 'adversarial_answer'\)"),
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
    (None, "is not a file"), ("{not json", "is not valid JSON"), (b"\xff\xfe", "is not valid JSON")])
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
    (dict(groups=0), "task.groups=0 must be >= 1"), (dict(questions=0), "task.questions=0 must be >= 1"),
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


def test_text_cut_to_the_window_keeps_the_sink_and_the_latest_tokens(llama, tokenizer):
    memory = LatentMemory()
    former = Former(llama, tokenizer, "shared_sink", keep_kv=False)
    for text in FRAGMENTS:
        former.store(memory, text)
    window = llama.config.max_position_embeddings
    prompt = torch.arange(window - 64 - 1 - 10)              # room for the sink and 10 memory tokens
    backend = type("Backend", (), {"model": llama})()
    whole = TextMemory().plan(memory, prompt, backend).text_ids
    cut = TextMemory(fit_window=True).plan(memory, prompt, backend).text_ids
    assert torch.equal(whole, memory.text_ids()) and len(whole) > 11
    assert torch.equal(cut, torch.cat([whole[:1], whole[-10:]]))
    short = torch.arange(5)
    assert torch.equal(TextMemory(fit_window=True).plan(memory, short, backend).text_ids, whole)


def test_the_table_has_a_row_per_run_and_category_with_intervals():
    records = [{"run": run, "category": c, "f1": f, "correct": f == 1.0, "target_rank": 1, "target_read": f > 0,
                "seconds": {"formation": 5.0, "index": 2.0, "trace": 0.5, "prefill": 1.0}}
               for run, c, f in [("vanilla", 4, 1.0), ("vanilla", 4, 0.0), ("vanilla", 2, 0.5),
                                 ("memdefrag_top2", 4, 1.0), ("memdefrag_top2", 4, 1.0)]]
    table = locomo_table(records)
    assert list(table.index) == [(2, "vanilla"), (4, "vanilla"), (4, "memdefrag_top2")]
    row = table.loc[(4, "vanilla")]
    assert row["f1"].startswith("50.0 [") and row["accuracy"].startswith("50.0 [") and row["n"] == 2
    assert row["evidence hit"] == 50.0 and row["s/question"] == 1.5


@pytest.mark.slow
@pytest.mark.parametrize("method", ["none", "text", "text_window", "vanilla", "memdefrag_top2", "select", "ape",
                                    "epic", "cacheblend", "memoryllm_defrag", "mplus_defrag"])
def test_every_method_answers_the_embedded_dialogues(tmp_path, request, method):
    """Every method end to end on task=locomo (the embedded set, every category): a record per question with
    LoCoMo's score; the methods that choose fragments say whether they read an evidence session."""
    from harness.runner import run
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
    from harness.runner import run
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
