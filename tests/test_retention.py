"""The retention task: data loading and its errors, group selection, the protocol."""

import json

import pytest
import torch

from evals import datasets
from evals.retention import Retention, is_correct
from evals.synthetic import generate
from harness.errors import ConfigError
from tests.conftest import CharTokenizer


def write(folder, targets, unrelated):
    (folder / "nqa").mkdir(parents=True)
    (folder / "nqa" / datasets.TARGETS_FILE).write_text(json.dumps(targets))
    (folder / "nqa" / datasets.UNRELATED_FILE).write_text(json.dumps(unrelated))


ITEMS = [{"context": "c" * (10 * i + 5), "question": f"q{i}", "answer": f"a{i}"} for i in range(8)]


def test_groups_are_seeded_filtered_and_share_distractors(tmp_path):
    write(tmp_path, ITEMS, ["u" * 40, "v" * 3, "w" * 5])
    task = Retention("nqa", str(tmp_path), groups=3, updates=3, seed=7, max_context_tokens=30)
    groups = task.groups(CharTokenizer())
    assert len(groups) == 3 and all(len(g.target.context) + 1 <= 30 for g in groups)
    assert groups == Retention("nqa", str(tmp_path), groups=3, updates=3, seed=7, max_context_tokens=30).groups(
        CharTokenizer())
    assert all(g.distractors == groups[0].distractors for g in groups)
    assert all(len(d) <= 30 + 2 for d in groups[0].distractors)         # cut, then "\n\n"


@pytest.mark.parametrize("setup, message", [
    (lambda p: None, "has no folder nqa/"),
    (lambda p: write(p, [], ["u"]), "non-empty JSON list"),
    (lambda p: write(p, [{"context": "c"}], ["u"]), "item 0 'question' is NoneType, not a string"),
    (lambda p: write(p, ITEMS, [3]), "entry 0 is int, not a string: every distractor context must be a string"),
])
def test_bad_data_gets_one_clear_error(tmp_path, setup, message):
    setup(tmp_path)
    with pytest.raises(ConfigError, match=message):
        Retention("nqa", str(tmp_path)).groups(CharTokenizer())


def test_malformed_json_names_the_file(tmp_path):
    write(tmp_path, ITEMS, ["u"])
    (tmp_path / "nqa" / datasets.TARGETS_FILE).write_text("{not json")
    with pytest.raises(ConfigError, match="val_data.json is not valid JSON"):
        Retention("nqa", str(tmp_path)).groups(CharTokenizer())


def test_too_few_items_and_bad_steps_are_refused(tmp_path):
    write(tmp_path, ITEMS, ["u"])
    with pytest.raises(ConfigError, match="task.groups=50"):
        Retention("nqa", str(tmp_path), groups=50, updates=2).groups(CharTokenizer())
    with pytest.raises(ConfigError, match="eval_steps"):
        Retention(updates=5, eval_steps=[0, 6])
    with pytest.raises(ConfigError, match="is not one of"):
        Retention("trivia").groups(CharTokenizer())


def test_synthetic_answers_occur_once_in_their_context():
    data = generate(0)
    assert len(data.targets) >= 500 and len(data.unrelated) == 200
    assert generate(0) == data
    for item in data.targets[:100]:
        assert item.context.count(item.answer) == 1
        assert all(item.answer not in u for u in data.unrelated)


def test_correct_is_a_case_insensitive_substring():
    assert is_correct("Paris ", "it is paris.") and not is_correct("Paris", "Lyon")


class RecordingSession:
    """Stands in for a model session: records the protocol's calls."""

    def __init__(self):
        from methods.memory import LatentMemory
        self.calls, self.memory, self.next = [], LatentMemory(), 0

    def store(self, text, reuse=False):
        from methods.memory import Fragment
        self.calls.append(("store", text, reuse))
        self.memory.append(Fragment(self.next, text, torch.tensor([1]), torch.zeros(1)))
        self.next += 1
        return self.next - 1

    update_seconds = {"formation": 0.0, "forgetting": 0.0}

    def shuffle(self, generator):
        self.calls.append(("shuffle",))

    def ask(self, question, targets=()):
        from methods.session import Answer
        self.calls.append(("ask", question))
        return Answer("it is A0", 1, {0: 0.1, 1: 0.9}, {"plan": 0.0, "prefill": 0.0, "decode": 0.0})


def test_protocol_stores_target_first_and_asks_at_eval_steps(tmp_path):
    write(tmp_path, [{"context": "ctx", "question": "q?", "answer": "a0"}], ["u1", "u2", "u3"])
    task = Retention("nqa", str(tmp_path), groups=1, updates=4, eval_steps=[1, 3])
    session = RecordingSession()
    records = list(task.run_group(session, task.groups(CharTokenizer())[0]))
    stores = [c for c in session.calls if c[0] == "store"]
    assert stores[0] == ("store", "ctx\n\n", False) and all(c[2] for c in stores[1:]) and len(stores) == 4
    assert [r["step"] for r in records] == [1, 3] and all(r["correct"] for r in records)
    assert records[0]["target_rank"] == 2 and records[1]["memory_tokens"] == 3
    assert sum(c[0] == "shuffle" for c in session.calls) == 4


def test_forgetting_bounds_the_memory_across_updates(tmp_path, llama, tokenizer):
    """A real session under a capacity: memory stays at N_max once full; the target shrinks, never vanishes."""
    from methods.forgetting import Informativeness
    from methods.backends.kv_prefix import KVPrefixBackend
    from methods.memdefrag import MemDefrag
    from methods.session import Session

    write(tmp_path, [{"context": "the cat is on the mat", "question": "cat?", "answer": "mat"}],
          [f"unrelated text number {i} " * 2 for i in range(12)])
    task = Retention("nqa", str(tmp_path), groups=1, updates=12, max_context_tokens=60)
    session = Session(llama, tokenizer, KVPrefixBackend(llama), MemDefrag(k=2, tracer_layer=1), "shared_sink",
                      "plain", max_new_tokens=3, forgetting=Informativeness(capacity=200))
    records = list(task.run_group(session, task.groups(tokenizer)[0]))
    sizes = [r["memory_tokens"] for r in records]
    assert max(sizes) == 200 and sizes[-1] == 200 and sizes == sorted(sizes)
    target = [r["target_tokens"] for r in records]
    assert target[0] == 23 and 0 < target[-1] < target[0] and target == sorted(target, reverse=True)
    assert all(r["target_rank"] is not None and r["seconds"]["formation"] > 0 for r in records)
