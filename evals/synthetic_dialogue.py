"""An embedded dialogue-memory set in LoCoMo's released format, for runs and tests without the data folder.

Each conversation is between two invented speakers over several dated sessions: small talk, events (a pet
adopted, a trip), a preference, and a plan that changes in a later session. Its questions cover LoCoMo's five
categories with their evidence turns: single-hop (4: a pet's name), temporal (2: when it was adopted),
multi-hop (1: every town visited, across sessions), open-domain (3: what a preference suggests), adversarial
(5: the same question of the other speaker, with an `adversarial_answer` only), and the changed plan (4: the
later session's answer). Every name is invented, so no model knows an answer beforehand. Deterministic in the
seed; written exactly as LoCoMo's file, so `evals.locomo` reads both the same way.
"""

from __future__ import annotations

import random

from evals.synthetic import _word

PETS = ["cat", "parrot", "tortoise", "rabbit", "goat"]
HOBBIES = [("pottery", "a pottery class"), ("astronomy", "a night at the observatory"),
           ("sailing", "a weekend on a boat"), ("baking", "a bread workshop")]
SMALL_TALK = ["Hey! How have you been?", "Pretty good, busy week at work.", "The weather has been lovely lately.",
              "I finally finished that book you lent me.", "Let's catch up again soon!", "Take care, talk soon!"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]


def _date(rng: random.Random, day: int) -> tuple[str, str]:
    """(LoCoMo's session_<k>_date_time text, the date as an answer gives it) for the `day`-th day of 2023."""
    month, mday = min(day // 28, 11), day % 28 + 1
    return (f"{rng.randint(1, 11)}:{rng.randint(10, 59)} pm on {mday} {MONTHS[month]}, 2023",
            f"{mday} {MONTHS[month]} 2023")


def conversation(rng: random.Random, index: int, sessions: int) -> dict:
    a, b = _word(rng, 2), _word(rng, 2)
    pet, pet_name = rng.choice(PETS), _word(rng, 2)
    towns = [_word(rng, 3) for _ in range(2)]
    hobby, outing = rng.choice(HOBBIES)
    first_plan, second_plan = _word(rng, 3), _word(rng, 3)
    events = {1: (a, f"Guess what, I adopted a {pet}! I named it {pet_name}."),
              2: (b, f"I just got back from a trip to {towns[0]}."),
              3: (a, f"I've been really into {hobby} lately, it calms me down."),
              4: (b, f"I plan to move to {first_plan} next year."),
              5: (b, f"Change of plans: I'm moving to {second_plan} instead of {first_plan}."),
              6: (b, f"Last weekend I visited {towns[1]} with my sister.")}
    conv, day, where = {"speaker_a": a, "speaker_b": b}, 0, {}
    for k in range(1, sessions + 1):
        day += rng.randint(3, 20)
        conv[f"session_{k}_date_time"], answer_date = _date(rng, day)
        turns = [(a if i % 2 == 0 else b, line) for i, line in enumerate(rng.sample(SMALL_TALK, 3))]
        if k in events:
            turns.insert(1, events[k])
            where[k] = (2, answer_date)          # the event is turn 2 of its session
        if k == 2:                             # a shared photo, as LoCoMo's turns carry one
            turns.append((b, "Here is a picture from the trip."))
        conv[f"session_{k}"] = [{"speaker": s, "dia_id": f"D{k}:{i + 1}", "text": t} for i, (s, t) in enumerate(turns)]
        if k == 2:
            conv[f"session_{k}"][-1].update(img_url=["https://example.invalid/photo.jpg"],
                                            blip_caption=f"a photo of a harbour in {towns[0]}")
    qa = [{"question": f"What is the name of {a}'s {pet}?", "answer": pet_name, "evidence": ["D1:2"],
           "category": 4},
          {"question": f"When did {a} adopt the {pet}?", "answer": where[1][1], "evidence": ["D1:2"], "category": 2},
          {"question": f"What is the name of {b}'s {pet}?", "adversarial_answer": pet_name, "evidence": ["D1:2"],
           "category": 5}]
    if sessions >= 3:
        qa.append({"question": f"What might {a} enjoy doing on a free weekend?",
                   "answer": f"{outing}; {a} is into {hobby}", "evidence": ["D3:2"], "category": 3})
    if sessions >= 5:
        qa.append({"question": f"Where does {b} plan to move now?", "answer": second_plan, "evidence": ["D5:2"],
                   "category": 4})
    if sessions >= 6:
        qa.append({"question": f"Which towns has {b} visited?", "answer": f"{towns[0]}, {towns[1]}",
                   "evidence": ["D2:2", "D6:2"], "category": 1})
    return {"sample_id": f"synthetic-{index}", "conversation": conv, "qa": qa}


def generate(seed: int = 42, conversations: int = 6, sessions: int = 8) -> list[dict]:
    """`conversations` conversations of `sessions` sessions each, in LoCoMo's released list format."""
    rng = random.Random(seed)
    return [conversation(rng, i, sessions) for i in range(conversations)]
