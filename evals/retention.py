"""Knowledge retention (paper Sec. 2.2 and 5.1), as its authors ran it.

A group stores its target context first, then `updates - 1` unrelated contexts
(the same sequence for every group); after each update (or at `eval_steps`) the
target's question is asked. Correct when the gold answer is a case-insensitive
substring of the output.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from evals import datasets
from evals.qa import QAItem
from evals.stats import wilson
from methods.errors import ConfigError
from methods.attention.tracing import ranks
from methods.tokens import cut, token_count


@dataclass(frozen=True)
class Group:
    index: int
    target: QAItem
    distractors: tuple[str, ...]

    def texts(self) -> list[str]:
        """What the group stores, in order: its target context, then the distractors."""
        return [self.target.context + "\n\n", *self.distractors]


def is_correct(answer: str, output: str) -> bool:
    return answer.strip().lower() in output.lower()


class Retention:
    """targets: items whose context fits `max_context_tokens` (seeded shuffle, first `groups`);
    distractors are cut to `max_context_tokens` tokens."""

    tables = ("tab:retention", "tab:retention_comparison", "tab:forgetting_rank", "tab:forgetting_seconds")
    marks_targets = True                  # each question names the stored fragment holding its answer
    updates_option = "task.updates"       # the option that sets the updates, as messages name it
    def __init__(self, dataset: datasets.Dataset = "synthetic", data_dir: str | None = None, groups: int = 20,
                 updates: int = 20, eval_steps: list[int] | None = None, shuffle: bool = True,
                 seed: int = 42, max_context_tokens: int = 512):
        if groups < 1 or updates < 1:
            raise ConfigError(f"task.groups={groups} and task.updates={updates} must both be >= 1")
        if eval_steps is not None and not eval_steps:
            raise ConfigError("task.eval_steps=[] asks at no step: list steps in 1..task.updates, "
                              "or null for every step")
        steps = sorted(set(eval_steps)) if eval_steps else range(1, updates + 1)    # lazy: a count is checked later
        if steps[0] < 1 or steps[-1] > updates:
            raise ConfigError(f"task.eval_steps={list(eval_steps)} must lie in 1..task.updates={updates}")
        self.dataset, self.data_dir, self.n_groups, self.updates = dataset, data_dir, groups, updates
        self.eval_steps, self.shuffle, self.seed = steps, shuffle, seed
        self.max_context_tokens = max_context_tokens

    def check(self) -> None:
        """Read and validate the data (ConfigError on a bad value) before any model is loaded."""
        datasets.load(self.dataset, self.data_dir, self.seed)

    def check_model(self, model_config, tokenizer) -> None:
        """Nothing of this task depends on the model."""

    def describe(self) -> dict:
        """For run.json: nothing beyond the config (every item asked fits task.max_context_tokens)."""
        return {}

    def groups(self, tokenizer) -> list[Group]:
        """The groups of this run; raises ConfigError when the data cannot supply them."""
        data = datasets.load(self.dataset, self.data_dir, self.seed)
        targets, unrelated = list(data.targets), list(data.unrelated)
        rng = random.Random(self.seed)
        rng.shuffle(targets)
        rng.shuffle(unrelated)
        fits = (t for t in targets if token_count(tokenizer, t.context, special=True) <= self.max_context_tokens)
        chosen = [t for _, t in zip(range(self.n_groups), fits)]
        if len(chosen) < self.n_groups or len(unrelated) < self.updates - 1:
            raise ConfigError(
                f"task.dataset={self.dataset!r} offers {len(chosen)} targets within {self.max_context_tokens} "
                f"tokens and {len(unrelated)} unrelated contexts; task.groups={self.n_groups} and "
                f"{self.updates_option}={self.updates} need {self.n_groups} and {self.updates - 1}")
        distractors = tuple(cut(tokenizer, u, self.max_context_tokens) + "\n\n" for u in unrelated[: self.updates - 1])
        return [Group(i, t, distractors) for i, t in enumerate(chosen)]

    def metrics(self, records: list[dict]):
        return accuracy_by_step(records)

    def run_group(self, session, group: Group) -> Iterator[dict]:
        """Store, shuffle, ask: one record per evaluated step."""
        generator = torch.Generator().manual_seed(self.seed * 100_003 + group.index)
        texts = group.texts()
        target_id = None
        stored = Counter()                  # seconds per phase of every store since the last question
        for step in range(1, self.updates + 1):
            fid = session.store(texts[step - 1], reuse=step > 1)     # distractors recur in every group
            stored.update(session.update_seconds)
            if step == 1:
                target_id = fid
            if self.shuffle:
                session.shuffle(generator)
            if step not in self.eval_steps:
                continue
            observed = self.observe(session, target_id, group)
            answer = session.ask(group.target.question, targets=(target_id,))
            ids = session.memory.ids()
            yield {
                "group": group.index, "step": step, "question": group.target.question,
                "gold": group.target.answer, "output": answer.text,
                "correct": is_correct(group.target.answer, answer.text),
                "memory_tokens": session.memory.n_tokens, "used_tokens": answer.memory_tokens,
                "target_tokens": session.memory.length_of(target_id),
                "target_rank": rank_of(target_id, answer.densities), **answer.ranked(),
                "target_position": ids.index(target_id) + 1 if target_id in ids else None,
                "seconds": {**stored, **answer.seconds}, **observed, **answer.peaks(),
                **({} if answer.read is None else {"target_read": target_id in answer.read}),
            }
            stored = Counter()

    def observe(self, session, target_id: int, group: Group) -> dict:
        """Extra fields for a step's record, taken before the question is answered (none here)."""
        return {}


def best_rank(fids, densities: dict[int, float]) -> int | None:
    """The best (lowest) rank among fragments `fids` (several may hold the answer), or None where none is ranked."""
    found = [r for r in (rank_of(fid, densities) for fid in fids) if r is not None]
    return min(found) if found else None


def rank_of(fid: int, densities: dict[int, float]) -> int | None:
    if fid not in densities:
        return None
    ids = list(densities)
    return int(ranks(torch.tensor([densities[i] for i in ids]))[ids.index(fid)])


def accuracy_by_step(records: list[dict]):
    """Metrics table: accuracy with its n and 95 % Wilson interval, mean target rank, and per step the memory
    tokens the answer read (`read_tokens`: what a selection keeps) beside those stored (`memory_tokens`)."""
    import pandas as pd

    frame = pd.DataFrame(records)
    read = {"read_tokens": ("used_tokens", "mean")} if "used_tokens" in frame else {}
    table = frame.groupby("step").agg(accuracy=("correct", "mean"), n=("correct", "size"),
                                      target_rank=("target_rank", "mean"), **read,
                                      memory_tokens=("memory_tokens", "mean")).reset_index()
    bounds = [wilson(int(round(a * n)), int(n)) for a, n in zip(table["accuracy"], table["n"])]
    table.insert(3, "accuracy_low", [low for low, _ in bounds])
    table.insert(4, "accuracy_high", [high for _, high in bounds])
    return table
