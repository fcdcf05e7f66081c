"""A plugin's contract (harness.plugins.contracts.CONTRACTS) checked when it is composed: a plugin that breaks it is refused
in one line naming the missing piece, before any weights load. The plugins below are a newcomer's, each wrong in
one way; tests/test_bad_input.py runs them through the real command."""

import re

import pandas as pd
import pytest
from omegaconf import OmegaConf

from evals.retention import Retention
from harness.errors import ConfigError
from harness.plugins.contracts import CONTRACTS, build, check_groups, check_record, metrics_table
from methods.base import Method, Plan
from methods.baselines import Vanilla
from methods.compression.compressor import NoCompression


class RecencyWindow(Method):
    """The newest fragments as the prefix, with `plan` written as the README once gave it (three arguments)."""

    def __init__(self, window: int = 2):
        self.window = window

    def plan(self, memory, prompt_ids, backend):
        return Plan(latent=memory)


class UnannotatedWindow(Method):
    """An option without an annotation: its default's type is its type."""

    def __init__(self, window=2):
        self.window = window

    def plan(self, memory, prompt_ids, backend, question=None):
        return Plan(latent=memory)


class Budgeted(Method):
    """Refuses its own option, naming it: the message is shown as it is, not prefixed twice."""

    def __init__(self, budget: int = 0):
        if budget < 1:
            raise ValueError(f"method.budget={budget} must be >= 1")


class GemmaOnly(Vanilla):
    """Refuses the model with a plain TypeError, as a newcomer writes it."""

    def check_model(self, model_config):
        raise TypeError("it runs on gemma2 checkpoints only")


class Offline(NoCompression):
    """Its compressor cannot be had here: a plain ValueError, unprefixed."""

    def check(self):
        raise ValueError("its service cannot be reached offline")


class Passkey:
    """A task with everything but `run_group`."""

    def __init__(self, **options):
        self.dataset = options.get("dataset")

    def check(self):
        pass

    def check_model(self, model_config, tokenizer):
        pass

    def groups(self, tokenizer):
        return []

    def metrics(self, records):
        return pd.DataFrame()

    def describe(self):
        return {}


class ShortWindow(Retention):
    """Refuses the model with a plain ValueError, as a newcomer writes it."""

    def check_model(self, model_config, tokenizer):
        raise ValueError("this task needs a window of 1,000,000 positions")


class NoData(Retention):
    """Its groups cannot be had: a plain ValueError, as a newcomer raises it."""

    def groups(self, tokenizer):
        raise ValueError("the passkey file is empty")


class Unnumbered(Retention):
    """Its groups have no index."""

    def groups(self, tokenizer):
        return [type("Group", (), {"texts": lambda self: ["a"]})()]


class TextsOfAStep(Retention):
    """Its groups' `texts` takes an argument."""

    def groups(self, tokenizer):
        return [type("Group", (), {"index": 0, "texts": lambda self, step: ["a"]})()]


def node(target: str, **options):
    return OmegaConf.create({"_target_": f"{__name__}.{target}", **options})


def test_a_method_whose_plan_cannot_take_the_harness_call_is_refused_naming_both():
    with pytest.raises(ConfigError) as refused:
        build(node("RecencyWindow"), "method")
    assert str(refused.value) == ("method RecencyWindow.plan(memory, prompt_ids, backend) cannot take the harness's "
                                  "call plan(memory, prompt_ids, backend, question)")


def test_a_task_without_a_member_is_refused_naming_it_and_its_call():
    with pytest.raises(ConfigError, match=r"^task Passkey has no `run_group\(session, group\)`, which the harness "
                                          r"uses$"):
        build(node("Passkey", dataset="passkey"), "task")


def test_a_task_without_a_dataset_option_is_refused():
    with pytest.raises(ConfigError, match=r"^task Passkey has no `dataset` option: the harness names each run by "
                                          r"its task.dataset"):
        build(node("Passkey"), "task")


def test_a_plugin_message_that_names_its_option_is_not_prefixed_again():
    with pytest.raises(ConfigError) as refused:
        build(node("Budgeted"), "method")
    assert str(refused.value) == "method.budget=0 must be >= 1"


@pytest.mark.parametrize("task, message", [
    ("Unnumbered", "task: its group Group has index=None; the runner needs an integer `index` per group"),
    ("TextsOfAStep", "task: its group Group needs `texts()`, taking no arguments"),
])
def test_groups_without_what_the_runner_reads_are_refused(task, message):
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}"):
        check_groups(build(node(task, dataset="synthetic"), "task").groups(None))


def test_a_record_without_its_group_and_metrics_that_are_no_table_are_refused():
    with pytest.raises(ConfigError, match=r"^task: run_group yielded a record with group=None for group 3; "):
        check_record({"step": 1}, 3)
    check_record({"group": 3}, 3)
    task = Retention()
    task.metrics = lambda records: {"accuracy": 1.0}
    with pytest.raises(ConfigError, match=r"^task Retention.metrics returned a dict; it must return a pandas "
                                          r"DataFrame"):
        metrics_table(task, [], "vanilla")


@pytest.mark.parametrize("kind", sorted(CONTRACTS))
def test_every_shipped_plugin_keeps_its_contract(kind):
    """The contracts are what the shipped plugins already do: each one's YAML composes and passes."""
    from pathlib import Path

    from hydra import compose, initialize_config_module

    import conf  # noqa: F401

    names = sorted(p.stem for p in (Path(conf.__file__).parent / kind).glob("*.yaml"))
    with initialize_config_module("conf", version_base="1.3"):
        for name in names:
            cfg = compose("config", overrides=[f"{kind}={name}", "model.memory_capacity=12800"])
            if kind == "compression" and name.startswith("llmlingua"):
                continue                    # needs its model's weights to be built
            build(cfg[kind], kind)


def names_refused(tmp_path, monkeypatch, extends: str, target: str) -> str:
    """What check_names says of a conf/ holding method/recency_window.yaml extending `extends`, of `target`."""
    from conf import schema

    (tmp_path / "conf" / "method").mkdir(parents=True)
    (tmp_path / "conf" / "method" / "recency_window.yaml").write_text(
        f"defaults:\n  - {extends}\n  - _self_\n\n_target_: {target}\nlabel: recency\n")
    monkeypatch.setattr(schema, "CONF", tmp_path / "conf")
    monkeypatch.setattr(schema, "MISNAMED", {})
    monkeypatch.setattr(schema, "UNLOADABLE", {})
    schema.register()
    with pytest.raises(ConfigError) as refused:
        schema.check_names()
    return str(refused.value)


def test_a_yaml_that_extends_its_schema_under_another_name_is_refused_naming_the_expected_one(tmp_path, monkeypatch):
    said = names_refused(tmp_path, monkeypatch, "recency_schema", f"{__name__}.RecencyWindow")
    assert said == ("conf/method/recency_window.yaml extends recency_schema, but its schema is named "
                    "recency_window_schema (the file's name + _schema) or after its _target_'s class: write "
                    "`defaults: [recency_window_schema, _self_]`")


@pytest.mark.parametrize("target, cause", [
    (f"{__name__}.RecencyWindw", f"AttributeError: module '{__name__}' has no attribute 'RecencyWindw'"),
    ("methods.no_such_module.Recency", "AttributeError: module 'methods' has no attribute 'no_such_module'"),
])
def test_a_yaml_whose_target_names_no_class_is_one_line_naming_the_file(target, cause, tmp_path, monkeypatch):
    """A typo in a plugin's _target_ (every YAML of conf/ is read as the package imports) is the file named in one
    line when a command starts, not a traceback out of every command."""
    said = names_refused(tmp_path, monkeypatch, "recency_window_schema", target)
    assert said.startswith(f"conf/method/recency_window.yaml: _target_={target} cannot be loaded ({cause}")


@pytest.mark.parametrize("value, accepted", [("3", True), ("two", False), ("1.5", False)])
def test_an_option_without_an_annotation_takes_its_default_s_type(value, accepted, tmp_path, monkeypatch):
    from hydra import compose, initialize_config_module
    from hydra.errors import HydraException
    from omegaconf.errors import ValidationError

    from conf import schema

    (tmp_path / "conf" / "method").mkdir(parents=True)
    (tmp_path / "conf" / "method" / "unannotated_window.yaml").write_text(
        f"defaults:\n  - unannotated_window_schema\n  - _self_\n\n_target_: {__name__}.UnannotatedWindow\n"
        f"label: unannotated\n")
    schema.register_file(tmp_path / "conf" / "method" / "unannotated_window.yaml")
    overrides = ["method=unannotated_window", f"method.window={value}", f"hydra.searchpath=[file://{tmp_path}/conf]"]
    with initialize_config_module("conf", version_base="1.3"):
        if accepted:
            assert compose("config", overrides=overrides).method.window == int(value)
        else:
            with pytest.raises((HydraException, ValidationError), match=f"override method.window={value}") as bad:
                compose("config", overrides=overrides)
            assert "could not be converted to Integer" in str(bad.value.__cause__)


def test_a_plugin_of_several_words_is_named_by_its_yaml_in_its_schema_and_its_report_command(tmp_path, monkeypatch):
    """`RecencyWindow` in recency_window.yaml (issue 55: `OwnJsonl` in own_jsonl.yaml had the report print
    `memdefrag task=ownjsonl`, which does not exist): the YAML extends recency_window_schema, and the name the
    report gives its command is the YAML's."""
    from hydra import compose, initialize_config_module

    from conf import schema
    from harness.plugins.contracts import config_name

    (tmp_path / "conf" / "method").mkdir(parents=True)
    (tmp_path / "conf" / "method" / "recency_window.yaml").write_text(
        f"defaults:\n  - recency_window_schema\n  - _self_\n\n_target_: {__name__}.RecencyWindow\nlabel: recency\n")
    monkeypatch.setattr(schema, "MISNAMED", {})
    schema.register_file(tmp_path / "conf" / "method" / "recency_window.yaml")
    schema.check_names()
    with initialize_config_module("conf", version_base="1.3"):
        cfg = compose("config", overrides=["method=recency_window", "method.window=3",
                                           f"hydra.searchpath=[file://{tmp_path / 'conf'}]"])
    assert (cfg.method._target_, cfg.method.window) == (f"{__name__}.RecencyWindow", 3)
    assert config_name("method", f"{__name__}.RecencyWindow", tmp_path / "conf") == "recency_window"
    assert config_name("task", "evals.retention.Retention") == "retention"
    assert config_name("method", "methods.memdefrag.MemDefrag") == "memdefrag"     # not memdefrag_top1..


def test_python_m_harness_is_the_memdefrag_command():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "harness", "resume=2"], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr == ("memdefrag: error: resume=2: resume is a boolean option, it takes "
                                                    "true or false\n")
