"""LoCoMo (Maharana et al., ACL 2024): dialogue memory over long multi-session conversations, run as the
MemDefrag authors run it (ryehr/MemDefrag `LoCoMo_benchmark.py`). Each session is one fragment (its date,
then `speaker: text` per turn, a shared photo's caption appended), stored in chronological order (forgetting
past N_max as in retention, through the run's `forgetting`); then every question of the chosen categories is
asked over the final memory. Scored by LoCoMo's own QA score (`evals.locomo_scoring`) on the answer's first
line (the authors'), the paper's substring accuracy, and whether an evidence session was read.

Data: LoCoMo's released list format, `<data_dir>/locomo/locomo10.json` by default or any such file by
`task.file`; `dataset=synthetic` generates the embedded set (`evals.synthetic_dialogue`). A conversation over
`task.max_tokens` is skipped (the authors' filter) and counted in run.json.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import numpy as np
import pandas as pd

from evals import synthetic_dialogue
from evals.locomo_scoring import Category, score
from evals.retention import best_rank, is_correct
from evals.stats import bootstrap_mean, wilson, with_interval
from methods.attention.decoder import num_layers
from methods.attention.tracing import QueryMode, densities, ranks
from methods.errors import ConfigError, one_of
from methods.session import UPDATE_PHASES

LoCoMoDataset = StrEnum("LoCoMoDataset", ["synthetic", "locomo"])
DEFAULT_FILE = Path("locomo") / "locomo10.json"
SESSION = re.compile(r"session_(\d+)")
EVIDENCE = re.compile(r"D:?(\d+):(\d+)")       # "D3:12"; the released file also writes "D:11:26", "D8:6; D9:17"


@dataclass(frozen=True)
class Question:
    text: str
    answer: str                   # the adversarial answer for category 5 (scored by abstention, not by it)
    category: int
    evidence: tuple[int, ...]     # the sessions its evidence turns lie in


@dataclass(frozen=True)
class Conversation:
    index: int                    # the run's group index
    sample_id: str
    sessions: tuple[tuple[int, str], ...]     # (session number, its fragment text), in chronological order
    questions: tuple[Question, ...]
    tokens: int

    def texts(self) -> list[str]:
        return [text for _, text in self.sessions]


def serialized(conversation: dict, k: int) -> str:
    """One session as one fragment: its date, then each turn as `speaker: text`, a shared photo's caption
    appended (the authors' serialization)."""
    lines = [f"Session {k} ({conversation.get(f'session_{k}_date_time', '')}):"]
    for turn in conversation[f"session_{k}"]:
        caption = f" [shared photo: {turn['blip_caption']}]" if turn.get("blip_caption") else ""
        lines.append(f"{turn['speaker']}: {turn['text']}{caption}")
    return "\n".join(lines) + "\n\n"


def sessions_of(conversation: dict) -> list[int]:
    """The session numbers that hold turns (a date key alone is no session), in order."""
    return sorted(int(m.group(1)) for key in conversation if (m := SESSION.fullmatch(key)))


def evidence_sessions(evidence: list[str]) -> tuple[int, ...]:
    """The sessions named by evidence turn ids, however the file spells them; an id naming none adds none."""
    return tuple(sorted({int(m.group(1)) for entry in evidence for m in EVIDENCE.finditer(entry)}))


def _need(condition: bool, where: str, what: str) -> None:
    if not condition:
        raise ConfigError(f"{where}: {what}")


def validated(samples, where: str) -> list[dict]:
    """The samples of a LoCoMo-format file, or one line naming the file, the sample and the field at fault."""
    _need(isinstance(samples, list) and samples, where, "must hold a non-empty list of samples (LoCoMo's format)")
    for n, sample in enumerate(samples):
        at = f"{where} sample {n}"
        _need(isinstance(sample, dict), at, "is not an object")
        for key, kind in (("sample_id", str), ("conversation", dict), ("qa", list)):
            _need(isinstance(sample.get(key), kind), at, f"field {key!r} must be a {kind.__name__}")
        at = f"{where} sample {sample['sample_id']!r}"
        conversation = sample["conversation"]
        for key in ("speaker_a", "speaker_b"):
            _need(isinstance(conversation.get(key), str), at, f"conversation.{key} must be a string")
        sessions = sessions_of(conversation)
        _need(bool(sessions), at, "conversation has no session_<k> list of turns")
        for k in sessions:
            turns = conversation[f"session_{k}"]
            _need(isinstance(turns, list) and turns, at, f"conversation.session_{k} must be a non-empty list of turns")
            for i, turn in enumerate(turns):
                _need(isinstance(turn, dict) and isinstance(turn.get("speaker"), str)
                      and isinstance(turn.get("text"), str), at,
                      f"conversation.session_{k}[{i}] must be a turn with string 'speaker' and 'text'")
        for i, item in enumerate(sample["qa"]):
            here = f"qa[{i}]"
            _need(isinstance(item, dict) and isinstance(item.get("question"), str), at,
                  f"{here} must have a string 'question'")
            _need(item.get("category") in set(Category), at,
                  f"{here}.category={item.get('category')!r} must be one of {[int(c) for c in Category]}")
            answer = item.get("answer", item.get("adversarial_answer"))
            _need(isinstance(answer, (str, int, float)) and not isinstance(answer, bool), at,
                  f"{here} must have an 'answer' (or, category 5, an 'adversarial_answer'): a string or a number")
            _need(isinstance(item.get("evidence", []), list)
                  and all(isinstance(e, str) for e in item.get("evidence", [])), at,
                  f"{here}.evidence must be a list of turn ids such as 'D3:12'")
    return samples


def read_file(path: Path) -> list[dict]:
    """A LoCoMo-format JSON file, validated; one line on any fault."""
    if not path.is_file():
        raise ConfigError(f"task.file: {path} is not a file (LoCoMo's locomo10.json; task.data_dir sets the "
                          f"folder holding {DEFAULT_FILE})")
    try:
        samples = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path} is not valid JSON: {err}") from None
    return validated(samples, str(path))


class LoCoMo:
    """categories: LoCoMo's categories asked (4, single-hop, the authors' default); groups: how many
    conversations, the first that fit in file order (None: all); questions: a seeded sample of that many per
    conversation (None: all); max_tokens: a conversation longer than this (the sessions' tokens) is skipped (None: none is);
    first_line: score the answer's first non-empty line (the authors'), else all of it; trace_layers: also
    rank the evidence session by density at every layer, in both query modes (which layer finds it best:
    the authors' `locomo_layer_sweep.py` question)."""

    tables = ("tab:locomo", "tab:locomo_layers")
    marks_targets = True                  # the sessions holding a question's evidence

    def __init__(self, dataset: LoCoMoDataset = "synthetic", data_dir: str | None = None, file: str | None = None,
                 categories: list[int] = (4,), groups: int | None = None, questions: int | None = None,
                 max_tokens: int | None = 18_000, first_line: bool = True, trace_layers: bool = False,
                 seed: int = 42):
        one_of("task.dataset", dataset, LoCoMoDataset)
        wrong = [c for c in categories or [] if c not in set(Category)]
        if wrong or not categories:
            raise ConfigError(f"task.categories={list(categories or [])} must name some of "
                              f"{[int(c) for c in Category]} (1 multi-hop, 2 temporal, 3 open-domain, "
                              f"4 single-hop, 5 adversarial)")
        for key, value in (("groups", groups), ("questions", questions), ("max_tokens", max_tokens)):
            if value is not None and value < 1:
                raise ConfigError(f"task.{key}={value} must be >= 1, or null")
        if file is not None and dataset != "locomo":
            raise ConfigError(f"task.file={file} reads LoCoMo's format: set task.dataset=locomo")
        self.dataset, self.categories = dataset, sorted(set(categories))
        self.path = Path(file) if file else Path(data_dir or ".") / DEFAULT_FILE
        self.n_groups, self.n_questions, self.max_tokens = groups, questions, max_tokens
        self.first_line, self.trace_layers, self.seed = first_line, trace_layers, seed
        self.skipped: list[dict] = []

    def samples(self) -> list[dict]:
        if self.dataset == "synthetic":
            return validated(synthetic_dialogue.generate(self.seed), "the embedded set")
        return read_file(self.path)

    def check(self) -> None:
        """Read and validate the file (ConfigError) before any model is loaded."""
        self.samples()

    def check_model(self, model_config, tokenizer) -> None:
        """Nothing of this task depends on the model."""

    def groups(self, tokenizer) -> list[Conversation]:
        """Every conversation within task.max_tokens (those over it skipped and counted), each with its
        questions of the chosen categories (a seeded sample of task.questions where set)."""
        chosen, self.skipped = [], []
        for sample in self.samples():
            if self.n_groups is not None and len(chosen) == self.n_groups:
                break
            conversation = sample["conversation"]
            sessions = tuple((k, serialized(conversation, k)) for k in sessions_of(conversation))
            tokens = sum(len(tokenizer(text, add_special_tokens=False)["input_ids"]) for _, text in sessions)
            if self.max_tokens is not None and tokens > self.max_tokens:
                self.skipped.append({"sample_id": sample["sample_id"], "tokens": tokens})
                continue
            questions = [Question(item["question"], str(item.get("answer", item.get("adversarial_answer"))),
                                  item["category"], evidence_sessions(item.get("evidence", [])))
                         for item in sample["qa"] if item["category"] in self.categories]
            if self.n_questions is not None and len(questions) > self.n_questions:
                rng = random.Random(f"{self.seed}:{sample['sample_id']}")
                questions = [questions[i] for i in sorted(rng.sample(range(len(questions)), self.n_questions))]
            if questions:
                chosen.append(Conversation(len(chosen), sample["sample_id"], sessions, tuple(questions), tokens))
        if not chosen:
            raise ConfigError(f"task.dataset={self.dataset}: no conversation within task.max_tokens="
                              f"{self.max_tokens} has a question of task.categories={self.categories}")
        return chosen

    def describe(self) -> dict:
        """For run.json: the conversations left out for their length, and the question sample."""
        return {"max_tokens": self.max_tokens, "skipped": self.skipped, "categories": self.categories,
                "questions_per_conversation": self.n_questions, "first_line": self.first_line}

    def run_group(self, session, conversation: Conversation) -> Iterator[dict]:
        """Store every session in order, then ask each question over the final memory."""
        stored, updates = session.store_all(text for _, text in conversation.sessions)
        fids = dict(zip((k for k, _ in conversation.sessions), stored))
        for n, question in enumerate(conversation.questions):
            held = [fids[k] for k in question.evidence if k in fids]
            by_layer = self.evidence_ranks(session, question.text, held) if self.trace_layers and held else {}
            answer = session.ask(question.text, targets=tuple(held))
            scored = first_line(answer.text) if self.first_line else answer.text
            yield {
                "group": conversation.index, "question_index": n, "sample_id": conversation.sample_id,
                "category": question.category, "question": question.text, "gold": question.answer,
                "output": answer.text, "f1": score(scored, question.answer, question.category),
                "correct": None if question.category == Category.adversarial      # its gold is what not to say
                else is_correct(question.answer, scored),
                "evidence_sessions": list(question.evidence), "memory_tokens": session.memory.n_tokens,
                "used_tokens": answer.memory_tokens, "conversation_tokens": conversation.tokens,
                "target_rank": best_rank(held, answer.densities),
                "seconds": {**(updates if n == 0 else {}), **answer.seconds},
                **({} if answer.read is None or not held else {"target_read": any(f in answer.read for f in held)}),
                **({"evidence_rank_by_layer": by_layer} if by_layer else {}),
            }

    @staticmethod
    def evidence_ranks(session, question: str, held: list[int]) -> dict[str, list[int]]:
        """Per query mode, the best density rank of an evidence session at every layer (1 = densest), from one
        trace of the question over the whole memory."""
        layers = list(range(num_layers(session.model.config)))
        rows = session.trace(session.memory, session.prompt_ids(question), layers)
        ids, spans = session.memory.ids(), session.memory.spans()
        where = [ids.index(fid) for fid in held if fid in ids]
        return {mode: [int(ranks(densities(rows[layer], spans, mode))[where].min()) for layer in layers]
                for mode in QueryMode} if where else {}

    def metrics(self, records: list[dict]) -> pd.DataFrame:
        """What the answers score (timings stay in the records: the table shows them)."""
        return scores_by_category(records).drop(columns=["s/question"])


def first_line(text: str) -> str:
    """The first non-empty line (the authors': a small model continues with questions of its own)."""
    return next((line.strip() for line in text.strip().split("\n") if line.strip()), text.strip())


def scores_by_category(records: list[dict], by: tuple[str, ...] = ()) -> pd.DataFrame:
    """Per category (and `by`): LoCoMo's F1 (x100) with its 95 % bootstrap interval over the questions, the
    substring accuracy with its Wilson interval, the share of questions whose evidence session was read (where
    the method chooses fragments), the evidence's mean density rank, seconds per question, and n."""
    frame = pd.DataFrame(records)
    frame["evidence_read"] = frame["target_read"] if "target_read" in frame else np.nan
    frame["seconds_per_question"] = [sum(v for phase, v in s.items() if phase not in UPDATE_PHASES)
                                     for s in frame["seconds"]]
    rows = []
    for key, part in frame.groupby([*by, "category"], sort=True):
        f1 = part["f1"].to_numpy(dtype=float)
        mean, low, high = bootstrap_mean(f1, np.arange(len(f1)))
        judged = part["correct"].dropna()                     # category 5 has no answer to contain
        correct, n = int(judged.astype(bool).sum()), len(part)
        low_high = wilson(correct, len(judged)) if len(judged) else (np.nan, np.nan)
        read = part["evidence_read"].dropna()
        rows.append({**dict(zip([*by, "category"], key if isinstance(key, tuple) else (key,))),
                     "f1": 100 * mean, "f1 low": 100 * low, "f1 high": 100 * high,
                     "accuracy": 100 * correct / len(judged) if len(judged) else np.nan,
                     "accuracy low": 100 * low_high[0], "accuracy high": 100 * low_high[1],
                     "evidence hit": 100 * read.astype(float).mean() if len(read) else np.nan,
                     "evidence rank": part["target_rank"].dropna().mean() if part["target_rank"].notna().any()
                     else np.nan,
                     "s/question": part["seconds_per_question"].mean(), "n": n})
    return pd.DataFrame(rows)


def locomo_table(records: list[dict]) -> pd.DataFrame:
    """`tab:locomo`: a row per run and category (records labelled with `run`), F1 and accuracy with their
    intervals (`50.0 [31.2, 68.8]`), evidence hit, its rank, seconds per question, n."""
    table = scores_by_category(records, ("run",))
    for metric in ("f1", "accuracy"):
        table[metric] = [with_interval(m / 100, lo / 100, hi / 100) for m, lo, hi in
                         zip(table[metric], table[f"{metric} low"], table[f"{metric} high"])]
    order = {run: i for i, run in enumerate(dict.fromkeys(r["run"] for r in records))}
    table = table.sort_values(["category", "run"], key=lambda c: c.map(order) if c.name == "run" else c)
    return table.set_index(["category", "run"]).drop(columns=[f"{m} {b}" for m in ("f1", "accuracy")
                                                              for b in ("low", "high")])


def layers_table(records: list[dict], hit_at: int = 2) -> pd.DataFrame:
    """`tab:locomo_layers`: per layer (rows) and run x query mode (columns), the share (%) of questions whose
    evidence session ranks within the first `hit_at` by density at that layer; the last row names the best."""
    columns = {}
    for run in dict.fromkeys(r["run"] for r in records):
        traced = [r["evidence_rank_by_layer"] for r in records if r["run"] == run and "evidence_rank_by_layer" in r]
        for mode in QueryMode:
            if traced:
                hits = np.array([t[mode] for t in traced]) <= hit_at
                columns[f"{run} ({mode})"] = 100 * hits.mean(axis=0)
    table = pd.DataFrame(columns).rename_axis("layer")
    best = pd.DataFrame([table.idxmax()], index=["best layer"]).astype(object)
    return pd.concat([table.round(1).astype(object), best]).rename_axis("layer")
