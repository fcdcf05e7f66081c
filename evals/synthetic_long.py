"""An embedded long-context set in the LongBench format, so `task=longbench` runs with no data.

Two subsets, built from the fictional paragraphs of `evals.synthetic` (no model can know them;
each answer is an invented name that occurs once in the whole context):
- `fictional_passages` (multi-document, like HotpotQA): "Passage N:" blocks, one paragraph each; one
  passage, at a seeded position, holds the fact asked about, the others are distractors.
- `fictional_document` (single document, like MultiFieldQA): one register of paragraphs separated by
  newlines, the fact mid-way (in the middle fifth of the document).
Item lengths cycle through PARAGRAPHS: about 2k to 15k tokens with SmolLM2's tokenizer (~124 tokens a
paragraph). Records carry LongBench's fields (`input`, `context`, `answers`, `length` in words,
`dataset`, `language`, `all_classes`, `_id`); generation is deterministic in the seed.
"""

from __future__ import annotations

import hashlib
import random

from evals.synthetic import QUESTIONS, paragraph, person

PARAGRAPHS = (16, 32, 64, 96, 120)
ITEMS = 50
# LongBench-style templates and answer lengths (dataset2prompt.json / dataset2maxlen.json have none for these)
PROMPTS = {
    "fictional_passages": "Answer the question based on the given passages. Only give me the answer and do not "
                          "output any other words.\n\nThe following are given passages.\n{context}\n\nAnswer the "
                          "question based on the given passages. Only give me the answer and do not output any "
                          "other words.\n\nQuestion: {input}\nAnswer:",
    "fictional_document": "Read the following text and answer briefly.\n\n{context}\n\nNow, answer the following "
                          "question based on the above text, only give me the answer and do not output any other "
                          "words.\n\nQuestion: {input}\nAnswer:",
}
MAX_NEW_TOKENS = {"fictional_passages": 32, "fictional_document": 32}
SUBSETS = tuple(PROMPTS)


def _item(subset: str, index: int, rng: random.Random, used: set[str]) -> dict:
    count = PARAGRAPHS[index % len(PARAGRAPHS)]
    people = [person(rng, used) for _ in range(count)]
    paragraphs = [paragraph(p, rng) for p in people]
    if subset == "fictional_passages":
        target = rng.randrange(count)
        context = "".join(f"Passage {i + 1}:\n{text}\n" for i, text in enumerate(paragraphs))
    else:
        target = rng.randrange(2 * count // 5, max(2 * count // 5 + 1, 3 * count // 5))
        context = "\n".join(paragraphs) + "\n"
    question, slot = rng.choice(QUESTIONS)
    chosen = people[target]
    return {"input": question.format(**chosen), "context": context, "answers": [chosen[slot]],
            "length": len(context.split()), "dataset": subset, "language": "en", "all_classes": None,
            "_id": hashlib.sha256(f"{subset}-{index}-{context}".encode()).hexdigest()[:24]}


def generate(subset: str, seed: int = 0, items: int = ITEMS) -> list[dict]:
    """`items` LongBench records of the embedded `subset`."""
    rng, used = random.Random(f"memdefrag-longbench-{subset}-{seed}"), set()
    return [_item(subset, i, rng, used) for i in range(items)]
