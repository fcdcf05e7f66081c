"""LoCoMo's official QA score, reproduced: equal on every case to values computed by LoCoMo's own
evaluation code (tests/testdata/locomo_scores.json: 720 cases over the five categories, 80 of them with combining
marks, superscript, subscript and fraction digits and zero-width joiners beside articles; made outside the
project by running snap-research/locomo's `eval_question_answering` on them)."""

import json
from pathlib import Path

import pytest

from evals.locomo_scoring import normalized, score, token_f1

CASES = json.loads((Path(__file__).parent / "testdata" / "locomo_scores.json").read_text())["cases"]


def test_every_case_scores_as_locomos_own_code():
    different = [(c["prediction"], c["answer"], c["category"], c["score"], score(c["prediction"], c["answer"],
                                                                               c["category"]))
                 for c in CASES if score(c["prediction"], c["answer"], c["category"]) != pytest.approx(c["score"],
                                                                                                     abs=1e-12)]
    assert len(CASES) >= 400 and {c["category"] for c in CASES} == {1, 2, 3, 4, 5}
    assert different == []


def test_the_rules_one_by_one():
    assert normalized("The Cat, and a DOG!") == "cat dog"
    assert token_f1("running dogs", "the dog runs") == 1.0                   # Porter stems on both sides
    assert score("Paris, London", "London, Rome", 1) == 0.5                   # per answer part, its best match
    assert score("Paris", "Paris; or maybe Rome", 3) == 1.0                   # category 3: cut at ';'
    assert score("It is not mentioned.", "anything", 5) == 1.0 and score("Paris", "x", 5) == 0.0
    assert score("2022", 2022, 2) == 1.0                                      # a number answer is its text
    with pytest.raises(ValueError):
        score("x", "x", 6)


def test_word_boundaries_beyond_ascii_are_those_of_the_regex_package_locomo_uses():
    """`regex`, not `re`: a combining mark is a word character (the article stays), a superscript, subscript or
    fraction digit is not (the article goes); `re` holds the reverse."""
    assert normalized("the\u0301 cat") == "the\u0301 cat" and normalized("x\u0301and y") == "x\u0301and y"
    assert normalized("a\u00b2 dog") == "\u00b2 dog" and normalized("the\u00bd") == "\u00bd"
    assert normalized("an\u2082") == "\u2082" and normalized("the\u200d end") == "the\u200d end"
    unicode = [c for c in CASES if any(ord(ch) > 0x2ff and not ch.isalpha() for ch in c["prediction"] + str(c["answer"]))]
    assert len(unicode) >= 40
