"""LongBench (paper Sec. 5.2, `tab:longbench`): a long context split into chunks, every chunk stored
in order as one fragment, then the question asked once; scored by string match, F1, ROUGE-L and BERTScore.

Data: `dataset=longbench` reads the six QA sets of the paper from `<data_dir>/longbench/` (LongBench's
official JSONL files, `<subset>.jsonl` or `data/<subset>.jsonl`, or a parquet mirror's files,
`<subset>.parquet` or `<subset>/**/*.parquet`), or with `hub_id` through `datasets` (online users);
`dataset=synthetic` generates the embedded set (`evals.synthetic_long`). Items whose context exceeds
`max_tokens` are skipped (the authors') or truncated in the middle (LongBench's own `pred.py`).

Chunking: `passages` splits at every "Passage N:" delimiter (multi-document sets); `sentences` ends a
chunk at the first sentence boundary (a token ending in a newline or a period) once it holds
`chunk_tokens` tokens, and merges a short last chunk into the one before (single-document sets);
`fixed` cuts every `chunk_tokens` tokens (MemoryLLM/M+'s injections). Chunks partition the context:
joined they give it back (a blank text before the first passage is dropped).
"""

from __future__ import annotations

import logging
import re
import string
from collections.abc import Iterator
from dataclasses import dataclass, replace
from enum import StrEnum
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd

from evals import synthetic_long
from evals.data_files import read_json, read_json_lines, text_fault
from evals.metrics import METRICS, AnswerMetrics, BertScore
from evals.retention import best_rank
from evals.stats import bootstrap_mean, paired_difference, with_interval
from methods.errors import ConfigError, one_of, whole_number
from methods.prompting import format_prompt
from methods.tokens import token_count

log = logging.getLogger(__name__)

# the paper's six sets and how each is chunked by default
PAPER_SUBSETS = {"2wikimqa": "passages", "hotpotqa": "passages", "musique": "passages",
                 "multifieldqa_en": "sentences", "narrativeqa": "sentences", "qasper": "sentences"}
EMBEDDED_SUBSETS = {"fictional_passages": "passages", "fictional_document": "sentences"}
SUBSETS = {"synthetic": EMBEDDED_SUBSETS, "longbench": PAPER_SUBSETS}
LongBenchDataset = StrEnum("LongBenchDataset", list(SUBSETS))
Chunking = StrEnum("Chunking", ["passages", "sentences", "fixed"])
Overflow = StrEnum("Overflow", ["skip", "truncate"])      # a context past max_tokens: skipped, or cut in the middle
Prompt = StrEnum("Prompt", ["plain", "longbench", "chat"])
AUTHORS_PROMPT = "Question: {input}\nAnswer:"
PROMPT_FILE, MAXLEN_FILE = "dataset2prompt.json", "dataset2maxlen.json"
PASSAGE = re.compile(r"Passage\s*+:?\s*+\d++\s*+:")       # possessive: no backtracking over long blanks
SENTENCE_ENDS = ("\n", ".", "\u3002")


@dataclass(frozen=True)
class Item:
    """One LongBench question, its context already cut into the fragments it is stored as."""
    index: int                    # the run's group index, running over the subsets in order
    subset: str
    id: str
    question: str
    answers: tuple[str, ...]
    chunks: tuple[str, ...]
    context_tokens: int           # before any truncation
    truncated: bool = False       # cut to task.max_tokens (task.overflow=truncate)
    subset_skipped: int = 0       # items of its subset left out for their length (task.overflow=skip)

    def texts(self) -> list[str]:
        return list(self.chunks)


# ---- chunking ---------------------------------------------------------------------------------

def split_passages(context: str) -> list[str]:
    """One chunk per "Passage N:" block (and the text before the first, unless blank)."""
    starts = [m.start() for m in PASSAGE.finditer(context)]
    if not starts:
        return [context]
    head = [context[: starts[0]]] if context[: starts[0]].strip() else []
    return head + [context[a:b] for a, b in zip(starts, starts[1:] + [len(context)])]


def _token_ends(tokenizer, context: str) -> list[int]:
    """The character offset at which each token of `context` ends."""
    encoded = tokenizer(context, add_special_tokens=False, return_offsets_mapping=True)
    return [end for _, end in encoded["offset_mapping"]]


def _cut(context: str, bounds: list[int]) -> list[str]:
    """`context` cut at the character offsets `bounds` (ascending, inside the text)."""
    edges = [0, *bounds, len(context)]
    return [context[a:b] for a, b in zip(edges, edges[1:])]


def split_sentences(context: str, tokenizer, min_tokens: int) -> list[str]:
    """Chunks of at least `min_tokens` tokens ending at a sentence boundary; a short last one merged."""
    ends = _token_ends(tokenizer, context)
    breaks = [i + 1 for i, end in enumerate(ends) if end > 0 and context[end - 1] in SENTENCE_ENDS]
    cuts, start = [], 0                     # cuts: token counts at which a chunk ends
    for point in breaks:
        if point - start >= min_tokens and point < len(ends):
            cuts.append(point)
            start = point
    if cuts and len(ends) - cuts[-1] < min_tokens:
        cuts.pop()                          # the tail is short: it joins the chunk before
    return _cut(context, [ends[c - 1] for c in cuts])


def split_fixed(context: str, tokenizer, size: int) -> list[str]:
    """Chunks of exactly `size` tokens (the last one shorter)."""
    ends = _token_ends(tokenizer, context)
    return _cut(context, [ends[c - 1] for c in range(size, len(ends), size)])


def chunk(context: str, tokenizer, chunking: str, chunk_tokens: int) -> list[str]:
    if chunking == "passages":
        return split_passages(context)
    if chunking == "sentences":
        return split_sentences(context, tokenizer, chunk_tokens)
    return split_fixed(context, tokenizer, chunk_tokens)


def truncate_middle(context: str, tokenizer, max_tokens: int) -> str:
    """The first and last max_tokens/2 tokens of `context` (LongBench's truncation)."""
    encoded = tokenizer(context, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    if len(encoded) <= max_tokens:
        return context
    head, tail = max_tokens // 2, max_tokens - max_tokens // 2
    return context[: encoded[head - 1][1]] + context[encoded[len(encoded) - tail][0]:]


# ---- data ---------------------------------------------------------------------------------------

def _read_parquet(paths: list[Path]) -> list[dict]:
    """Rows as plain Python values (lists, not arrays)."""
    import pyarrow
    import pyarrow.parquet

    try:
        return [row for path in paths for row in pyarrow.parquet.read_table(path).to_pylist()]
    except (pyarrow.ArrowException, OSError) as err:
        raise ConfigError(f"{paths[0]}: cannot be read as parquet ({err})") from None


def local_records(folder: Path, subset: str) -> list[dict]:
    """The records of `subset` under `folder`: official JSONL or a parquet mirror's files."""
    for path in (folder / f"{subset}.jsonl", folder / "data" / f"{subset}.jsonl"):
        if path.is_file():
            return read_json_lines(path)
    parquet = [folder / f"{subset}.parquet"] if (folder / f"{subset}.parquet").is_file() else \
        sorted((folder / subset).glob("**/*.parquet"))
    if parquet:
        return _read_parquet(parquet)
    raise ConfigError(f"task.subsets: no data for {subset!r} in {folder} (looked for {subset}.jsonl, "
                      f"data/{subset}.jsonl, {subset}.parquet, {subset}/**/*.parquet)")


def hub_records(hub_id: str, subset: str) -> list[dict]:
    """The test split of `subset` from a hub dataset with LongBench's fields (needs `datasets` and the network)."""
    try:
        from datasets import load_dataset
    except ImportError:
        raise ConfigError(f"task.hub_id={hub_id!r} needs the `datasets` package (pip install datasets)") from None
    return [dict(row) for row in load_dataset(hub_id, subset, split="test")]


def validated(records: list[dict], where: str) -> list[dict]:
    """Records with a non-empty string `input` (the question) and `context`, and a non-empty list of non-empty
    string `answers`."""
    if not records:
        raise ConfigError(f"{where}: holds no items")
    for i, record in enumerate(records):
        answers = record.get("answers") if isinstance(record, dict) else None
        if not isinstance(answers, (list, tuple)) or not answers:
            raise ConfigError(f"{where}: item {i} has no 'answers' (a non-empty list of strings)")
        for key, value in [("input", record.get("input")), ("context", record.get("context")),
                           *((f"answers[{j}]", answer) for j, answer in enumerate(answers))]:
            fault = text_fault(value)
            if fault:
                raise ConfigError(f"{where}: item {i} {key!r} {fault} (every question, context and answer needs "
                                  f"text)")
    return records


def template_fields(template) -> set[str] | None:
    """The {fields} a prompt template fills (None: not a string, or not a template str.format reads)."""
    if not isinstance(template, str):
        return None
    try:
        return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError:
        return None


# ---- the task -----------------------------------------------------------------------------------

class LongBench:
    """dataset: 'synthetic' (embedded) or 'longbench' (the paper's six sets); subsets: some of them
    (None: all); groups: items per subset, the first that fit, in file order (None: all);
    chunking: None = each subset's default; prompt: 'plain' (the authors' "Question: ... Answer:"),
    'longbench' (LongBench's template, its context part held by the memory) or 'chat' (that template's
    question part in the tokenizer's chat template); max_new_tokens: every subset's answer budget, None =
    each its dataset2maxlen.json's (the attribute `max_new_tokens` is the largest over the subsets)."""

    tables = ("tab:longbench",)
    marks_targets = True                  # the chunks holding a gold answer
    def __init__(self, dataset: LongBenchDataset = "synthetic", data_dir: str | None = None,
                 hub_id: str | None = None, subsets: list[str] | None = None, groups: int | None = None,
                 max_tokens: int = 16_384, overflow: Overflow = "skip", chunking: Chunking | None = None,
                 chunk_tokens: int = 256,
                 prompt: Prompt = "plain", max_new_tokens: int | None = None, seed: int = 42,
                 bertscore_model: str = "minilm", bertscore_layers: int | None = None, bertscore_rescale: bool = False):
        one_of("task.dataset", dataset, LongBenchDataset)
        known = SUBSETS[dataset]
        unknown = [s for s in subsets or [] if s not in known]
        if unknown or subsets == []:
            raise ConfigError(f"task.subsets={list(subsets)} must name some of {list(known)} (dataset={dataset}), "
                              "or be null for all")
        one_of("task.overflow", overflow, Overflow)
        one_of("task.prompt", prompt, Prompt)
        if chunking is not None:
            one_of("task.chunking", chunking, Chunking)
        for key, value in (("groups", groups), ("max_new_tokens", max_new_tokens)):
            whole_number(f"task.{key}", value, or_null=True)
        for key, value in (("max_tokens", max_tokens), ("chunk_tokens", chunk_tokens)):
            whole_number(f"task.{key}", value)
        self.dataset, self.subsets = dataset, list(subsets or known)
        self.folder = Path(data_dir or ".") / "longbench"
        self.hub_id, self.n_groups, self.max_tokens, self.overflow = hub_id, groups, max_tokens, overflow
        self.chunking, self.chunk_tokens, self.prompt, self.seed = chunking, chunk_tokens, prompt, seed
        self.answer_setting = max_new_tokens      # task.max_new_tokens; the attribute is the largest asked with
        self.bertscore = BertScore(bertscore_model, bertscore_layers, bertscore_rescale)

    def check(self) -> None:
        """Read and validate the data, templates and scorer (ConfigError) before any model is loaded."""
        for subset in self.subsets:
            self.records(subset)
        self.templates, self.answer_lengths     # read and checked here, once
        self.bertscore.check()

    def check_model(self, model_config, tokenizer) -> None:
        """A chat prompt needs the tokenizer's chat template."""
        if self.prompt == "chat":
            try:
                format_prompt(tokenizer, "?", "chat")
            except ValueError as err:
                raise ConfigError(f"task.prompt=chat: {err}") from None

    def records(self, subset: str) -> list[dict]:
        if self.dataset == "synthetic":
            return synthetic_long.generate(subset, self.seed)
        if self.hub_id:
            return validated(hub_records(self.hub_id, subset), f"{self.hub_id} {subset}")
        return validated(local_records(self.folder, subset), str(self.folder / subset))

    def _config_file(self, name: str) -> dict:
        path = self.folder / name
        if not path.is_file():
            raise ConfigError(f"missing {path} (LongBench's config/{name}; task.data_dir sets the folder)")
        table = read_json(path)
        if not isinstance(table, dict):
            raise ConfigError(f"{path} must hold a JSON object, one entry per subset")
        missing = [s for s in self.subsets if s not in table]
        if missing:
            raise ConfigError(f"{path} has no entry for {missing}")
        return table

    @cached_property
    def templates(self) -> dict[str, str]:
        """LongBench's prompt template per subset (read only where prompt is 'longbench' or 'chat')."""
        if self.prompt == "plain":
            return {}
        if self.dataset == "synthetic":
            return synthetic_long.PROMPTS
        table = self._config_file(PROMPT_FILE)
        for subset in self.subsets:
            fields = template_fields(table[subset])
            if fields != {"context", "input"}:
                raise ConfigError(f"{self.folder / PROMPT_FILE}: {subset!r} must be a string holding {{context}} "
                                  f"and {{input}} and no other field, not {table[subset]!r:.80}")
        return table

    @cached_property
    def answer_lengths(self) -> dict[str, int]:
        """max_new_tokens per subset: the setting (task.max_new_tokens), else LongBench's dataset2maxlen.json."""
        if self.answer_setting is not None:
            return {s: self.answer_setting for s in self.subsets}
        if self.dataset == "synthetic":
            return synthetic_long.MAX_NEW_TOKENS
        table = self._config_file(MAXLEN_FILE)
        for subset in self.subsets:
            whole_number(f"{self.folder / MAXLEN_FILE}: {subset!r}", table[subset])
        return table

    @property
    def max_new_tokens(self) -> int:
        """The largest answer budget a question of this run is asked with, over its subsets (the budget the window
        preflight counts, harness.plugins.contracts.answer_budget; a subset's own is `answer_lengths`)."""
        return max(self.answer_lengths[s] for s in self.subsets)

    def frame(self, subset: str) -> tuple[str, str]:
        """(the text around a question of `subset`, `{input}` where it goes; its prompt style for Session.ask):
        the template's part after its {context}."""
        if self.prompt == "plain":
            return AUTHORS_PROMPT, "raw"
        tail = self.templates[subset].split("{context}", 1)[-1].lstrip()
        return tail, "raw" if self.prompt == "longbench" else "chat"

    def question(self, item: Item) -> tuple[str, str]:
        """(prompt text, prompt style for Session.ask)."""
        text, style = self.frame(item.subset)
        return text.format(input=item.question), style

    def prompt_frames(self, tokenizer, run_style: str) -> list[tuple[str, str]]:
        """Each subset's frame (harness.plugins.contracts), `{question}` where the question goes."""
        return [(text.replace("{input}", "{question}"), style) for text, style in map(self.frame, self.subsets)]

    def groups(self, tokenizer) -> list[Item]:
        """Each subset's first `groups` items that fit (or are cut to) task.max_tokens; how many were left out
        or cut is logged, kept in `overflow` (run.json) and carried by the items (the table)."""
        items, self.overflow_counts = [], {}
        for subset in self.subsets:
            chunking = self.chunking or SUBSETS[self.dataset][subset]
            kept, skipped, truncated = [], 0, 0
            for n, record in enumerate(self.records(subset)):
                if self.n_groups is not None and len(kept) == self.n_groups:
                    break
                context = record["context"]
                tokens = token_count(tokenizer, context)
                if tokens > self.max_tokens:
                    if self.overflow == "skip":
                        skipped += 1
                        continue
                    context, truncated = truncate_middle(context, tokenizer, self.max_tokens), truncated + 1
                chunks = tuple(chunk(context, tokenizer, chunking, self.chunk_tokens))
                kept.append(Item(len(items) + len(kept), subset, str(record.get("_id", n)), record["input"],
                                 tuple(record["answers"]), chunks, tokens, tokens > self.max_tokens))
            if not kept:
                raise ConfigError(f"task.subsets: no item of {subset!r} fits task.max_tokens={self.max_tokens} "
                                  "(raise it, or set task.overflow=truncate)")
            items += [replace(item, subset_skipped=skipped) for item in kept]
            self.overflow_counts[subset] = {"items": len(kept), "skipped": skipped, "truncated": truncated}
            if skipped or truncated:
                log.warning("longbench %s: %d items longer than task.max_tokens=%d %s", subset, skipped or truncated,
                            self.max_tokens, "skipped" if skipped else "cut in the middle")
        return items

    def describe(self) -> dict:
        """For run.json: per subset, the items kept and how many were skipped or cut for their length."""
        return {"max_tokens": self.max_tokens, "overflow": self.overflow,
                "subsets": getattr(self, "overflow_counts", {})}

    @cached_property
    def scorer(self) -> AnswerMetrics:
        return AnswerMetrics(self.bertscore)

    def run_group(self, session, item: Item) -> Iterator[dict]:
        """Store every chunk in order, ask once."""
        ids, updates = session.store_all(item.chunks)
        holding = [fid for fid, chunk_text in zip(ids, item.chunks)
                   if any(a.strip().lower() in chunk_text.lower() for a in item.answers)]
        text, style = self.question(item)
        answer = session.ask(text, prompt=style, max_new_tokens=self.answer_lengths[item.subset], targets=holding)
        yield {
            "group": item.index, "subset": item.subset, "id": item.id, "question": item.question,
            "answers": list(item.answers), "output": answer.text, **self.scorer(answer.text, list(item.answers)),
            "chunks": len(item.chunks), "chunk_tokens": [session.memory.length_of(fid) for fid in ids
                                                         if fid in session.memory.ids()],
            "context_tokens": item.context_tokens, "truncated": item.truncated,
            "subset_skipped": item.subset_skipped, "memory_tokens": session.memory.n_tokens,
            "used_tokens": answer.memory_tokens,
            "answer_chunks": [ids.index(fid) for fid in holding],
            "target_rank": best_rank(holding, answer.densities), **answer.ranked(),
            "seconds": {**updates, **answer.seconds}, **answer.peaks(),
            **self.bertscore.describe(),
        }

    def metrics(self, records: list[dict]) -> pd.DataFrame:
        return scores_by_subset(records)


def scores_by_subset(records: list[dict], by: tuple[str, ...] = ("subset",)) -> pd.DataFrame:
    """Mean of every metric (x100) per subset (and `by`) with its 95 % bootstrap interval over the items
    (`<metric> low`, `<metric> high`), the answer chunk's mean rank, memory size, items, and how many items were
    cut (truncated) or left out (skipped) for their length."""
    frame = pd.DataFrame(records)
    for column in ("truncated", "subset_skipped"):            # runs from before these were recorded
        if column not in frame:
            frame[column] = 0
    table = frame.groupby(list(by), sort=False).agg(
        **{m: (m, "mean") for m in METRICS}, target_rank=("target_rank", "mean"),
        chunks=("chunks", "mean"), memory_tokens=("memory_tokens", "mean"), items=("f1", "size"),
        truncated=("truncated", "sum"), skipped=("subset_skipped", "max")).reset_index()
    for metric in METRICS:                                    # an item is one question over its own memory
        bounds = frame.groupby(list(by), sort=False)[metric].apply(
            lambda v: bootstrap_mean(v.to_numpy(), np.arange(len(v)))[1:]).tolist()
        table.insert(table.columns.get_loc(metric) + 1, f"{metric} low", [low for low, _ in bounds])
        table.insert(table.columns.get_loc(metric) + 2, f"{metric} high", [high for _, high in bounds])
    return table


PAIRED_METRIC, PAIRED_WITH = "f1", "vanilla"      # each run's F1 against vanilla's on the same items


def versus_reference(records: pd.DataFrame, subset: str, run: str) -> str:
    """The run's F1 minus the reference run's (the one run of `subset` whose `method` is PAIRED_WITH, whatever its
    row says besides) on the items both answered, with its paired bootstrap interval over the items; '' where
    `subset` has no such run, or several."""
    here = records[records["subset"] == subset]
    references = here.loc[here["method"] == PAIRED_WITH, "run"].unique()
    if len(references) != 1:
        return ""
    if run == references[0]:
        return "reference"
    pair = here[here["run"] == run].merge(here[here["run"] == references[0]], on="group", suffixes=("", "_ref"))
    difference, low, high = paired_difference(pair[f"{PAIRED_METRIC}_ref"], pair[PAIRED_METRIC], np.arange(len(pair)))
    return f"{difference:+.1f} [{low:+.1f}, {high:+.1f}]"


def longbench_table(records: list[dict]) -> pd.DataFrame:
    """`tab:longbench`: one block per set, a row per run (records labelled with their row, `run`, and their method's
    label, `method`), every metric with its interval (`50.0 [31.2, 68.8]`), and F1 against vanilla's on the same
    items."""
    table = scores_by_subset(records, ("subset", "run"))
    frame = pd.DataFrame(records)
    table[f"{PAIRED_METRIC} vs {PAIRED_WITH}"] = [versus_reference(frame, subset, run)
                                                  for subset, run in zip(table["subset"], table["run"])]
    first_seen = {subset: i for i, subset in enumerate(dict.fromkeys(table["subset"]))}
    table = table.sort_values("subset", key=lambda column: column.map(first_seen), kind="stable")
    for metric in METRICS:
        table[metric] = [with_interval(m / 100, lo / 100, hi / 100) for m, lo, hi in
                         zip(table[metric], table[f"{metric} low"], table[f"{metric} high"])]
    return table.set_index(["subset", "run"]).drop(columns=["chunks", "memory_tokens",
                                                            *(f"{m} {b}" for m in METRICS for b in ("low", "high"))])
