"""From cases to a property: overrides drawn from the option space the project declares (every config group's
options, every key of the composed config), with valid values, boundaries, wrong types, non-finite numbers, odd
paths, empty strings and integers for booleans. Each draw either starts its job (checked, never run: no weights load) or ends the
command with exit 2 and one line naming one of the options it was given before Hydra runs anything; never a
traceback, never a write. A fixed seed and MEMDEFRAG_DRAWS draws (default 40); every failure it found is kept as
an explicit row of tests/test_bad_input.py."""

import os
import sys

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM

from conf.schema import CONF
from harness import cli
from harness.results.folder import flattened
from tests.test_config import composed

GROUPS = {group: sorted(p.stem for p in (CONF / group).glob("*.yaml"))
          for group in ("method", "task", "forgetting", "compression", "model")}
DEFAULTS = flattened(OmegaConf.to_container(composed("logger=none"), resolve=False))
KEYS = sorted(k for k in DEFAULTS if not k.startswith(("hydra", "logger")))
BOOLEANS = sorted(k for k in KEYS if isinstance(DEFAULTS[k], bool))      # take true or false, nothing else
VALUES = ["0", "1", "-1", "2", "1000000000", "0.5", "-0.5", "nan", "inf", "-inf", "abc", "''", "true", "null",
          "[1,2]", "[]", "/nonexistent/x", "../escaped"]
OVERRIDES = st.one_of(
    st.sampled_from([f"{group}={option}" for group, options in GROUPS.items() for option in options]),
    st.builds(lambda key, value: f"{key}={value}", st.sampled_from(KEYS), st.sampled_from(VALUES)),
    st.builds(lambda key, value: f"{key}={value}", st.sampled_from(BOOLEANS), st.integers(-3, 3)))
DRAWS = int(os.environ.get("MEMDEFRAG_DRAWS", "40"))


def named(line: str, overrides: list[str]) -> bool:
    """Whether a refusal names an option it was given: its key, the group it lies in, or its value."""
    for override in overrides:
        key, value = override.split("=", 1)
        if key in line or key.split(".")[0] in line or (len(value) > 2 and value.strip("'") in line):
            return True
    return False


@seed(20261125)
@settings(max_examples=DRAWS, deadline=None, derandomize=False,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(overrides=st.lists(OVERRIDES, min_size=1, max_size=3))
def test_every_drawn_command_line_starts_or_is_refused_in_one_line_naming_its_option(overrides, tmp_path_factory,
                                                                                    monkeypatch, capsys):
    folder = tmp_path_factory.mktemp("draw")
    started = []
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("weights loaded"))
    monkeypatch.setattr(cli, "app", lambda: started.append(sys.argv))     # the checks pass: Hydra would run it
    monkeypatch.chdir(folder)
    monkeypatch.setattr(sys, "argv", ["memdefrag", *overrides, "logger=none", f"hydra.run.dir={folder / 'run'}"])
    capsys.readouterr()
    try:
        cli.main()
    except SystemExit as exit_:
        lines = capsys.readouterr().err.strip().splitlines()
        assert exit_.code == 2 and len(lines) == 1 and lines[0].startswith("memdefrag: error: "), (overrides, lines)
        assert named(lines[0], overrides), (overrides, lines[0])
        assert not started
    else:
        assert len(started) == 1, overrides
        assert not any(o.split("=")[0] in BOOLEANS and o.split("=")[1].lower() not in ("true", "false")
                       for o in overrides), overrides                    # a boolean given anything else ran
    assert list(folder.iterdir()) == [], overrides                            # the checks wrote nothing
