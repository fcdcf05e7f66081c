"""harness/ by concern: each sub-package imports only those below it (lazy imports inside functions included), and
methods/ and evals/ import nothing of the harness, so that a reader finds the report without the running code and
a model's loading without either."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Lowest first: a module may import its own package and those before it.
LAYERS = ["errors", "results", "plugins", "models", {"running", "measurement"}, "report", {"cli", "__main__"}]


def layer(module: str) -> int:
    """The layer of a harness module (`harness.results.folder` -> 1); the package itself is the top."""
    part = module.split(".")[1] if "." in module else "__main__"
    return next(i for i, names in enumerate(LAYERS) if part in ({names} if isinstance(names, str) else names))


def imported(path: Path) -> set[str]:
    """Every harness module a file imports, at its top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "harness":
            found |= {node.module if node.module != "harness" else f"harness.{a.name}"
                      if (ROOT / "harness" / a.name).is_dir() or (ROOT / "harness" / f"{a.name}.py").is_file()
                      else "harness" for a in node.names}      # a module of the package, or a name of its own
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "harness"}
    return found


MODULES = sorted(p for p in (ROOT / "harness").rglob("*.py") if p.name != "__init__.py" or p.parent.name != "harness")


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_harness_module_imports_only_its_own_layer_and_those_below(path):
    module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
    upward = sorted(m for m in imported(path) if layer(m) > layer(module))
    assert not upward, f"{module} imports {upward}, above its layer ({LAYERS})"


def test_every_harness_module_lives_in_a_sub_package_but_the_entry_points():
    loose = sorted(p.name for p in (ROOT / "harness").glob("*.py"))
    assert loose == ["__init__.py", "__main__.py", "cli.py", "errors.py"], loose


@pytest.mark.parametrize("package", ["methods", "evals"])
def test_methods_and_tasks_import_nothing_of_the_harness(package):
    users = sorted(str(p.relative_to(ROOT)) for p in (ROOT / package).rglob("*.py") if imported(p))
    assert not users, users


def test_a_result_folder_and_the_cache_load_no_model_code():
    """What a report, a merge or the cache's commands read starts without torch (seconds per process)."""
    done = subprocess.run([sys.executable, "-c", "import sys, harness.results.folder, harness.results.summary, "
                           "harness.models.cache; print(sorted({'torch', 'transformers'} & set(sys.modules)))"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
