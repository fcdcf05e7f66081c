"""What the results' text may say when it compares two rows of a table.

Every comparison the text makes is a claim in RESULTS_DIR/claims.yaml: which table, model and dataset, which row
against which, where in the table (the field its table pairs rows within: an update `step`, a LoCoMo `category`),
and what the text says of it (`higher`, `lower` or `no measurable difference`). Each table declares how its rows
are paired and tested (`TABLES`): the accuracy tables on the questions both rows answered at a step, by McNemar's
exact test (p below ALPHA on the questions one of the two alone answered right); tab:locomo on the questions both
asked in a category, by the paired bootstrap of the mean F1 difference that resamples conversations (a
conversation's questions share its memory), a difference where its 95 % interval excludes 0 over enough
conversations for an interval to say more than their range (FEWEST). `memdefrag report` renders each claim with
its numbers from the runs and refuses a claim whose words the runs do not bear out, so no sentence in the
generated text can say more than its table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import partial
from itertools import count
from pathlib import Path

import pandas as pd
import yaml

from evals.stats import CONFIDENCE, mcnemar, paired_difference, resolves
from harness.errors import ConfigError

ALPHA = 0.05
VERDICTS = ("higher", "lower", "no measurable difference")
FEWEST = next(k for k in count(1) if resolves(k))       # groups a bootstrap needs to state a difference


@dataclass(frozen=True)
class Claim:
    table: str            # the table's label without `tab:` (rankers, peers, locomo)
    model: str
    dataset: str          # tab:locomo: the protocol its rows name (protocol=locomo)
    row: str              # the row's name in its table (a method or a ranker variant)
    against: str          # the row it is compared with, on the same questions
    at: int               # where both are compared: the value of its table's `within` (a step, a category)
    says: str             # what the text says of `row` against `against`: one of VERDICTS
    subject: str          # how the sentence names the comparison, for a reader

    def key(self, row: str) -> tuple[str, str, str, str]:
        return self.table, self.model, self.dataset, row


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
    bootstrap interval resampling the groups (LoCoMo's conversations): a difference where it excludes 0 and the
    groups are enough for an interval to say more than their range (evals.stats.resolves)."""

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
        if self.low <= 0 <= self.high or not resolves(self.groups):
            return "no measurable difference"
        return "higher" if self.difference > 0 else "lower"

    def numbers(self) -> str:
        few = "" if resolves(self.groups) else f"; under {FEWEST} the interval is only the range of their own means"
        return (f"F1 {self.f1:.1f} against {self.against:.1f}, {self.difference:+.1f} points ({100 * CONFIDENCE:.0f} % "
                f"paired bootstrap interval over conversations [{self.low:+.1f}, {self.high:+.1f}], {self.n} "
                f"questions of {self.groups} conversations{few})")


Evidence = Accuracies | F1s


@dataclass(frozen=True)
class Pairing:
    """How a table's rows are compared: within one value of the record column `within` (a claim's entry names it
    under that name), on the questions both rows have there (`question`: the columns that name one), `value` of
    each paired and tested by `test`."""

    within: str
    question: tuple[str, ...]
    value: str
    test: Callable[[pd.DataFrame], Evidence]      # on the paired questions, `mine` and `theirs` their values
    named: str                                    # how a sentence names `within`'s value
    rule: str                                     # when the text may state a difference

    def paired(self, frame: pd.DataFrame, other: pd.DataFrame, at: int) -> pd.DataFrame:
        """The questions two rows' records both have at `at`, with each row's value (`mine`, `theirs`)."""
        columns = [*self.question, self.value]
        return frame[frame[self.within] == at][columns].rename(columns={self.value: "mine"}).merge(
            other[other[self.within] == at][columns].rename(columns={self.value: "theirs"}), on=list(self.question))

    def compare(self, frame: pd.DataFrame, other: pd.DataFrame, at: int) -> Evidence:
        return self.test(self.paired(frame, other, at))


STEPS = Pairing("step", ("seed", "group"), "correct", Accuracies.of, "n = {}",
                f"McNemar's exact p < {ALPHA} on the same questions")
CATEGORIES = Pairing("category", ("sample_id", "question"), "f1", partial(F1s.of, group="sample_id"), "category {}",
                     f"the {100 * CONFIDENCE:.0f} % interval of the mean F1 difference on the same questions, "
                     f"resampling {FEWEST} conversations or more, excludes 0")
TABLES = {"rankers": STEPS, "peers": STEPS, "locomo": CATEGORIES}     # how each table's rows are compared


def read_claims(path: Path) -> list[Claim]:
    """The claims in `path` ([] where there is none); one line naming the entry and the fault otherwise."""
    if not path.is_file():
        return []
    entries = yaml.safe_load(path.read_text()) or []
    claims = []
    for i, entry in enumerate(entries):
        where = f"{path} entry {i}"
        if not isinstance(entry, dict) or entry.get("table") not in TABLES:
            found = f"table {entry.get('table')!r}" if isinstance(entry, dict) else type(entry).__name__
            raise ConfigError(f"{where}: {found}, expected a table of {sorted(TABLES)}")
        within = TABLES[entry["table"]].within
        names = {f.name for f in fields(Claim)} - {"at"} | {within}
        if set(entry) != names:
            raise ConfigError(f"{where}: fields {sorted(entry)}, expected {sorted(names)} for tab:{entry['table']}")
        if entry["says"] not in VERDICTS:
            raise ConfigError(f"{where}: says={entry['says']!r} is not one of {list(VERDICTS)}")
        if not isinstance(entry[within], int) or isinstance(entry[within], bool):
            raise ConfigError(f"{where}: {within}={entry[within]!r} is not a whole number")
        claims.append(Claim(**{k: str(v) for k, v in entry.items() if k != within}, at=entry[within]))
    return claims


def evidence(claim: Claim, records: dict[tuple, pd.DataFrame]) -> Evidence:
    """The claim's two rows compared from their records as their table pairs them (`TABLES`)."""
    frames = []
    for row in (claim.row, claim.against):
        frame = records.get(claim.key(row))
        if frame is None:
            raise ConfigError(f"claim {claim.subject!r}: no run makes row {row!r} of tab:{claim.table} for "
                              f"{claim.model} on {claim.dataset}")
        frames.append(frame)
    pairing = TABLES[claim.table]
    pair = pairing.paired(*frames, claim.at)
    if pair.empty:
        raise ConfigError(f"claim {claim.subject!r}: rows {claim.row!r} and {claim.against!r} share no question "
                          f"at {pairing.within} {claim.at}")
    return pairing.test(pair)


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


def supported(path: Path, table: str, records: dict[tuple, pd.DataFrame]) -> str:
    """The claims of `path` on `table` (its rows' records keyed as Claim.key names them), each with its numbers,
    as a list under 'What the table supports' ('' where none is made)."""
    sentences = rendered(read_claims(path), records, table)
    if not sentences:
        return ""
    return (f"\n\nWhat the table supports (`claims.yaml`; a difference only where {TABLES[table].rule}):\n\n"
            + "\n".join(f"- {s}" for s in sentences))
