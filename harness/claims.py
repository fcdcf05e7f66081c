"""What the results' text may say when it compares two rows of a table.

Every comparison the text makes is a claim in RESULTS_DIR/claims.yaml: which table, model and dataset, which row
against which, at which step, and what the text says of it (`higher`, `lower` or `no measurable difference`).
A difference is stated only where the paired test on the same questions finds one: McNemar's exact p below
ALPHA on the questions one of the two rows alone answered right. `memdefrag report` renders each claim with
both accuracies, the difference and p from the runs, and refuses a claim whose words the runs do not bear out,
so no sentence in the generated text can say more than its table.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import pandas as pd
import yaml

from evals.stats import mcnemar
from harness.errors import ConfigError

ALPHA = 0.05
VERDICTS = ("higher", "lower", "no measurable difference")


@dataclass(frozen=True)
class Claim:
    table: str            # the table's label without `tab:` (rankers, peers)
    model: str
    dataset: str
    row: str              # the row's name in its table (a method or a ranker variant)
    against: str          # the row it is compared with, on the same questions
    step: int             # the update step both were asked at
    says: str             # what the text says of `row` against `against`: one of VERDICTS
    subject: str          # how the sentence names the comparison, for a reader

    def key(self, row: str) -> tuple[str, str, str, str]:
        return self.table, self.model, self.dataset, row


def read_claims(path: Path) -> list[Claim]:
    """The claims in `path` ([] where there is none); one line naming the entry and the fault otherwise."""
    if not path.is_file():
        return []
    entries = yaml.safe_load(path.read_text()) or []
    names = {f.name for f in fields(Claim)}
    claims = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or set(entry) != names:
            found = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
            raise ConfigError(f"{path} entry {i}: fields {found}, expected {sorted(names)}")
        if entry["says"] not in VERDICTS:
            raise ConfigError(f"{path} entry {i}: says={entry['says']!r} is not one of {list(VERDICTS)}")
        claims.append(Claim(**{k: v if k == "step" else str(v) for k, v in entry.items()}))
    return claims


@dataclass(frozen=True)
class Evidence:
    """Both rows at the claim's step on the questions both answered."""

    accuracy: float           # % of `row`
    against: float            # % of `against`
    p: float                  # McNemar's exact p
    n: int                    # questions paired

    @property
    def verdict(self) -> str:
        if self.p >= ALPHA:
            return "no measurable difference"
        return "higher" if self.accuracy > self.against else "lower"


def paired(frame: pd.DataFrame, other: pd.DataFrame, step: int, question: list[str]) -> Evidence:
    """Two rows' records (`step`, `correct` and the columns that name a question at a step, `question`) compared
    at `step` on the questions both answered."""
    pair = frame[frame["step"] == step][[*question, "correct"]].merge(
        other[other["step"] == step][[*question, "correct"]], on=question, suffixes=("", "_against"))
    mine, theirs = pair["correct"].astype(bool), pair["correct_against"].astype(bool)
    return Evidence(100 * mine.mean(), 100 * theirs.mean(), mcnemar(int((~mine & theirs).sum()),
                                                                    int((mine & ~theirs).sum())), len(pair))


def evidence(claim: Claim, records: dict[tuple, pd.DataFrame], question: list[str]) -> Evidence:
    """The paired accuracies of the claim's two rows from their records (see `paired`)."""
    frames = []
    for row in (claim.row, claim.against):
        frame = records.get(claim.key(row))
        if frame is None:
            raise ConfigError(f"claim {claim.subject!r}: no run makes row {row!r} of tab:{claim.table} for "
                              f"{claim.model} on {claim.dataset}")
        frames.append(frame)
    found = paired(*frames, claim.step, question)
    if found.n == 0:
        raise ConfigError(f"claim {claim.subject!r}: rows {claim.row!r} and {claim.against!r} share no question "
                          f"at step {claim.step}")
    return found


def sentence(claim: Claim, found: Evidence) -> str:
    """The claim as the text says it, with the numbers that back it."""
    return (f"{claim.subject} ({claim.model}, {claim.dataset}, n = {claim.step}): {found.accuracy:.1f} % against "
            f"{found.against:.1f} %, {found.accuracy - found.against:+.1f} points (McNemar's exact p {found.p:.2g}, "
            f"{found.n} questions): {claim.says}.")


def rendered(claims: list[Claim], records: dict[tuple, pd.DataFrame], table: str, question: list[str]) -> list[str]:
    """The sentences of `table`'s claims; a claim whose words the runs contradict is refused in one line."""
    out = []
    for claim in (c for c in claims if c.table == table):
        found = evidence(claim, records, question)
        if found.verdict != claim.says:
            raise ConfigError(f"claim {claim.subject!r} says {claim.says!r} but the runs say {found.verdict!r}: "
                              + sentence(claim, found).replace(f": {claim.says}.", "."))
        out.append(sentence(claim, found))
    return out
