"""The results' text says no more than its tables: every comparison a claim, rendered from the runs, and a claim
the runs do not bear out refused."""

from pathlib import Path

import pytest

from harness.claims import read_claims
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


def committed_claims() -> list[str]:
    """The generated claim lines of the committed results/README.md."""
    return [line for line in (RESULTS / "README.md").read_text().splitlines()
            if line.startswith("- ") and "(McNemar's exact p " in line]


def test_the_committed_text_holds_every_claim_as_the_runs_render_it():
    """results/README.md is what `memdefrag report results` writes from the committed runs (a false claim there
    would have stopped it); a claim the README or a guide quotes is one of them, word for word."""
    lines = committed_claims()
    assert len(lines) == len(read_claims(RESULTS / "claims.yaml"))
    quoted = [line for page in GUIDES for line in page.read_text().splitlines()
              if line.startswith("- ") and "(McNemar's exact p " in line]
    assert [line for line in quoted if line not in lines] == []
