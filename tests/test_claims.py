"""The results' text says no more than its tables: every comparison a claim, rendered from the runs, and a claim
the runs do not bear out refused."""

import re
from pathlib import Path

import pytest

from harness.claims import VERDICTS, read_claims
from harness.errors import ConfigError
from harness.report import write
from tests.test_report import fake_run

RESULTS = Path(__file__).resolve().parents[1] / "results"
GUIDES = [RESULTS.parent / "README.md", *sorted((RESULTS.parent / "docs").glob("*.md"))]
WRONG = ("- {table: peers, model: smollm2, dataset: synthetic, row: epic_top2, against: memdefrag_top2, step: 20,\n"
         "   says: higher, subject: EPIC over Top-2 beats Top-2 alone}\n")


def peers_runs(root: Path) -> None:
    """Two methods on 30 questions at step 20: 13 right against 9, 4 more on one side only (McNemar p 0.125)."""
    for method, right in (("epic_top2", 13), ("memdefrag_top2", 9)):
        records = [{"group": g, "step": 20, "correct": g < right, "memory_tokens": 100,
                    "seconds": {"prefill": 0.1, "decode": 1.0}} for g in range(30)]
        fake_run(root / "p" / method, "Retention", method, records, study="peers", dataset="synthetic")


def test_a_claim_the_runs_do_not_bear_out_is_refused_with_its_numbers(tmp_path):
    peers_runs(tmp_path)
    (tmp_path / "claims.yaml").write_text(WRONG)
    with pytest.raises(ConfigError) as caught:
        write(tmp_path)
    assert str(caught.value) == (
        "claim 'EPIC over Top-2 beats Top-2 alone' says 'higher' but the runs say 'no measurable difference': EPIC "
        "over Top-2 beats Top-2 alone (smollm2, synthetic, n = 20): 43.3 % against 30.0 %, +13.3 points (McNemar's "
        "exact p 0.12, 30 questions).")
    assert not (tmp_path / "README.md").exists()                    # nothing written on a false claim


def test_a_claim_the_runs_bear_out_is_rendered_with_its_numbers(tmp_path):
    peers_runs(tmp_path)
    (tmp_path / "claims.yaml").write_text(WRONG.replace("says: higher", "says: no measurable difference"))
    assert ("- EPIC over Top-2 beats Top-2 alone (smollm2, synthetic, n = 20): 43.3 % against 30.0 %, +13.3 points "
            "(McNemar's exact p 0.12, 30 questions): no measurable difference.") in write(tmp_path).read_text()


@pytest.mark.parametrize("entry, message", [
    ("- {table: peers}\n", "entry 0: fields ['table'], expected"),
    (WRONG.replace("says: higher", "says: better"), "says='better' is not one of"),
    (WRONG.replace("row: epic_top2", "row: apex"), "no run makes row 'apex' of tab:peers for smollm2 on synthetic"),
    (WRONG.replace("step: 20", "step: 7"), "share no question at step 7"),
])
def test_a_malformed_claim_is_one_line(tmp_path, entry, message):
    peers_runs(tmp_path)
    (tmp_path / "claims.yaml").write_text(entry)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        write(tmp_path)


def test_runs_of_several_seeds_are_one_row_paired_question_by_question(tmp_path):
    """Two seeds of each method pool into one row (60 questions); pairing is by (seed, group): the same group
    index under another seed is another question."""
    for seed in (42, 43):
        for method, right in (("epic_top2", 13), ("memdefrag_top2", 9)):
            wrong = range(30 - right) if seed == 43 else range(right, 30)     # seed 43: the other groups right
            records = [{"group": g, "step": 20, "correct": g not in wrong, "memory_tokens": 100,
                        "seconds": {"prefill": 0.1, "decode": 1.0}} for g in range(30)]
            fake_run(tmp_path / str(seed) / method, "Retention", method, records, study="peers",
                     dataset="synthetic", seed=seed)
    (tmp_path / "claims.yaml").write_text(WRONG)          # at 60 questions the same rates are a difference
    readme = write(tmp_path).read_text()
    table = readme.split("(`tab:peers`)")[1].split("\n## ")[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines() if "| smollm2" in line]
    assert [(row[2], row[3], row[-3], row[-2]) for row in rows] == [
        ("memdefrag_top2", "30.0 [19.9, 42.5]", "60", "2"), ("epic_top2", "43.3 [31.6, 55.9]", "60", "2")]
    assert "43.3 % against 30.0 %, +13.3 points (McNemar's exact p 0.0078, 60 questions)" in readme


def claim_lines(page: Path) -> list[str]:
    """The lines of `page` that state a claim as the report renders one: a list item ending in its verdict."""
    return [line for line in page.read_text().splitlines()
            if line.startswith("- ") and line.endswith(tuple(f": {verdict}." for verdict in VERDICTS))]


def test_the_committed_text_holds_every_claim_as_the_runs_render_it():
    """results/README.md is what `memdefrag report results` writes from the committed runs (a false claim there
    would have stopped it); a claim the README or a guide quotes is one of them, word for word."""
    lines = claim_lines(RESULTS / "README.md")
    assert len(lines) == len(read_claims(RESULTS / "claims.yaml"))
    quoted = [line for page in GUIDES for line in claim_lines(page)]
    assert [line for line in quoted if line not in lines] == []


LOCOMO = ("- {table: locomo, model: smollm2, dataset: protocol=locomo, row: memdefrag_top1, against: vanilla,\n"
          "   category: 4, says: higher, subject: Top-1 against vanilla}\n")


def locomo_runs(root: Path, f1s: dict[str, dict[str, list[float]]]) -> None:
    """A LoCoMo run per method under protocol=locomo: per conversation, the F1 of its single-hop questions `q0`,
    `q1`... (the same words in every conversation), and one temporal question whose F1 goes the other way; each
    run's records in its own order."""
    for method, conversations in f1s.items():
        records = [{"group": i, "sample_id": sample, "question": f"q{j}", "category": 4, "f1": f1,
                    "correct": f1 == 1.0, "target_rank": None, "seconds": {"prefill": 0.1, "decode": 1.0}}
                   for i, (sample, scores) in enumerate(conversations.items()) for j, f1 in enumerate(scores)]
        records += [{**records[0], "question": "when?", "category": 2, "f1": float(method == "vanilla")}]
        fake_run(root / method, "LoCoMo", method, records if method == "vanilla" else records[::-1],
                 dataset="locomo", task_options={"protocol": "locomo"})


def apart(root: Path) -> None:
    """Top-1 above vanilla by 12.5 to 37.5 points in each of four conversations of five single-hop questions."""
    gains = (0.125, 0.25, 0.375, 0.25)
    locomo_runs(root, {"memdefrag_top1": {f"conv-{c}": [0.25 + gain] * 5 for c, gain in enumerate(gains)},
                       "vanilla": {f"conv-{c}": [0.25] * 5 for c in range(4)}})


def test_a_locomo_claim_is_rendered_with_both_f1s_the_difference_and_its_interval(tmp_path):
    apart(tmp_path)
    (tmp_path / "claims.yaml").write_text(LOCOMO)
    readme = write(tmp_path).read_text()
    claims = readme.split("(`tab:locomo`)")[1].split("\n## ")[0]
    assert ("What the table supports (`claims.yaml`; a difference only where the 95 % interval of the mean F1 "
            "difference on the same questions, resampling 4 conversations or more, excludes 0):\n\n"
            "- Top-1 against vanilla (smollm2, protocol=locomo, category 4): F1 50.0 against 25.0, +25.0 points (95 % "
            "paired bootstrap interval over conversations [+15.6, +34.4], 20 questions of 4 conversations): higher."
            ) in claims


def test_a_locomo_claim_the_runs_contradict_is_refused_in_one_line(tmp_path):
    apart(tmp_path)
    (tmp_path / "claims.yaml").write_text(LOCOMO.replace("says: higher", "says: no measurable difference"))
    with pytest.raises(ConfigError) as caught:
        write(tmp_path)
    assert str(caught.value) == (
        "claim 'Top-1 against vanilla' says 'no measurable difference' but the runs say 'higher': Top-1 against "
        "vanilla (smollm2, protocol=locomo, category 4): F1 50.0 against 25.0, +25.0 points (95 % paired bootstrap "
        "interval over conversations [+15.6, +34.4], 20 questions of 4 conversations).")
    assert not (tmp_path / "README.md").exists()


@pytest.mark.parametrize("conversations, numbers", [
    (4, "F1 62.5 against 37.5, +25.0 points (95 % paired bootstrap interval over conversations [+0.0, +75.0], 40 "
        "questions of 4 conversations)"),
    (2, "F1 75.0 against 25.0, +50.0 points (95 % paired bootstrap interval over conversations [+0.0, +100.0], 20 "
        "questions of 2 conversations; under 4 the interval is only the range of their own means)")])
def test_locomo_rows_pair_on_each_conversations_questions_and_resample_conversations(tmp_path, conversations,
                                                                                     numbers):
    """One conversation all right against all wrong, the others alike: its questions' +100 share its memory, so
    the interval reaches 0 (resampling the questions one by one would exclude it); the same words asked in
    another conversation are another question."""
    locomo_runs(tmp_path, {"memdefrag_top1": {f"conv-{c}": [1.0 if c == 0 else 0.5] * 10 for c in range(conversations)},
                           "vanilla": {f"conv-{c}": [0.0 if c == 0 else 0.5] * 10 for c in range(conversations)}})
    (tmp_path / "claims.yaml").write_text(LOCOMO)
    with pytest.raises(ConfigError, match=r"runs say 'no measurable difference'.*" + re.escape(numbers) + r"\.$"):
        write(tmp_path)


def test_a_difference_over_fewer_than_four_conversations_is_not_stated(tmp_path):
    """Two conversations that both moved by 25 points: the interval, their own range, excludes 0 (a coin toss's
    odds without any difference), so the text may not say higher."""
    locomo_runs(tmp_path, {"memdefrag_top1": {"conv-0": [0.5] * 5, "conv-1": [0.75] * 5},
                           "vanilla": {"conv-0": [0.25] * 5, "conv-1": [0.5] * 5}})
    (tmp_path / "claims.yaml").write_text(LOCOMO)
    with pytest.raises(ConfigError, match=re.escape(
            "runs say 'no measurable difference': Top-1 against vanilla (smollm2, protocol=locomo, category 4): F1 "
            "62.5 against 37.5, +25.0 points (95 % paired bootstrap interval over conversations [+25.0, +25.0], 10 "
            "questions of 2 conversations; under 4")):
        write(tmp_path)


@pytest.mark.parametrize("entry, message", [
    (LOCOMO.replace("category: 4", "step: 4"), "entry 0: fields ['against', 'dataset', 'model', 'row', 'says', "
                                              "'step', 'subject', 'table'], expected ['against', 'category',"),
    (LOCOMO.replace("category: 4", "category: four"), "entry 0: category='four' is not a whole number"),
    (LOCOMO.replace("table: locomo", "table: lokomo"), "entry 0: table 'lokomo', expected a table of ['locomo', "),
    (LOCOMO.replace("protocol=locomo", "protocol=authors"),     # a claim compares runs of the protocol it names
     "no run makes row 'memdefrag_top1' of tab:locomo for smollm2 on protocol=authors"),
    (LOCOMO.replace("category: 4", "category: 3"), "share no question at category 3"),
])
def test_a_malformed_locomo_claim_is_one_line_naming_it(tmp_path, entry, message):
    apart(tmp_path)
    (tmp_path / "claims.yaml").write_text(entry)
    with pytest.raises(ConfigError, match=re.escape(message)) as caught:
        write(tmp_path)
    assert "\n" not in str(caught.value)
