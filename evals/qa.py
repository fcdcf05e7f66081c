"""What a knowledge-retention dataset holds, whether read from files or generated."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class QAItem:
    context: str
    question: str
    answer: str


@dataclass(frozen=True)
class RetentionData:
    targets: list[QAItem]
    unrelated: list[str]
