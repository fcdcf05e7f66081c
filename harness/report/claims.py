"""What the results' text may say when it compares two rows of a table.

Every comparison the text makes is a claim in RESULTS_DIR/claims.yaml: which table, model and dataset, which row
against which, where in the table (the field its table pairs rows within: an update `step`, a LoCoMo `category`),
and what the text says of it (`higher`, `lower` or `no measurable difference`). Each table declares how its rows
are paired and tested (`TABLES`): the accuracy tables on the questions both rows answered at a step, by McNemar's
exact test (p below ALPHA on the questions one of the two alone answered right); tab:locomo on the questions both
asked in a category, by the paired bootstrap of the mean F1 difference that resamples conversations (a
conversation's questions share its memory), a difference where its 95 % interval excludes 0; a claim whose rows
pair fewer conversations than such an interval needs (FEWEST, evals.stats.fewest_groups) is refused, as no verdict
of it would be tested. `memdefrag report` renders each claim with its numbers from the runs and refuses a claim
whose words the runs do not bear out, so no sentence in the generated text can say more than its table.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from functools import partial
from itertools import combinations
from pathlib import Path

import pandas as pd
import yaml

from evals.locomo_scoring import Category
from evals.stats import CONFIDENCE, fewest_groups, mcnemar, paired_difference
from harness.errors import ConfigError

ALPHA = 0.05
VERDICTS = ("higher", "lower", "no measurable difference")
FEWEST = fewest_groups()          # groups (conversations) a bootstrap over them needs to state a difference


def key(table: str, model: str, dataset: str, row: str) -> tuple[str, str, str, str]:
    """How a claim names a row's records (Claim.key, keyed)."""
    return table, model, dataset, row


def keyed(table: str, rows: Iterable[tuple[tuple[str, str, str], pd.DataFrame]]) -> dict[tuple, pd.DataFrame]:
    """Rows' records, each given as ((model, dataset, name), records), as a claim on `table` names them."""
    return {key(table, *row): records for row, records in rows}


@dataclass(frozen=True)
class Claim:
    table: str            # the table's label without `tab:` or its `_<model>` end (retention, rankers, locomo...)
    model: str
    dataset: str          # tab:locomo: the protocol its rows name (protocol=locomo)
    row: str              # the row's name in its table (a method or a ranker variant)
    against: str          # the row it is compared with, on the same questions
    at: int               # where both are compared: the value of its table's `within` (a step, a category)
    says: str             # what the text says of `row` against `against`: one of VERDICTS
    subject: str          # how the sentence names the comparison, for a reader

    def key(self, row: str) -> tuple[str, str, str, str]:
        return key(self.table, self.model, self.dataset, row)


@dataclass(frozen=True)
class Accuracies:
    """Both rows' accuracy (%) on the questions both answered, McNemar's exact p on those one alone got right."""

    accuracy: float           # % of `row`
    against: float            # % of `against`
    p: float
    n: int                    # questions paired

    @classmethod
    def of(cls, pair: pd.DataFrame) -> Accuracies:
        mine, theirs = pair["mine"].astype(bool), pair["theirs"].astype(bool)
        return cls(100 * mine.mean(), 100 * theirs.mean(),
                   mcnemar(int((~mine & theirs).sum()), int((mine & ~theirs).sum())), len(pair))

    @property
    def verdict(self) -> str:
        if self.p >= ALPHA:
            return "no measurable difference"
        return "higher" if self.accuracy > self.against else "lower"

    def numbers(self) -> str:
        return (f"{self.accuracy:.1f} % against {self.against:.1f} %, {self.accuracy - self.against:+.1f} points "
                f"(McNemar's exact p {self.p:.2g}, {self.n} questions)")


@dataclass(frozen=True)
class F1s:
    """Both rows' mean F1 (x100) on the questions both asked, and the mean difference with its 95 % paired
    bootstrap interval resampling the groups (LoCoMo's conversations): a difference where it excludes 0 (a claim
    is tested so only over FEWEST groups or more: `evidence` refuses one over fewer)."""

    f1: float                 # of `row`
    against: float            # of `against`
    difference: float
    low: float
    high: float
    n: int                    # questions paired
    groups: int               # conversations they come from

    @classmethod
    def of(cls, pair: pd.DataFrame, group: str) -> F1s:
        difference, low, high = paired_difference(pair["theirs"], pair["mine"], pair[group].to_numpy())
        return cls(100 * pair["mine"].mean(), 100 * pair["theirs"].mean(), 100 * difference, 100 * low, 100 * high,
                   len(pair), pair[group].nunique())

    @property
    def verdict(self) -> str:
        if self.low <= 0 <= self.high:
            return "no measurable difference"
        return "higher" if self.difference > 0 else "lower"

    def numbers(self) -> str:
        return (f"F1 {self.f1:.1f} against {self.against:.1f}, {self.difference:+.1f} points ({100 * CONFIDENCE:.0f} % "
                f"paired bootstrap interval over conversations [{self.low:+.1f}, {self.high:+.1f}], {self.n} "
                f"questions of {self.groups} conversations)")


Evidence = Accuracies | F1s


@dataclass(frozen=True)
class Pairing:
    """How a table's rows are compared: within one value of the record column `within` (a claim's entry names it
    under that name; `allowed`: the values it may take and their names, None: any whole number), on the questions
    both rows have there (`question`: the columns that name one, once in a row), `value` of each paired and tested
    by `test`. `same`: columns a question's two records must agree on (`unlike`: why they may not). `groups`: the
    column naming the groups `test` resamples (`counted`: what they are), which a claim's rows must pair FEWEST of."""

    within: str
    question: tuple[str, ...]
    value: str
    test: Callable[[pd.DataFrame], Evidence]      # on the paired questions, `mine` and `theirs` their values
    named: str                                    # how a sentence names `within`'s value
    rule: str                                     # when the text may state a difference
    allowed: dict[int, str] | None = None
    same: tuple[str, ...] = ()
    unlike: str = ""
    groups: str | None = None
    counted: str = ""

    def paired(self, frame: pd.DataFrame, other: pd.DataFrame, at: int,
               names: tuple[str, str] = ("mine", "theirs")) -> pd.DataFrame:
        """The questions two rows' records (the rows `names`) both have at `at`, with each row's value (`mine`,
        `theirs`); a question one row holds twice, or whose two records differ in `same`, refused in one line."""
        sides = []
        for records, side, name in zip((frame, other), ("mine", "theirs"), names):
            part = records[records[self.within] == at][[*self.question, *self.same, self.value]]
            twice = part[part.duplicated(list(self.question))]
            if not twice.empty:
                raise ConfigError(f"row {name!r} asks {self.which(twice.iloc[0])} twice at {self.named.format(at)}, "
                                  f"so its questions do not pair one to one")
            sides.append(part.rename(columns={self.value: side, **{c: f"{c} {side}" for c in self.same}}))
        pair = sides[0].merge(sides[1], on=list(self.question), validate="one_to_one")
        for column in self.same:
            unlike = pair[pair[f"{column} mine"] != pair[f"{column} theirs"]]
            if not unlike.empty:
                first = unlike.iloc[0]
                raise ConfigError(f"rows {names[0]!r} and {names[1]!r} differ at {self.which(first, ())} "
                                  f"({column} {first[f'{column} mine']!r} against {first[f'{column} theirs']!r}): "
                                  f"{self.unlike}")
        return pair.rename(columns={f"{c} mine": c for c in self.same}).drop(
            columns=[f"{c} theirs" for c in self.same])

    def which(self, record: pd.Series, same: tuple[str, ...] | None = None) -> str:
        """A question as its record names it: its `question` columns (and `same`'s, unless told)."""
        values = {c: record[c] for c in (*self.question, *(self.same if same is None else same))}
        return ", ".join(f"{c}={getattr(v, 'item', lambda: v)()!r}" for c, v in values.items())   # numpy's as Python's

    def compare(self, frame: pd.DataFrame, other: pd.DataFrame, at: int) -> Evidence:
        return self.test(self.paired(frame, other, at))


STEPS = Pairing("step", ("seed", "group"), "correct", Accuracies.of, "n = {}",
                f"McNemar's exact p < {ALPHA} on the same questions")
# A LoCoMo question is its conversation and its place among the conversation's sampled questions (question_index:
# file order within the categories and per-category sample asked). Its text is no key: LoCoMo's released file
# repeats questions within a conversation (conv-48 asks eleven single-hop questions twice, conv-30 one as single-hop
# and as adversarial). The place is unique in a run, and in two runs that sampled the same questions with the same
# seed (one file, task.seed, task.categories, task.questions: a conversation's sample depends on nothing else) it
# names the same question; runs that sampled otherwise may put other questions there, so both records' text must
# agree (such runs are refused, never paired on the wrong question).
CATEGORIES = Pairing("category", ("sample_id", "question_index"), "f1", partial(F1s.of, group="sample_id"),
                     "category {}", f"the {100 * CONFIDENCE:.0f} % interval of the mean F1 difference on the same "
                     f"questions, resampling {FEWEST} conversations or more, excludes 0",
                     allowed={c.value: c.name.replace("_", "-") for c in Category}, same=("question",),
                     unlike="their runs sampled other questions (task.seed, task.categories or task.questions), so "
                            "their question_index names no common question", groups="sample_id",
                     counted="conversations")
TABLES = {"retention": STEPS, "retention_comparison": STEPS, "rankers": STEPS,   # how each table's rows compare
          "peers": STEPS, "locomo": CATEGORIES}


def read_claims(path: Path) -> list[Claim]:
    """The claims in `path` ([] where there is none); one line naming the entry and the fault otherwise."""
    if not path.is_file():
        return []
    entries = yaml.safe_load(path.read_text()) or []
    if not isinstance(entries, list):
        raise ConfigError(f"{path}: a {type(entries).__name__}, expected a list of claims")
    claims = []
    for i, entry in enumerate(entries):
        where = f"{path} entry {i}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: {entry!r} is a {type(entry).__name__}, not a claim (a mapping with the "
                              f"fields table, model, dataset, row, against, says, subject and its table's "
                              f"{' or '.join(sorted({p.within for p in TABLES.values()}))})")
        table = entry.get("table")
        if not isinstance(table, str) or table not in TABLES:
            raise ConfigError(f"{where}: table {table!r}, expected a table of {sorted(TABLES)}")
        pairing = TABLES[table]
        names = {f.name for f in fields(Claim)} - {"at"} | {pairing.within}
        if set(entry) != names:
            raise ConfigError(f"{where}: fields {sorted(map(str, entry))}, expected {sorted(names)} for tab:{table}")
        if entry["says"] not in VERDICTS:
            raise ConfigError(f"{where}: says={entry['says']!r} is not one of {list(VERDICTS)}")
        at = entry[pairing.within]
        if not isinstance(at, int) or isinstance(at, bool) or (pairing.allowed and at not in pairing.allowed):
            allowed = pairing.allowed
            expected = "a whole number" if allowed is None else (
                f"one of {min(allowed)}-{max(allowed)} ({', '.join(f'{k} {v}' for k, v in allowed.items())})")
            raise ConfigError(f"{where}: {pairing.within}={at!r} is not {expected}")
        claims.append(Claim(**{k: str(v) for k, v in entry.items() if k != pairing.within}, at=at))
    return claims


def evidence(claim: Claim, records: dict[tuple, pd.DataFrame]) -> Evidence:
    """The claim's two rows compared from their records as their table pairs them (`TABLES`); a claim whose rows
    pair fewer groups than a difference over them needs (FEWEST) refused, since no verdict of it is tested."""
    frames = []
    for row in (claim.row, claim.against):
        frame = records.get(claim.key(row))
        if frame is None:
            raise ConfigError(f"claim {claim.subject!r}: no run makes row {row!r} of tab:{claim.table} for "
                              f"{claim.model} on {claim.dataset}")
        frames.append(frame)
    pairing = TABLES[claim.table]
    where = pairing.named.format(claim.at)
    try:
        pair = pairing.paired(*frames, claim.at, names=(claim.row, claim.against))
    except ConfigError as err:
        raise ConfigError(f"claim {claim.subject!r}: {err}") from None
    if pair.empty:
        raise ConfigError(f"claim {claim.subject!r}: rows {claim.row!r} and {claim.against!r} share no question "
                          f"at {pairing.within} {claim.at}")
    if pairing.groups and pair[pairing.groups].nunique() < FEWEST:
        raise ConfigError(f"claim {claim.subject!r}: rows {claim.row!r} and {claim.against!r} pair "
                          f"{pair[pairing.groups].nunique()} {pairing.counted} at {where}, and a difference over "
                          f"{pairing.counted} needs at least {FEWEST} (evals.stats.fewest_groups): no verdict of "
                          f"it is tested")
    return pairing.test(pair)


def paired_groups(records: dict[tuple, pd.DataFrame], table: str) -> dict[tuple[str, str], int]:
    """Per model and dataset of `table`'s rows (`records` keyed as Claim.key names them), the most groups (its
    pairing's `groups`: LoCoMo's conversations) any two of those rows pair at one value of `within`: the most a
    claim there could be tested over (0 where no two rows pair)."""
    pairing = TABLES[table]
    place = 1 + pairing.question.index(pairing.groups)
    rows: dict[tuple[str, str], list[set]] = {}
    for (_, model, dataset, _), frame in records.items():
        questions = frame[[pairing.within, *pairing.question]].itertuples(index=False, name=None)
        rows.setdefault((model, dataset), []).append(set(questions))
    most = {}
    for where, questions in rows.items():
        counts = [0]
        for mine, theirs in combinations(questions, 2):
            counts += Counter(q[0] for q in {(q[0], q[place]) for q in mine & theirs}).values()
        most[where] = max(counts)
    return most


def sentence(claim: Claim, found: Evidence) -> str:
    """The claim as the text says it, with the numbers that back it."""
    where = TABLES[claim.table].named.format(claim.at)
    return f"{claim.subject} ({claim.model}, {claim.dataset}, {where}): {found.numbers()}: {claim.says}."


def rendered(claims: list[Claim], records: dict[tuple, pd.DataFrame], table: str) -> list[str]:
    """The sentences of `table`'s claims; a claim whose words the runs contradict is refused in one line."""
    out = []
    for claim in (c for c in claims if c.table == table):
        found = evidence(claim, records)
        if found.verdict != claim.says:
            raise ConfigError(f"claim {claim.subject!r} says {claim.says!r} but the runs say {found.verdict!r}: "
                              + sentence(claim, found).replace(f": {claim.says}.", "."))
        out.append(sentence(claim, found))
    return out


def refuse_undrawn(path: Path, table: str, models: set[str]) -> None:
    """One line for a claim on `table`, a table the report draws once per model, whose model has none: it would be
    checked nowhere (`supported` with `model` renders each model's claims under its own table)."""
    for claim in read_claims(path):
        if claim.table == table and claim.model not in models:
            raise ConfigError(f"claim {claim.subject!r}: no run makes a tab:{table} table for model {claim.model!r} "
                              f"(the models with one: {sorted(models)})")


def supported(path: Path, table: str, records: dict[tuple, pd.DataFrame], model: str | None = None) -> str:
    """The claims of `path` on `table` (its rows' records keyed as Claim.key names them), each with its numbers,
    as a list under 'What the table supports' ('' where none is made); model: only the claims on that model's rows
    (a table the report draws once per model)."""
    claims = [c for c in read_claims(path) if model in (None, c.model)]
    sentences = rendered(claims, records, table)
    if not sentences:
        return ""
    return (f"\n\nWhat the table supports (`claims.yaml`; a difference only where {TABLES[table].rule}):\n\n"
            + "\n".join(f"- {s}" for s in sentences))
