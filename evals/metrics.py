"""Answer-quality metrics that any task can use: a prediction against one or more gold answers,
the best over the golds, x100 as the paper prints them.

string match: a gold answer is a case-insensitive substring of the prediction (the authors');
F1: LongBench's `qa_f1_score` (SQuAD normalisation: lower case, no punctuation, no articles,
white space folded; token overlap); ROUGE-L: the `rouge-score` package's F-measure with stemming;
BERTScore: the `bert-score` package's F1, no baseline rescaling unless asked (the paper's setting).
"""

from __future__ import annotations

import importlib.util
import re
import string
from collections import Counter
from functools import cached_property
from pathlib import Path

from methods.errors import ConfigError
from methods.sources import MINILM, hub_reachable, minilm_folder, unavailable

METRICS = ("string_match", "f1", "rouge_l", "bertscore")


def string_match(prediction: str, golds: list[str]) -> float:
    text = prediction.lower()
    return 100.0 * any(gold.strip().lower() in text for gold in golds)


def normalize_answer(text: str) -> str:
    """SQuAD's (and LongBench's) answer normalisation."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def token_f1(prediction: str, gold: str) -> float:
    """LongBench's qa_f1_score for one gold answer, in 0..1."""
    predicted, wanted = normalize_answer(prediction).split(), normalize_answer(gold).split()
    same = sum((Counter(predicted) & Counter(wanted)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(wanted)
    return 2 * precision * recall / (precision + recall)


def f1(prediction: str, golds: list[str]) -> float:
    return 100.0 * max(token_f1(prediction, gold) for gold in golds)


class Rouge:
    """ROUGE-L F-measure with the Porter stemmer (`rouge-score`)."""

    @cached_property
    def scorer(self):
        from rouge_score import rouge_scorer

        return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)

    def __call__(self, prediction: str, golds: list[str]) -> float:
        return 100.0 * max(self.scorer.score(gold.strip(), prediction)["rougeL"].fmeasure for gold in golds)


class BertScore:
    """BERTScore F1 (x100) against the best gold. model: 'minilm' (shipped, offline; its last of 6 layers)
    or any model bert-score knows or a local folder (e.g. 'roberta-large', the paper's: layer 17);
    num_layers: the layer to read (None: bert-score's default for the model, the last for 'minilm')."""

    def __init__(self, model: str = MINILM, num_layers: int | None = None, rescale: bool = False):
        self.model, self.num_layers, self.rescale = model, num_layers, rescale

    def check(self) -> None:
        """Refuse what cannot load, before any work: the model, the layer read, the rescaling baseline."""
        source = str(minilm_folder("task.bertscore_model")) if self.model == MINILM else self.model
        why = unavailable(source)
        if why:
            raise ConfigError(f"task.bertscore_model={self.model!r} {why}")
        if self.num_layers is not None:
            from transformers import AutoConfig

            try:
                config = AutoConfig.from_pretrained(source, local_files_only=not hub_reachable())
            except (OSError, ValueError) as err:
                raise ConfigError(f"task.bertscore_model={self.model!r} has no readable config "
                                  f"({str(err).splitlines()[0]})") from None
            layers = getattr(config.get_text_config(), "num_hidden_layers", None)
            if not 1 <= self.num_layers <= (layers or self.num_layers):
                raise ConfigError(f"task.bertscore_layers={self.num_layers} must be >= 1 and <= {layers} (the layers "
                                  f"of {self.model}), or null for its default")
        if self.rescale and not (Path(importlib.util.find_spec("bert_score").origin).parent / "rescale_baseline" /
                                 "en" / f"{self.model}.tsv").is_file():
            raise ConfigError(f"task.bertscore_rescale=true needs bert-score's English baseline for "
                              f"task.bertscore_model={self.model!r}, and it ships none: use a model it has a baseline "
                              f"for (e.g. roberta-large) or task.bertscore_rescale=false")

    def describe(self) -> dict:
        """What the scores were computed with, for the results."""
        return {"bertscore_model": self.model, "bertscore_layers": self.layers, "bertscore_rescaled": self.rescale}

    @property
    def layers(self) -> int | None:
        """The layer read: the setting, else the shipped MiniLM's last, else bert-score's default for the model."""
        if self.num_layers is not None:
            return self.num_layers
        if self.model == MINILM:
            return 6
        from bert_score.utils import model2layers

        return model2layers.get(self.model)

    @cached_property
    def scorer(self):
        from bert_score import BERTScorer

        model = str(minilm_folder("task.bertscore_model")) if self.model == MINILM else self.model
        return BERTScorer(model_type=model, num_layers=self.layers, lang="en", rescale_with_baseline=self.rescale)

    def __call__(self, prediction: str, golds: list[str]) -> float:
        if not prediction.strip():
            return 0.0                  # bert-score's own value for an empty candidate (it cannot encode one)
        *_, f1s = self.scorer.score([prediction], [[gold.strip() for gold in golds]])
        return 100.0 * float(f1s[0])


class AnswerMetrics:
    """Every metric of one prediction: {name: score x100}."""

    def __init__(self, bertscore: BertScore):
        self.rouge, self.bertscore = Rouge(), bertscore

    def __call__(self, prediction: str, golds: list[str]) -> dict[str, float]:
        return {"string_match": string_match(prediction, golds), "f1": f1(prediction, golds),
                "rouge_l": self.rouge(prediction, golds), "bertscore": self.bertscore(prediction, golds)}
