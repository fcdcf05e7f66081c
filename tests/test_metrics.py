"""The answer metrics against values worked out by hand (x100, best over the gold answers)."""

import pytest

from evals.metrics import AnswerMetrics, BertScore, Rouge, f1, normalize_answer, string_match, token_f1


def test_string_match_is_a_case_insensitive_substring_of_any_gold():
    assert string_match("The capital is QUENBY, a port.", ["Paris", " quenby "]) == 100.0
    assert string_match("The capital is Quenb.", ["Quenby"]) == 0.0


def test_normalisation_drops_case_punctuation_articles_and_extra_space():
    assert normalize_answer("The  Cat's, a hat!") == "cats hat"
    assert normalize_answer("An apple-pie; THE end.") == "applepie end"


def test_f1_counts_shared_tokens_after_normalisation():
    # prediction "cat sat on mat" (4 tokens) against gold "cat on mat" (3): 3 shared, P = 3/4, R = 1
    assert token_f1("the cat sat on the mat", "a cat on a mat") == pytest.approx(2 * 0.75 / 1.75)
    # repeated tokens count as often as both sides hold them: "a a b" vs "a b b": 2 shared, P = R = 2/3
    assert token_f1("x x y", "x y y") == pytest.approx(2 / 3)
    assert token_f1("", "cat") == 0.0 and token_f1("dog", "cat") == 0.0
    assert f1("Quenby.", ["a harbour town", "quenby"]) == pytest.approx(100.0)


def test_rouge_l_is_the_stemmed_longest_common_subsequence_f_measure():
    # stems: the cat were sit | the cat sat: LCS 2, P = 2/4, R = 2/3, F = 4/7
    assert Rouge()("the cats were sitting", ["the cat sat"]) == pytest.approx(100 * 4 / 7)
    assert Rouge()("the cats were sitting", ["dog", "the cats were sitting"]) == pytest.approx(100.0)


def test_bertscore_runs_offline_on_the_shipped_minilm():
    score = BertScore()
    score.check()
    assert score.describe() == {"bertscore_model": "minilm", "bertscore_layers": 6, "bertscore_rescaled": False}
    same = score("Quenby is a harbour town.", ["Quenby is a harbour town."])
    related = score("Quenby, a port town", ["Quenby is a harbour town."])
    unrelated = score("seventeen green bicycles", ["Quenby is a harbour town."])
    assert same == pytest.approx(100.0, abs=1e-3)
    assert 0 < unrelated < related < same
    assert score("", ["Quenby"]) == 0.0
    assert score("Quenby", ["nothing alike", "Quenby"]) == pytest.approx(100.0, abs=1e-3)   # the best gold


def test_every_metric_of_one_prediction():
    scores = AnswerMetrics(BertScore())("the cat sat", ["the cat sat"])
    assert scores.keys() == {"string_match", "f1", "rouge_l", "bertscore"}
    assert all(value == pytest.approx(100.0, abs=1e-3) for value in scores.values())


def test_the_paper_bertscore_model_reads_bert_scores_default_layer():
    assert BertScore("roberta-large").describe() == {"bertscore_model": "roberta-large", "bertscore_layers": 17,
                                                     "bertscore_rescaled": False}
