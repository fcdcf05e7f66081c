"""LoCoMo's official question-answering score (Maharana et al., ACL 2024; snap-research/locomo, branch `code`,
`task_eval/evaluation.py`, `eval_question_answering`), reproduced so results compare with the papers that report
it. Held equal to values computed by that code on the cases of tests/testdata/locomo_scores.json.

Per category, as LoCoMo numbers them: 1 multi-hop (the answer's comma-separated parts, each scored by its best
predicted part, averaged), 2 temporal, 3 open-domain (the answer cut at its first ';'), 4 single-hop (token F1),
5 adversarial (1 when the prediction says the information is not there).

Normalization uses the `regex` package, as LoCoMo's code does, not `re`: their word boundary differs beyond ASCII
(`regex` counts a combining mark as a word character and a superscript, subscript or fraction digit as none; `re`
the reverse), so an article followed by a combining accent stays under `regex` and one followed by a superscript
two goes. The committed cases hold such text, scored by LoCoMo's own code.
"""

from __future__ import annotations

import functools
import string
from collections import Counter
from enum import IntEnum

import regex

Category = IntEnum("Category", ["multi_hop", "temporal", "open_domain", "single_hop", "adversarial"])
ABSTENTIONS = ("no information available", "not mentioned")    # what a category-5 answer must say
_PUNCTUATION = set(string.punctuation)


def normalized(text: str) -> str:
    """Commas removed, lower-cased, punctuation removed, the words a/an/the/and removed, spaces collapsed."""
    text = "".join(ch for ch in text.replace(",", "").lower() if ch not in _PUNCTUATION)
    return " ".join(regex.sub(r"\b(a|an|the|and)\b", " ", text).split())


@functools.cache
def _stemmer():
    """nltk's Porter stemmer, imported at the first LoCoMo score, not with every command."""
    from nltk.stem import PorterStemmer

    return PorterStemmer()


def stems(text: str) -> list[str]:
    return [_stemmer().stem(word) for word in normalized(text).split()]


def token_f1(prediction: str, answer: str) -> float:
    """F1 of the Porter-stemmed normalized tokens (0 when they share none)."""
    predicted, expected = stems(prediction), stems(answer)
    same = sum((Counter(predicted) & Counter(expected)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(expected)
    return 2 * precision * recall / (precision + recall)


def multi_answer_f1(prediction: str, answer: str) -> float:
    """Category 1: the mean over the answer's comma-separated parts of their best F1 against a predicted part."""
    predicted = [part.strip() for part in prediction.split(",")]
    parts = [part.strip() for part in answer.split(",")]
    return sum(max(token_f1(p, part) for p in predicted) for part in parts) / len(parts)


def score(prediction: str, answer, category: int) -> float:
    """LoCoMo's score of one prediction; `answer` as the data gives it (a number becomes its text)."""
    category = Category(category)
    answer = str(answer)
    if category == Category.adversarial:
        return float(any(phrase in prediction.lower() for phrase in ABSTENTIONS))
    if category == Category.multi_hop:
        return multi_answer_f1(prediction, answer)
    if category == Category.open_domain:
        answer = answer.split(";")[0].strip()
    return token_f1(prediction, answer)
