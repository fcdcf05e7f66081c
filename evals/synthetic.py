"""A knowledge-retention set of fictional facts that no model can know beforehand.

Each context is a paragraph about an invented person; its answer is an invented
name that occurs once in it, so substring matching cannot succeed by chance and
the no-memory accuracy is ~0. Distractors are paragraphs of the same kind about
other people. Generation is deterministic in the seed.
"""

from __future__ import annotations

import random

from evals.qa import QAItem, RetentionData

ONSETS = ["b", "br", "d", "dr", "f", "g", "gr", "k", "l", "m", "n", "p", "qu", "r", "s", "t", "th", "v", "z"]
VOWELS = ["a", "e", "i", "o", "u", "ae", "io", "ou"]
CODAS = ["", "n", "r", "l", "s", "th", "m", "x", "nd", "rk"]
JOBS = ["clockmaker", "glassblower", "beekeeper", "cartographer", "violin maker", "lighthouse keeper",
        "baker", "bookbinder", "potter", "astronomer", "ferry captain", "herbalist"]
PETS = ["cat", "dog", "parrot", "tortoise", "goat", "horse", "owl", "rabbit"]
TOOLS = ["a brass file", "a silver hammer", "an old compass", "a cedar ruler", "a copper kettle"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]

# (question about {person}, the slot that answers it)
QUESTIONS = [
    ("What is the name of {person}'s {pet}?", "pet_name"),
    ("In which town does {person} live?", "town"),
    ("What is the name of {person}'s apprentice?", "apprentice"),
    ("What is the name of the boat that {person} owns?", "boat"),
]

N_TARGETS, N_UNRELATED = 600, 200


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(ONSETS) + rng.choice(VOWELS) + rng.choice(CODAS) for _ in range(syllables)).capitalize()


def person(rng: random.Random, used: set[str]) -> dict[str, str]:
    """Fresh invented names for every slot, never reused across the whole set."""
    def fresh(syllables):
        while (w := _word(rng, syllables)) in used:
            pass
        used.add(w)
        return w
    return {
        "person": f"{fresh(2)} {fresh(2)}", "town": fresh(3), "apprentice": fresh(2), "pet_name": fresh(2),
        "boat": fresh(3), "job": rng.choice(JOBS), "pet": rng.choice(PETS), "tool": rng.choice(TOOLS),
        "day": rng.choice(DAYS), "year": str(rng.randint(1950, 2015)),
    }


def paragraph(p: dict[str, str], rng: random.Random) -> str:
    sentences = [
        f"{p['person']} is a {p['job']} who lives in the town of {p['town']}.",
        f"{p['person']} started working as a {p['job']} in {p['year']} and still works every day except {p['day']}.",
        f"{p['person']} has an apprentice named {p['apprentice']}.",
        f"{p['person']} keeps a {p['pet']} named {p['pet_name']}.",
        f"On free afternoons, {p['person']} sails a small boat called the {p['boat']}.",
        f"The most treasured possession of {p['person']} is {p['tool']}.",
    ]
    body = sentences[1:]
    rng.shuffle(body)
    return " ".join([sentences[0], *body])


def generate(seed: int = 0):
    """RetentionData with N_TARGETS targets and N_UNRELATED distractor paragraphs."""
    rng, used = random.Random(f"memdefrag-synthetic-{seed}"), set()
    targets = []
    for _ in range(N_TARGETS):
        p = person(rng, used)
        question, slot = rng.choice(QUESTIONS)
        targets.append(QAItem(paragraph(p, rng), question.format(**p), p[slot]))
    unrelated = [paragraph(person(rng, used), rng) for _ in range(N_UNRELATED)]
    return RetentionData(targets, unrelated)
