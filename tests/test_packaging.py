"""The package runs on every Python it claims: CI (.ci/run) builds its environment with the oldest claimed
version, where every module must import and every shipped config compose (tests/test_config.py)."""

import importlib
import pkgutil
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
PACKAGES = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]


def oldest_claimed() -> tuple[int, int]:
    """The lower bound of `requires-python` (">=3.11" -> (3, 11))."""
    bound = PROJECT["requires-python"].removeprefix(">=")
    return tuple(int(part) for part in bound.split(".")[:2])


def test_this_interpreter_is_one_the_package_claims():
    assert sys.version_info[:2] >= oldest_claimed()


@pytest.mark.parametrize("module", sorted(PACKAGES + [
    f"{package}.{info.name}" for package in PACKAGES
    for info in pkgutil.iter_modules([str(ROOT / package.replace(".", "/"))])
    if info.name != "__main__"]))                                 # runs the command when imported
def test_every_module_imports(module):
    importlib.import_module(module)
