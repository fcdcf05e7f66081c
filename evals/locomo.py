"""LoCoMo (Maharana et al., ACL 2024): dialogue memory over long multi-session conversations. Each session is one
fragment (its date, then `speaker: text` per turn, a shared photo's caption appended: the MemDefrag authors'
serialization), stored in chronological order (forgetting past N_max, through the run's `forgetting`); then the
questions are asked over the final memory under one of three declared protocols (`PROTOCOLS`, `task.protocol`):

- `locomo`: LoCoMo's own QA (snap-research/locomo, branch `code`, `task_eval/evaluate_llama2.py`, `get_answers`
  and `run_llama`): its short-answer instruction inside the model's chat template where it has one (as written
  otherwise), the category-2 date hint, category 5 as a two-way choice between the abstention option and the
  adversarial answer in seeded random order with an (a)/(b) reply mapped back to the option, the reply's first
  line cleaned as LoCoMo cleans it, 50 answer tokens, all five categories. Greedy decoding, not LoCoMo's sampling.
- `authors`: ryehr/MemDefrag `LoCoMo_benchmark.py`: the plain `question + " Answer: "`, category 4, every
  conversation of fewer than 18,000 tokens (their `>=` skips one of exactly 18,000), 32 answer tokens, the
  reply's first line.
- `bare`: how this project asked before both: the bare question in the run's own prompt style (`prompt`),
  category 4, no length filter, 32 answer tokens, the reply's first line (the runs committed before them).

Every answer gets both scores: LoCoMo's F1 (`evals.locomo_scoring`, `task_eval/evaluation.py`) and the authors'
(`f1_authors`: LongBench's `qa_f1_score`, which their script calls LoCoMo's metric; the full gold, no Porter
stems, `and` kept); the substring accuracy of the gold as LoCoMo's score cuts it; whether an evidence session was
read.

Data: LoCoMo's released list format, `<data_dir>/locomo/locomo10.json` by default or any such file by
`task.file`; `dataset=synthetic` generates the embedded set (`evals.synthetic_dialogue`). A conversation over
the protocol's token limit is skipped and counted in run.json.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

import numpy as np
import pandas as pd

from evals import synthetic_dialogue
from evals.data_files import number_fault, read_json, text_fault
from evals.locomo_scoring import Category, score
from evals.metrics import token_f1 as longbench_f1
from evals.retention import best_rank, is_correct
from evals.stats import bootstrap_mean, wilson, with_interval
from methods.attention.decoder import num_layers
from methods.attention.tracing import QueryMode, densities, ranks
from methods.errors import ConfigError, one_of, whole_number
from methods.session import UPDATE_PHASES
from methods.tokens import token_count

LoCoMoDataset = StrEnum("LoCoMoDataset", ["synthetic", "locomo"])
ProtocolName = StrEnum("ProtocolName", ["locomo", "authors", "bare"])
DEFAULT_FILE = Path("locomo") / "locomo10.json"
SESSION = re.compile(r"session_(\d+)")
EVIDENCE = re.compile(r"D:?(\d+):(\d+)")       # "D3:12"; the released file also writes "D:11:26", "D8:6; D9:17"


@dataclass(frozen=True)
class Question:
    text: str
    answer: str                   # category 5: the adversarial answer (what not to say)
    category: int
    evidence: tuple[int, ...]     # the sessions its evidence turns lie in
    index: int = 0                # its place in the conversation's qa list (seeds category 5's option order)


ABSTAIN = "No information available"


def locomo_reply(line: str, options: Mapping[str, str] | None) -> str:
    """LoCoMo's cleaning of a reply's first line: a two-way choice becomes the option named, `(a)` or else the
    other; any other reply is lower-cased with `(a)`, `(b)`, `a)`, `b)` and `answer:` removed (all of them,
    wherever they stand, as LoCoMo's `get_answers` does)."""
    line = line.lower().strip()
    if options is not None:
        return options["a"] if "(a)" in line else options["b"]
    for mark in ("(a)", "(b)", "a)", "b)", "answer:"):
        line = line.replace(mark, "")
    return line.strip()


@dataclass(frozen=True)
class Protocol:
    """How a question is asked and its reply read. instruction: the text around the question (`{question}`);
    style: the prompt style (methods.prompting) it is read in: `chat` inside the model's chat template where it
    has one, else as written; `plain`; None: the run's own (`prompt`); hints: text appended to a
    category's question; choice: category 5 as a two-way choice (`{question}`, `{a}`, `{b}`), the abstention
    option first with probability one half, seeded per question; reply: the reply's first line -> the scored
    prediction (given the choice's options, or None); max_tokens: a conversation of at least this many tokens is
    skipped (None: none is)."""

    categories: tuple[int, ...]
    answer_tokens: int
    max_tokens: int | None
    instruction: str = "{question}"
    style: str | None = "plain"
    hints: Mapping[int, str] = field(default_factory=dict)
    choice: str | None = None
    reply: Callable[[str, Mapping[str, str] | None], str] = lambda line, options: line

    def ask(self, question: Question, seed: str) -> tuple[str, dict[str, str] | None]:
        """The text asked inside the prompt style, and category 5's options where it is a choice."""
        text = question.text + self.hints.get(question.category, "")
        options = None
        if self.choice is not None and question.category == Category.adversarial:
            first = random.Random(f"{seed}:{question.index}").random() < 0.5
            options = {"a": ABSTAIN, "b": question.answer} if first else {"a": question.answer, "b": ABSTAIN}
            text = self.choice.format(question=question.text, **options)
        return self.instruction.format(question=text), options

    def prompt_style(self, tokenizer, run_style: str) -> str:
        """The prompt style (methods.prompting) its questions are read in, for this model and run."""
        if self.style == "chat":
            return "chat" if getattr(tokenizer, "chat_template", None) else "raw"
        return self.style or run_style


PROTOCOLS = {
    # snap-research/locomo `code` branch, task_eval/evaluate_llama2.py: QA_PROMPT, the category-2 and -5 texts
    # of get_answers, ANS_TOKENS_PER_QUES; no length filter (LoCoMo truncates the text it reads instead).
    ProtocolName.locomo: Protocol(
        categories=tuple(Category), answer_tokens=50, max_tokens=None, style="chat",
        instruction="\nBased on the above conversations, write a short answer for the following question in a few "
                    "words. Do not write complete and lengthy sentences. Answer with exact words from the "
                    "conversations whenever possible.\n\nQuestion: {question}\n",
        hints={Category.temporal: " Use DATE of CONVERSATION to answer with an approximate date."},
        choice="{question} (a) {a} (b) {b}. Select the correct answer by writing (a) or (b).",
        reply=locomo_reply),
    # ryehr/MemDefrag LoCoMo_benchmark.py: `question + " Answer: "` (prompt style plain), --category 4,
    # --max_conv_tokens 18000 with `total >= max_conv_tokens` skipped, --max_new_tokens 32.
    ProtocolName.authors: Protocol(categories=(Category.single_hop,), answer_tokens=32, max_tokens=18_000),
    ProtocolName.bare: Protocol(categories=(Category.single_hop,), answer_tokens=32, max_tokens=None, style=None),
}


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


def gold(item: dict) -> str:
    """The answer scored against: category 5's adversarial answer (two conv-26 items also carry an `answer`,
    the true one, which is not what category 5 scores), else the answer, a number as its text."""
    if item["category"] == Category.adversarial and "adversarial_answer" in item:
        return str(item["adversarial_answer"])
    return str(item.get("answer", item.get("adversarial_answer")))


def contains(prediction: str, answer: str, category: int) -> bool | None:
    """Substring accuracy, the gold cut as LoCoMo's score cuts it: category 3 before its first ';', category 1
    every comma-separated part found (in any order); None for category 5 (its gold is what not to say)."""
    if category == Category.adversarial:
        return None
    if category == Category.open_domain:
        answer = answer.split(";")[0]
    parts = answer.split(",") if category == Category.multi_hop else [answer]
    return all(is_correct(part, prediction) for part in parts if part.strip())


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
        for key in conversation:
            m = SESSION.fullmatch(key)
            _need(m is None or key == f"session_{int(m.group(1))}", at,
                  f"conversation key {key!r}: LoCoMo numbers sessions without leading zeros "
                  f"(session_{int(m.group(1)) if m else ''})")
        sessions = sessions_of(conversation)
        _need(bool(sessions), at, "conversation has no session_<k> list of turns")
        for k in sessions:
            turns = conversation[f"session_{k}"]
            _need(isinstance(turns, list) and turns, at, f"conversation.session_{k} must be a non-empty list of turns")
            for i, turn in enumerate(turns):
                _need(isinstance(turn, dict) and not any(text_fault(turn.get(key), blank_ok=True)
                                                         for key in ("speaker", "text")), at,
                      f"conversation.session_{k}[{i}] must be a turn with string 'speaker' and 'text' (valid text)")
        for i, item in enumerate(sample["qa"]):
            here = f"qa[{i}]"
            _need(isinstance(item, dict), at, f"{here} must be an object with a 'question'")
            fault = text_fault(item.get("question"))
            _need(fault is None, at, f"{here}.question {fault}: every question needs text")
            category = item.get("category")
            _need(type(category) is int and category in set(Category), at,
                  f"{here}.category={category!r} must be one of {[int(c) for c in Category]}")
            answer = item.get("answer", item.get("adversarial_answer"))
            fault = text_fault(answer) if isinstance(answer, str) else number_fault(answer)
            _need(fault is None, at, f"{here}'s answer (or, category 5, 'adversarial_answer') {fault}: a non-empty "
                                     f"string or a finite number (an empty gold is in every reply)")
            _need(isinstance(item.get("evidence", []), list)
                  and all(isinstance(e, str) for e in item.get("evidence", [])), at,
                  f"{here}.evidence must be a list of turn ids such as 'D3:12'")
    twice = sorted(i for i, n in Counter(sample["sample_id"] for sample in samples).items() if n > 1)
    _need(not twice, where, f"sample_id {twice[0] if twice else ''!r} is given to more than one sample (each "
                            f"conversation's id is its own: the bootstrap's clusters and the claims' keys)")
    return samples


def read_file(path: Path) -> list[dict]:
    """A LoCoMo-format JSON file, validated; one line on any fault."""
    if not path.is_file():
        raise ConfigError(f"task.file: {path} is not a file (LoCoMo's locomo10.json; task.data_dir sets the "
                          f"folder holding {DEFAULT_FILE})")
    return validated(read_json(path), str(path))


class LoCoMo:
    """protocol: how questions are asked and read (`PROTOCOLS`); categories: LoCoMo's categories asked (None:
    the protocol's); groups: how many conversations, the first that fit in file order (None: all); questions:
    a seeded sample of that many per category and conversation, or a list of five such numbers, one per category
    1-5 (None, or a None in the list: all); max_tokens: a conversation of at least this many tokens (the
    sessions') is skipped (None: the protocol's); first_line: score the reply's first non-empty line (both
    protocols), else all of it; trace_layers: also rank the evidence session by density at every layer, in
    both query modes (which layer finds it best: the authors' `locomo_layer_sweep.py` question)."""

    tables = ("tab:locomo", "tab:locomo_layers")
    marks_targets = True                  # the sessions holding a question's evidence

    def __init__(self, dataset: LoCoMoDataset = "synthetic", protocol: ProtocolName = "locomo",
                 data_dir: str | None = None, file: str | None = None, categories: list[int] | None = None,
                 groups: int | None = None, questions: int | list | None = None, max_tokens: int | None = None,
                 first_line: bool = True, trace_layers: bool = False, seed: int = 42):
        one_of("task.dataset", dataset, LoCoMoDataset)
        one_of("task.protocol", protocol, ProtocolName)
        self.protocol_name, self.protocol = ProtocolName(protocol), PROTOCOLS[ProtocolName(protocol)]
        categories = list(self.protocol.categories if categories is None else categories)
        wrong = [c for c in categories if c not in set(Category)]
        if wrong or not categories:
            raise ConfigError(f"task.categories={categories} must name some of "
                              f"{[int(c) for c in Category]} (1 multi-hop, 2 temporal, 3 open-domain, "
                              f"4 single-hop, 5 adversarial)")
        listed = isinstance(questions, Sequence) and not isinstance(questions, str)
        if listed and len(questions) != len(Category):
            raise ConfigError(f"task.questions={list(questions)} must give one number (or null) per category 1-5")
        per_category = dict(zip(Category, questions)) if listed else {c: questions for c in categories}
        counts = per_category.items() if listed else [("", questions)]
        for key, value in [("groups", groups), ("max_tokens", max_tokens),
                           *((f"questions{f'[{c - 1}]' if c else ''}", n) for c, n in counts)]:
            whole_number(f"task.{key}", value, or_null=True)
        if file is not None and dataset != "locomo":
            raise ConfigError(f"task.file={file} reads LoCoMo's format: set task.dataset=locomo")
        self.dataset, self.categories = dataset, sorted({int(c) for c in categories})
        self.path = Path(file) if file else Path(data_dir or ".") / DEFAULT_FILE
        self.n_groups, self.per_category = groups, {int(c): n for c, n in per_category.items()}
        self.max_tokens = self.protocol.max_tokens if max_tokens is None else max_tokens
        self.first_line, self.trace_layers, self.seed = first_line, trace_layers, seed
        self.skipped: list[dict] = []

    @property
    def max_new_tokens(self) -> int:
        """The answer budget every question is asked with (the protocol's; harness.plugins.contracts.answer_budget)."""
        return self.protocol.answer_tokens

    def prompt_frames(self, tokenizer, run_style: str) -> list[tuple[str, str]]:
        """The protocol's instruction around a question and the style it is read in (harness.plugins.contracts)."""
        return [(self.protocol.instruction, self.protocol.prompt_style(tokenizer, run_style))]

    def samples(self) -> list[dict]:
        if self.dataset == "synthetic":
            return validated(synthetic_dialogue.generate(self.seed), "the embedded set")
        return read_file(self.path)

    def check(self) -> None:
        """Read and validate the file (ConfigError) before any model is loaded."""
        self.samples()

    def check_model(self, model_config, tokenizer) -> None:
        """Nothing of this task depends on the model."""

    def sampled(self, sample: dict) -> list[Question]:
        """The conversation's questions of the chosen categories in file order: per category all, or a sample
        drawn by a generator seeded by (seed, conversation) alone, so one category's sample does not depend on
        which others are asked."""
        chosen = []
        for category in self.categories:
            items = [(i, item) for i, item in enumerate(sample["qa"]) if item["category"] == category]
            n = self.per_category.get(category)
            if n is not None and len(items) > n:
                rng = random.Random(f"{self.seed}:{sample['sample_id']}")
                items = [items[i] for i in sorted(rng.sample(range(len(items)), n))]
            chosen += items
        return [Question(item["question"], gold(item), item["category"], evidence_sessions(item.get("evidence", [])),
                         index) for index, item in sorted(chosen, key=lambda pair: pair[0])]

    def groups(self, tokenizer) -> list[Conversation]:
        """Every conversation under the token limit (those at or over it skipped and counted), each with its
        questions of the chosen categories."""
        chosen, self.skipped = [], []
        for sample in self.samples():
            if self.n_groups is not None and len(chosen) == self.n_groups:
                break
            conversation = sample["conversation"]
            sessions = tuple((k, serialized(conversation, k)) for k in sessions_of(conversation))
            tokens = sum(token_count(tokenizer, text) for _, text in sessions)
            if self.max_tokens is not None and tokens >= self.max_tokens:
                self.skipped.append({"sample_id": sample["sample_id"], "tokens": tokens})
                continue
            questions = self.sampled(sample)
            if questions:
                chosen.append(Conversation(len(chosen), sample["sample_id"], sessions, tuple(questions), tokens))
        if not chosen:
            raise ConfigError(f"task.dataset={self.dataset}: no conversation under task.max_tokens="
                              f"{self.max_tokens} has a question of task.categories={self.categories}")
        return chosen

    def describe(self) -> dict:
        """For run.json: the protocol, the conversations left out for their length, and the question sample."""
        return {"protocol": str(self.protocol_name), "answer_tokens": self.max_new_tokens,
                "max_tokens": self.max_tokens, "skipped": self.skipped, "categories": self.categories,
                "questions_per_category": self.per_category, "first_line": self.first_line}

    def run_group(self, session, conversation: Conversation) -> Iterator[dict]:
        """Store every session in order (formed once per process: a sweep's methods store the same sessions),
        then ask each question over the final memory."""
        stored, updates = session.store_all((text for _, text in conversation.sessions), reuse=True)
        fids = dict(zip((k for k, _ in conversation.sessions), stored))
        style = self.protocol.prompt_style(session.tokenizer, session.prompt)
        for n, question in enumerate(conversation.questions):
            held = [fids[k] for k in question.evidence if k in fids]
            asked, options = self.protocol.ask(question, f"{self.seed}:{conversation.sample_id}")
            by_layer = self.evidence_ranks(session, session.prompt_ids(asked, style), held) \
                if self.trace_layers and held else {}
            answer = session.ask(asked, prompt=style, max_new_tokens=self.max_new_tokens, targets=tuple(held))
            prediction = self.protocol.reply(first_line(answer.text) if self.first_line else answer.text, options)
            yield {
                "group": conversation.index, "question_index": n, "sample_id": conversation.sample_id,
                "category": question.category, "question": question.text, "asked": asked, "gold": question.answer,
                **({"options": options} if options else {}),
                "output": answer.text, "prediction": prediction,
                "f1": score(prediction, question.answer, question.category),
                "f1_authors": None if question.category == Category.adversarial
                else longbench_f1(prediction, question.answer),
                "correct": contains(prediction, question.answer, question.category),
                "evidence_sessions": list(question.evidence), "memory_tokens": session.memory.n_tokens,
                "used_tokens": answer.memory_tokens, "conversation_tokens": conversation.tokens,
                "target_rank": best_rank(held, answer.densities),
                "seconds": {**(updates if n == 0 else {}), **answer.seconds}, **answer.peaks(),
                **({} if answer.read is None or not held else {"target_read": any(f in answer.read for f in held)}),
                **answer.ranked(),
                **({"evidence_rank_by_layer": by_layer} if by_layer else {}),
            }

    @staticmethod
    def evidence_ranks(session, prompt_ids, held: list[int]) -> dict[str, list[int]]:
        """Per query mode, the best density rank of an evidence session at every layer (1 = densest), from one
        trace of the question's prompt over the whole memory."""
        layers = list(range(num_layers(session.model.config)))
        rows = session.trace(session.memory, prompt_ids, layers)
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
    """Per category (and `by`): LoCoMo's F1 (x100) with its 95 % bootstrap interval resampling conversations (a
    conversation's questions share its memory), the authors' F1 (where recorded), the substring accuracy with
    its Wilson interval, the share of questions whose evidence session was read (where the method chooses
    fragments), the evidence's mean rank and what ranked it (a record's `ranked_by`: a retriever's own score,
    BM25, dense, oracle, recency or random; attention density where a record names none), seconds per question,
    and n."""
    frame = pd.DataFrame(records)
    frame["evidence_read"] = frame["target_read"] if "target_read" in frame else np.nan
    frame["f1_authors"] = frame["f1_authors"] if "f1_authors" in frame else np.nan
    frame["ranked_by"] = frame.get("ranked_by", pd.Series("density", index=frame.index)).fillna("density")
    frame["seconds_per_question"] = [sum(v for phase, v in s.items() if phase not in UPDATE_PHASES)
                                     for s in frame["seconds"]]
    rows = []
    for key, part in frame.groupby([*by, "category"], sort=True):
        mean, low, high = bootstrap_mean(part["f1"].to_numpy(dtype=float), part["sample_id"].to_numpy())
        judged = part["correct"].dropna()                     # category 5 has no answer to contain
        correct, n = int(judged.astype(bool).sum()), len(part)
        low_high = wilson(correct, len(judged)) if len(judged) else (np.nan, np.nan)
        read, ranked = part["evidence_read"].dropna(), part[part["target_rank"].notna()]
        rows.append({**dict(zip([*by, "category"], key if isinstance(key, tuple) else (key,))),
                     "f1": 100 * mean, "f1 low": 100 * low, "f1 high": 100 * high,
                     "f1 authors": 100 * part["f1_authors"].astype(float).mean(),
                     "accuracy": 100 * correct / len(judged) if len(judged) else np.nan,
                     "accuracy low": 100 * low_high[0], "accuracy high": 100 * low_high[1],
                     "evidence hit": 100 * read.astype(float).mean() if len(read) else np.nan,
                     "evidence rank": ranked["target_rank"].mean() if len(ranked) else np.nan,
                     "ranked by": ", ".join(sorted(set(ranked["ranked_by"]))),
                     "s/question": part["seconds_per_question"].mean(), "n": n})
    return pd.DataFrame(rows)


def locomo_table(records: list[dict]) -> pd.DataFrame:
    """`tab:locomo`: a row per run and category (records labelled with `run`), F1 and accuracy with their
    intervals (`50.0 [31.2, 68.8]`), the authors' F1, evidence hit, its rank and what ranked, seconds per
    question, n."""
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
    evidence session ranks within the first `hit_at` by density at that layer, with its Wilson interval (as the
    substring accuracy of `tab:locomo`); the last row names the best."""
    rates, shown = {}, {}
    for run in dict.fromkeys(r["run"] for r in records):
        traced = [r["evidence_rank_by_layer"] for r in records if r["run"] == run and "evidence_rank_by_layer" in r]
        for mode in QueryMode:
            if traced:
                hits = (np.array([t[mode] for t in traced]) <= hit_at).sum(axis=0)
                rates[f"{run} ({mode})"] = hits / len(traced)
                shown[f"{run} ({mode})"] = [with_interval(k / len(traced), *wilson(int(k), len(traced))) for k in hits]
    best = pd.DataFrame([pd.DataFrame(rates).idxmax()], index=["best layer"])
    return pd.concat([pd.DataFrame(shown), best]).rename_axis("layer")
