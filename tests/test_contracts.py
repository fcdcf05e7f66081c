"""A newcomer's plugins, each breaking its contract in one way a newcomer and a seeded fuzzer did (issue 55): each
is refused in one line naming the plugin, the member and what is expected, when it is composed where its signature
or annotation shows it, else at its first use (a run's first record, a plan's first question), never after every
group ran. Each row runs the real command (in this process) on the tiny checkpoint of tests/conftest.py."""

import json
import re
import sys
from collections.abc import Iterator
from dataclasses import replace
from types import SimpleNamespace
from pathlib import Path

import pytest

from evals.retention import Retention
from harness import cli
from methods.base import Method, Plan
from tests.conftest import refusal, tiny_overrides


class PlanReturnsMemory(Method):
    """`plan` returns the memory it was given, not a Plan."""

    def plan(self, memory, prompt_ids, backend, question=None):
        return memory


class DeclaresMemory(Method):
    """`plan` declares it returns the memory: refused when composed."""

    def plan(self, memory, prompt_ids, backend, question=None) -> list:
        return memory


class ReadsIndices(Method):
    """Reads the newest fragment but names it by its index in the memory, not its id."""

    def plan(self, memory, prompt_ids, backend, question=None):
        newest = max(range(len(memory)), key=memory.ids().__getitem__)
        return Plan(latent=memory.arranged([newest]), read=[newest])


class KeepsItsFirstView(Method):
    """Reads, at every question, the view it made at its first: the first group's memory as it was then."""

    def __init__(self):
        self.view = None

    def for_group(self, index):
        return self

    def plan(self, memory, prompt_ids, backend, question=None):
        self.view = self.view or memory.arranged(list(range(len(memory))))
        return Plan(latent=self.view)


class GeneratedGroups(Retention):
    """`groups()` written as a generator."""

    def groups(self, tokenizer):
        yield from super().groups(tokenizer)


class DeclaredIterator(Retention):
    """`groups()` declared to return an iterator: refused when composed."""

    def groups(self, tokenizer) -> Iterator:
        return iter(super().groups(tokenizer))


class NoStep(Retention):
    """Records without `step`, which its metrics group by."""

    def run_group(self, session, group):
        for record in super().run_group(session, group):
            del record["step"]
            yield record


class FloatCorrect(Retention):
    """`correct` as a float."""

    def run_group(self, session, group):
        for record in super().run_group(session, group):
            yield {**record, "correct": float(record["correct"])}


class OwnFile(Retention):
    """Reads its own file in `check()`, which is not there."""

    path = "/nonexistent/own.jsonl"

    def check(self):
        Path(self.path).read_text()


class OwnKey(Retention):
    """Its own data lacks a key `check()` reads."""

    def check(self):
        {"context": "c"}["question"]


class ChecksByReturning(Retention):
    """`check()` returns its complaint instead of raising it."""

    def check(self):
        return "no passkey in the data"


class AssertsInCheck(Method):
    """`check()` asserts, as authors validate."""

    def check(self, num_layers):
        assert num_layers > 99, "needs a deep model"


class RaisesPlainly(Method):
    """Its constructor raises a plain Exception."""

    def __init__(self):
        raise Exception("window 2 is too wide")


class UnknownBackend(Method):
    """Names a backend that does not exist."""

    backends = ("fast", "hiden_prefix")


class OneBackendString(Method):
    """`backends` as one string, which a membership test reads letter by letter."""

    backends = "fast"


class DescribesWithASet(Retention):
    def describe(self):
        return {"subsets": {"a", "b"}}


class NoGroups(Retention):
    def groups(self, tokenizer):
        return []


class TwiceIndexed(Retention):
    def groups(self, tokenizer):
        return [replace(group, index=0) for group in super().groups(tokenizer)]


class TextAsOneString(Retention):
    def groups(self, tokenizer):
        return [SimpleNamespace(index=group.index, texts=lambda g=group: " ".join(g.texts()))
                for group in super().groups(tokenizer)]


class FailsInSecondGroup(Method):
    """Vanilla until its second group's question, where a bug of its own raises."""

    def __init__(self):
        self.group = 0

    def for_group(self, index):
        self.group = index
        return self

    def plan(self, memory, prompt_ids, backend, question=None):
        if self.group == 1:
            {}["tracer"]
        return Plan(latent=memory)


CASES = {  # attempt -> (overrides, the one line), each on the tiny checkpoint
    "plan returns the memory": (["method=vanilla", "method._target_=tests.test_contracts.PlanReturnsMemory"],
                                "method PlanReturnsMemory.plan returned a LatentMemory; it must return a Plan "
                                "(methods.base), e.g. Plan(latent=memory) to read the whole memory"),
    "plan declared to return another type": (["method=vanilla", "method._target_=tests.test_contracts.DeclaresMemory"],
                                             "method DeclaresMemory.plan is declared to return list; the harness "
                                             "needs a Plan (methods.base)"),
    "read given memory indices": (["method=vanilla", "method._target_=tests.test_contracts.ReadsIndices"],
                                  "method ReadsIndices.plan returned Plan(read=[0]) for a latent view of fragments "
                                  "[1]; `read` takes the ids of the fragments read (memory.ids()), not their "
                                  "indices"),
    "groups as a generator": (["task._target_=tests.test_contracts.GeneratedGroups"],
                              "task GeneratedGroups.groups returned a generator; it must return a list of groups "
                              "(shard=i/n takes every n-th): `return [...]`, not `yield`"),
    "groups declared an iterator": (["task._target_=tests.test_contracts.DeclaredIterator"],
                                    "task DeclaredIterator.groups is declared to return Iterator; the harness needs "
                                    "a list of groups"),
    "a record without step": (["task._target_=tests.test_contracts.NoStep"],
                              "task NoStep.metrics cannot read its first record (group 0, fields group, question, "
                              "gold, output, correct, memory_tokens, used_tokens, target_tokens, target_rank, "
                              "target_position, seconds, target_read, method, forgetting, beyond_window): KeyError: "
                              "'step'; a record must hold every field its metrics read"),
    "correct as a float": (["task._target_=tests.test_contracts.FloatCorrect"],
                           "task: run_group yielded a record with correct=0.0 (a float) in group 0; `correct` must be "
                           "a bool (None where the answer is not judged)"),
    "its own file missing": (["task._target_=tests.test_contracts.OwnFile"],
                             "task OwnFile.check: cannot read /nonexistent/own.jsonl: No such file or directory"),
    "its own data lacking a key": (["task._target_=tests.test_contracts.OwnKey"], "task OwnKey.check: KeyError: 'question'"),
    "check returning its complaint": (["task._target_=tests.test_contracts.ChecksByReturning"],
                                      "task ChecksByReturning.check returned 'no passkey in the data': a check refuses "
                                      "by raising ValueError and returns nothing"),
    "an assert in check": (["method=vanilla", "method._target_=tests.test_contracts.AssertsInCheck"],
                           "method AssertsInCheck.check: AssertionError: needs a deep model"),
    "a constructor raising a plain Exception": (["method=vanilla", "method._target_=tests.test_contracts.RaisesPlainly"],
                                                "method RaisesPlainly(): Exception: window 2 is too wide"),
    "an unknown backend": (["method=vanilla", "method._target_=tests.test_contracts.UnknownBackend"],
                           "method=vanilla: UnknownBackend.backends=('fast', 'hiden_prefix') must list some of "
                           "['fast', 'hidden_prefix']"),
    "backends as one string": (["method=vanilla", "method._target_=tests.test_contracts.OneBackendString"],
                               "method=vanilla: OneBackendString.backends='fast' must list some of"),
    "no group": (["task._target_=tests.test_contracts.NoGroups"], "task: groups() gave no group"),
    "describe of a set": (["task._target_=tests.test_contracts.DescribesWithASet"],
                          "task DescribesWithASet.describe returned what run.json cannot hold (Object of type set is "
                          "not JSON serializable): a dict of plain values"),
    "two groups of one index": (["task._target_=tests.test_contracts.TwiceIndexed"],
                                "task: two of its groups have index 0; each group's index is its own"),
    "texts as one string": (["task._target_=tests.test_contracts.TextAsOneString"],
                            "task: group 0's texts() gave '"),
}


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_plugin_breaking_its_contract_is_refused_in_one_line_at_once(case, tiny_checkpoint, tmp_path, monkeypatch,
                                                                        capsys):
    """Through the command's entry point (harness.cli.main) in this process; a warning would be a second line."""
    overrides, message = CASES[case]
    err = refusal(["memdefrag", *tiny_overrides(tiny_checkpoint), "task.groups=2", "task.updates=2", *overrides,
                   f"hydra.run.dir={tmp_path / 'run'}"], monkeypatch, capsys)
    *bars, line = err.strip().splitlines()
    assert line.startswith(f"memdefrag: error: {message}"), line
    assert all(re.search(r"\d+/\d+ \[", bar) or not bar for bar in bars), bars  # progress bars only
    groups = tmp_path / "run" / "groups.jsonl"
    assert not groups.exists() or groups.read_text() == ""          # refused before any group ended


def test_a_yaml_key_its_plugin_s_constructor_lacks_is_refused_naming_the_key_the_file_and_the_options(
        tmp_path, monkeypatch, capsys):
    (tmp_path / "conf" / "method").mkdir(parents=True)
    (tmp_path / "conf" / "method" / "select_keep_order.yaml").write_text(
        "defaults:\n  - selection_schema\n  - _self_\n\n_target_: methods.selection.selection.Selection\n"
        "label: keep_order\nkeep_order: true\n")
    monkeypatch.setattr(sys, "argv", ["memdefrag", "method=select_keep_order", f"hydra.searchpath=[file://{tmp_path}"
                                      "/conf]", "logger=none", f"hydra.run.dir={tmp_path / 'run'}"])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (
        "memdefrag: error: method/select_keep_order.yaml: keep_order is not an option of Selection, which takes "
        "ranker, size, k, tau, k_max, arrangement, window, reading, tracer_layer, query_mode, seed, embedder "
        "(besides _target_ and label)\n")


def test_a_plugin_failing_mid_run_is_one_line_its_traceback_kept_and_the_finished_groups_too(
        tiny_checkpoint, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    err = refusal(["memdefrag", *tiny_overrides(tiny_checkpoint), "task.groups=2", "task.updates=2", "method=vanilla",
                   "method._target_=tests.test_contracts.FailsInSecondGroup", f"hydra.run.dir={run}"], monkeypatch,
                  capsys)
    line = err.strip().splitlines()[-1]
    assert line == (f"memdefrag: error: group 1: KeyError: 'tracer' (finished groups are kept in {run}; the "
                    f"traceback is in {run / 'traceback.txt'}, MEMDEFRAG_DEBUG=1 raises it)")
    assert "in plan" in (run / "traceback.txt").read_text()
    assert [json.loads(row)["group"] for row in (run / "groups.jsonl").read_text().splitlines()] == [0]


def test_a_plan_reading_another_memory_than_its_own_is_refused_at_that_question(tiny_checkpoint, tmp_path,
                                                                                 monkeypatch, capsys):
    """The second group's first question: the view kept from the first group is of another memory (its answers
    would read it silently); the first group is kept."""
    run = tmp_path / "run"
    err = refusal(["memdefrag", *tiny_overrides(tiny_checkpoint), "task.groups=2", "task.updates=2", "method=vanilla",
                   "method._target_=tests.test_contracts.KeepsItsFirstView", f"hydra.run.dir={run}"], monkeypatch,
                  capsys)
    assert err.strip().splitlines()[-1] == ("memdefrag: error: method KeepsItsFirstView.plan returned a latent view "
                                            "that is not of the memory it was given: build it from that memory at "
                                            "each question (memory.arranged(order), or the memory itself)")
    assert [json.loads(row)["group"] for row in (run / "groups.jsonl").read_text().splitlines()] == [0]


def test_a_plugin_yaml_without_a_label_is_refused_naming_it(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    (tmp_path / "conf" / "method").mkdir(parents=True)
    (tmp_path / "conf" / "method" / "unlabelled.yaml").write_text(
        "defaults:\n  - vanilla_schema\n  - _self_\n\n_target_: methods.baselines.Vanilla\n")
    err = refusal(["memdefrag", *tiny_overrides(tiny_checkpoint), "method=unlabelled",
                   f"hydra.searchpath=[file://{tmp_path}/conf]", f"hydra.run.dir={tmp_path / 'run'}"], monkeypatch,
                  capsys)
    assert err.strip() == ("memdefrag: error: method.label: missing; the runs of a method are named by its label: give "
                           "its YAML one (label: my_method)")


def test_help_lists_every_subcommand_and_config_group_not_the_schemas(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["memdefrag", "--help"])
    cli.main()
    shown = capsys.readouterr().out
    for command in ("report", "plugins", "compare", "migrate", "collect", "merge", "cache", "tracer-sweep"):
        assert f"\n  {command} " in shown, command
    for group in ("compression", "experiment", "forgetting", "logger", "method", "model", "task"):
        assert f"\n  {group} " in shown, group
    assert "memdefrag_top2" in shown and "_schema" not in shown


@pytest.mark.parametrize("python, says", [
    ("{tmp}/python3.99", "make: {tmp}/venv was built by Python {have}, not PYTHON={tmp}/python3.99 (Python 3.99.0): "
                         "remove it (rm -rf {tmp}/venv) and run make setup again, or give another VENV="),
    ("{tmp}/nowhere/python", "make: PYTHON={tmp}/nowhere/python cannot be run here"),
])
def test_make_setup_with_another_python_over_an_existing_venv_says_so(python, says, tmp_path):
    """`PYTHON=python3.12 make setup` over a .venv another Python built did nothing, silently (issue 55)."""
    import platform
    import subprocess

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    (tmp_path / "python3.99").write_text("#!/bin/sh\necho 3.99.0\n")      # an interpreter of another version
    (tmp_path / "python3.99").chmod(0o755)
    fill = {"tmp": str(tmp_path), "have": platform.python_version()}
    done = subprocess.run(["make", "-C", str(Path(__file__).resolve().parents[1]), "setup", f"VENV={tmp_path}/venv",
                           f"PYTHON={python.format(**fill)}"], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.splitlines()[0] == says.format(**fill), done.stderr
    assert not (tmp_path / "venv" / ".installed").exists()
