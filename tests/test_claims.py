"""The results' text says no more than its tables: every comparison a claim, rendered from the runs, and a claim
the runs do not bear out refused."""

import inspect
import re
from pathlib import Path

import pytest

from harness.report import comparisons
from harness.report import document as report
from harness.report.claims import VERDICTS, keyed, read_claims
from harness.errors import ConfigError
from harness.report.document import write
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


def refusal(root: Path, claims: str) -> str:
    """The report's one-line refusal of `claims` over the runs under `root`; nothing is written on it."""
    (root / "claims.yaml").write_text(claims)
    with pytest.raises(ConfigError) as caught:
        write(root)
    assert not (root / "README.md").exists()
    return str(caught.value)


def test_a_claim_the_runs_do_not_bear_out_is_refused_with_its_numbers(tmp_path):
    peers_runs(tmp_path)
    refused = refusal(tmp_path, WRONG)
    assert refused == (
        "claim 'EPIC over Top-2 beats Top-2 alone' says 'higher' but the runs say 'no measurable difference': EPIC "
        "over Top-2 beats Top-2 alone (smollm2, synthetic, n = 20): 43.3 % against 30.0 %, +13.3 points (McNemar's "
        "exact p 0.12, 30 questions).")


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
    assert [(row[2], row[3], row[-4], row[-3], row[-2]) for row in rows] == [     # each seed's accuracy beside
        ("memdefrag_top2", "30.0 [19.9, 42.5]", "60", "2", "42: 30.0 / 43: 30.0"),
        ("epic_top2", "43.3 [31.6, 55.9]", "60", "2", "42: 43.3 / 43: 43.3")]
    assert "43.3 % against 30.0 %, +13.3 points (McNemar's exact p 0.0078, 60 questions)" in readme


@pytest.mark.parametrize("table, forgetting, experiment", [("retention", "unbounded", "accuracy"),
                                                           ("retention_comparison", "informativeness",
                                                            "retention_comparison")])
def test_a_retention_table_renders_its_claims_per_model(tmp_path, table, forgetting, experiment):
    """tab:retention_<model> and tab:retention_comparison_<model> (runs of a model other than the default) state
    their claims under them, and the default model's table beside each none of them, nor the other model's
    answers: Top-1 against vanilla on the questions both answered at step 20 of 30 groups. The forgetting runs'
    other tables (the target's rank, the seconds) are drawn per model too."""
    qwen = {"name": "qwen25_coder_05b"}
    for method, right in (("vanilla", 2), ("memdefrag_top1", 12)):
        records = [{"group": g, "step": s, "correct": s == 1 or g < right, "target_rank": 1.0,
                    "seconds": {"trace": 1.0}} for g in range(30) for s in (1, 20)]
        fake_run(tmp_path / "q" / method, "Retention", method, records, forgetting, model=qwen)
        fake_run(tmp_path / "s" / method, "Retention", method, [{**r, "correct": False, "target_rank": 2.0}
                                                                for r in records], forgetting)
    bound = "" if forgetting == "unbounded" else f"+{forgetting}"      # a forgetting run's label names its policy
    (tmp_path / "claims.yaml").write_text(
        f"- {{table: {table}, model: qwen25_coder_05b, dataset: nqa, row: memdefrag_top1{bound},\n"
        f"   against: vanilla{bound}, step: 20, says: higher, subject: MemDefrag Top-1 against vanilla}}\n")
    readme = write(tmp_path).read_text()

    def section(label: str) -> str:
        return readme.split(f"(`{label}`)")[1].split("\n## ")[0]

    mine = section(f"tab:{table}_qwen25_coder_05b")
    assert ("- MemDefrag Top-1 against vanilla (qwen25_coder_05b, nqa, n = 20): 40.0 % against 6.7 %, +33.3 points "
            "(McNemar's exact p 0.002, 30 questions): higher.") in mine
    assert f"Command: `memdefrag experiment={experiment} model=qwen25_coder_05b`" in mine
    default = section(f"tab:{table}")
    assert "against vanilla" not in default and "| 0.0 [0.0, 11.4]" in default and "| 30 " in default
    if bound:
        assert "| 1.00 [1.00, 1.00]" in section("tab:forgetting_rank_qwen25_coder_05b")
        assert "| 2.00 [2.00, 2.00]" in section("tab:forgetting_rank") and "1.00" not in section("tab:forgetting_rank")
        assert "Knowledge retention with forgetting on qwen25_coder_05b, seconds per step" in readme


@pytest.mark.parametrize("table, model, models", [("retention", "qwen25", ["smollm2"]),
                                                  ("retention_comparison", "qwen25", []),
                                                  ("retention_comparison", "smollm2", [])])
def test_a_retention_claim_on_a_model_without_its_table_is_refused(tmp_path, table, model, models):
    """Checked nowhere otherwise: each model's retention table renders only its own model's claims (the default
    model's too, whose table is drawn without runs, checking none): here smollm2 has runs without forgetting."""
    fake_run(tmp_path / "s" / "vanilla", "Retention", "vanilla", [{"group": 0, "step": 20, "correct": True}])
    refused = refusal(tmp_path, f"- {{table: {table}, model: {model}, dataset: nqa, row: memdefrag_top1, "
                                "against: vanilla, step: 20, says: higher, subject: Top-1 against vanilla}\n")
    assert refused == (f"claim 'Top-1 against vanilla': no run makes a tab:{table} table for model {model!r} "
                       f"(the models with one: {models})")


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
GINA = "What did Gina receive from a dance contest?"       # asked twice in conv-30 of LoCoMo's released file


def locomo_runs(root: Path, f1s: dict[str, dict[str, list[float]]], questions: list[str] | None = None,
                name: str | None = None) -> None:
    """A LoCoMo run per method under protocol=locomo: per conversation, the F1 of its single-hop questions (the
    words `questions`, else `q0`, `q1`..., the same in every conversation), and one temporal question whose F1
    goes the other way; each run's records in its own order. `name`: the runs' folder (another run of each)."""
    for method, conversations in f1s.items():
        records = [{"group": i, "sample_id": sample, "question_index": j, "category": 4, "f1": f1,
                    "question": questions[j] if questions else f"q{j}", "correct": f1 == 1.0, "target_rank": None,
                    "seconds": {"prefill": 0.1, "decode": 1.0}}
                   for i, (sample, scores) in enumerate(conversations.items()) for j, f1 in enumerate(scores)]
        records += [{**records[0], "question_index": 99, "question": "when?", "category": 2,
                     "f1": float(method == "vanilla")}]
        fake_run(root / (name or "") / method, "LoCoMo", method, records if method == "vanilla" else records[::-1],
                 dataset="locomo", task_options={"protocol": "locomo"})


GAINS = (0.125, 0.25, 0.375, 0.25, 0.125, 0.375)


def apart(root: Path, conversations: int = 6) -> None:
    """Top-1 above vanilla by 12.5 to 37.5 points in each conversation (six: the fewest a difference over them
    needs at 95 %) of five single-hop questions."""
    locomo_runs(root, {"memdefrag_top1": {f"conv-{c}": [0.25 + GAINS[c]] * 5 for c in range(conversations)},
                       "vanilla": {f"conv-{c}": [0.25] * 5 for c in range(conversations)}})


def locomo_claims(root: Path) -> str:
    """tab:locomo's text below its table, as the report writes it."""
    return write(root).read_text().split("(`tab:locomo`)")[1].split("\n## ")[0]


def test_a_locomo_claim_is_rendered_with_both_f1s_the_difference_and_its_interval(tmp_path):
    apart(tmp_path)
    (tmp_path / "claims.yaml").write_text(LOCOMO)
    assert ("What the table supports (`claims.yaml`; a difference only where the 95 % interval of the mean F1 "
            "difference on the same questions, resampling 6 conversations or more, excludes 0):\n\n"
            "- Top-1 against vanilla (smollm2, protocol=locomo, category 4): F1 50.0 against 25.0, +25.0 points (95 % "
            "paired bootstrap interval over conversations [+16.7, +33.3], 30 questions of 6 conversations): higher."
            ) in locomo_claims(tmp_path) and "No comparison" not in locomo_claims(tmp_path)


def test_a_locomo_claim_the_runs_contradict_is_refused_in_one_line(tmp_path):
    apart(tmp_path)
    refused = refusal(tmp_path, LOCOMO.replace("says: higher", "says: no measurable difference"))
    assert refused == (
        "claim 'Top-1 against vanilla' says 'no measurable difference' but the runs say 'higher': Top-1 against "
        "vanilla (smollm2, protocol=locomo, category 4): F1 50.0 against 25.0, +25.0 points (95 % paired bootstrap "
        "interval over conversations [+16.7, +33.3], 30 questions of 6 conversations).")


def test_locomo_rows_pair_on_each_conversations_questions_and_resample_conversations(tmp_path):
    """One conversation all right against all wrong, the others alike: its questions' +100 share its memory, so
    the interval reaches 0 (resampling the questions one by one would exclude it); the same words asked in
    another conversation are another question."""
    locomo_runs(tmp_path, {"memdefrag_top1": {f"conv-{c}": [1.0 if c == 0 else 0.5] * 10 for c in range(6)},
                           "vanilla": {f"conv-{c}": [0.0 if c == 0 else 0.5] * 10 for c in range(6)}})
    (tmp_path / "claims.yaml").write_text(LOCOMO)
    with pytest.raises(ConfigError, match=r"runs say 'no measurable difference'.*" + re.escape(
            "F1 58.3 against 41.7, +16.7 points (95 % paired bootstrap interval over conversations [+0.0, +50.0], "
            "60 questions of 6 conversations)") + r"\.$"):
        write(tmp_path)


@pytest.mark.parametrize("conversations", [2, 4, 5])
@pytest.mark.parametrize("says", VERDICTS)
def test_a_locomo_claim_over_fewer_conversations_than_a_difference_needs_is_refused(tmp_path, conversations, says):
    """Every conversation moved the same way: every resample does, so the interval excludes 0, which happens to
    2 * 2 ** -k of k conversations' sign patterns without any difference (12.5 % at 4). Under 6 no verdict is
    tested, so none may stand, not even 'no measurable difference', which could never fail there."""
    apart(tmp_path, conversations)
    refused = refusal(tmp_path, LOCOMO.replace("says: higher", f"says: {says}"))
    assert refused == (
        f"claim 'Top-1 against vanilla': rows 'memdefrag_top1' and 'vanilla' pair {conversations} conversations at "
        f"category 4, and a difference over conversations needs at least 6 (evals.stats.fewest_groups): no verdict "
        f"of it is tested")


def test_a_question_asked_twice_in_a_conversation_pairs_by_its_place(tmp_path):
    """LoCoMo's file asks some questions twice in one conversation: each is paired with itself (question_index),
    not with the other (which would count four pairs of two questions, and pair a right answer with a wrong)."""
    locomo_runs(tmp_path, {"memdefrag_top1": {f"conv-{c}": [1.0, 0.0, 0.5] for c in range(6)},
                           "vanilla": {f"conv-{c}": [1.0, 0.0, 0.25] for c in range(6)}},
                questions=[GINA, GINA, "q2"])
    (tmp_path / "claims.yaml").write_text(LOCOMO)
    assert ("F1 50.0 against 41.7, +8.3 points (95 % paired bootstrap interval over conversations [+8.3, +8.3], 18 "
            "questions of 6 conversations): higher.") in locomo_claims(tmp_path)


def test_a_row_asking_one_question_twice_is_refused_naming_it(tmp_path):
    """A row pooling two runs of the same conversations holds each question twice: no one-to-one pairing. Two runs
    of one seed are refused before any claim, naming both folders."""
    apart(tmp_path)
    locomo_runs(tmp_path, {"memdefrag_top1": {"conv-0": [0.5]}}, name="again")
    refused = refusal(tmp_path, LOCOMO)
    assert refused == (
        f"tab:locomo: row memdefrag_top1 would count group 0 (seed 42) twice: both {tmp_path / 'again'}/memdefrag_top1 "
        f"and {tmp_path}/memdefrag_top1 answered it; move one of them out of the results (a rerun kept beside the "
        f"run it repeats, or a copy)")


def test_rows_whose_runs_sampled_other_questions_are_refused(tmp_path):
    """The same place in a conversation's sample names another question where the runs sampled otherwise."""
    locomo_runs(tmp_path, {"memdefrag_top1": {f"conv-{c}": [0.5] * 5 for c in range(6)}},
                questions=["q0", "q1", "q2", "q3", GINA])
    locomo_runs(tmp_path, {"vanilla": {f"conv-{c}": [0.25] * 5 for c in range(6)}})
    refused = refusal(tmp_path, LOCOMO)
    assert re.fullmatch(re.escape("claim 'Top-1 against vanilla': rows 'memdefrag_top1' and 'vanilla' differ at "
                                  "sample_id='conv-") + r"\d" + re.escape(
        f"', question_index=4 (question {GINA!r} against 'q4'): their runs sampled other questions (task.seed, "
        f"task.categories or task.questions), so their question_index names no common question"), refused)


@pytest.mark.parametrize("conversations, sentence", [
    (2, "a difference over conversations needs at least 6, and two rows of one model and protocol pair at most 2 "
        "conversations (smollm2 protocol=authors, smollm2 protocol=locomo)."),
    (6, "a difference over conversations needs at least 6, and two rows of one model and protocol pair at most 2 "
        "conversations (smollm2 protocol=authors) or 6 (smollm2 protocol=locomo: enough, but `claims.yaml` compares "
        "none of them).")])
def test_without_a_locomo_claim_the_section_says_why_none_is_made(tmp_path, conversations, sentence):
    """How many conversations the rows of one protocol pair (two rows asking the same ones), against the fewest a
    difference over conversations needs; a third protocol's rows pairing 2 of them."""
    apart(tmp_path, conversations)
    locomo_runs(tmp_path / "authors", {m: {f"conv-{c}": [0.5] for c in range(2)} for m in ("top1", "vanilla")})
    for config in (tmp_path / "authors").glob("*/config.yaml"):
        config.write_text(config.read_text().replace("protocol: locomo", "protocol: authors"))
    assert f"No comparison of its rows is claimed (`claims.yaml`): {sentence}" in locomo_claims(tmp_path)


@pytest.mark.parametrize("entry, message", [
    (LOCOMO.replace("category: 4", "step: 4"), "entry 0: fields ['against', 'dataset', 'model', 'row', 'says', "
                                              "'step', 'subject', 'table'], expected ['against', 'category',"),
    (LOCOMO.replace("category: 4", "category: four"), "entry 0: category='four' is not one of 1-5 (1 multi-hop, "
                                                      "2 temporal, 3 open-domain, 4 single-hop, 5 adversarial)"),
    (LOCOMO.replace("category: 4", "category: 6"), "entry 0: category=6 is not one of 1-5 (1 multi-hop,"),
    (LOCOMO.replace("table: locomo", "table: lokomo"), "entry 0: table 'lokomo', expected a table of ['locomo', "),
    (LOCOMO.replace("table: locomo", "table: [locomo]"), "entry 0: table ['locomo'], expected a table of ['locomo', "),
    (LOCOMO.replace("table: locomo", "table: {locomo: 1}"), "entry 0: table {'locomo': 1}, expected a table of "),
    ("- locomo\n", "entry 0: 'locomo' is a str, not a claim (a mapping with the fields table, model, dataset, row, "
                   "against, says, subject and its table's category or step)"),
    ("table: locomo\n", "claims.yaml: a dict, expected a list of claims"),
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


def test_a_claim_names_its_rows_records_as_the_tables_key_them(tmp_path):
    """One helper (keyed) keys every table's rows as Claim.key looks them up: tab:locomo's groups of the report,
    tab:rankers' and tab:peers' rows alike."""
    (tmp_path / "claims.yaml").write_text(LOCOMO)
    claim = read_claims(tmp_path / "claims.yaml")[0]
    rows = keyed("locomo", [(("smollm2", "protocol=locomo", "memdefrag_top1"), "records")])
    assert rows == {claim.key("memdefrag_top1"): "records"}
    assert comparisons.keyed is keyed and 'keyed("locomo"' in inspect.getsource(report.locomo_sections)


def test_a_pooled_row_shows_each_seeds_accuracy_at_its_last_step_in_seed_order():
    """The seeds' distractor sets differ, which a pooled interval leaves out: each seed's accuracy at its last step,
    named, in seed order whatever the order of the records, the step said where a seed stopped early; one seed:
    nothing to show."""
    import pandas as pd

    from harness.report.comparisons import by_seed

    frame = pd.DataFrame([{"seed": seed, "group": g, "step": step, "correct": correct}
                          for seed, right, last in ((44, 0, 20), (42, 3, 20), (43, 1, 10)) for g in range(4)
                          for step, correct in ((1, True), (last, g < right))])
    assert by_seed(frame) == "42: 75.0 / 43: 25.0 (step 10) / 44: 0.0"      # seed 43 stopped at step 10
    assert by_seed(frame[frame["seed"] == 42]) == ""
