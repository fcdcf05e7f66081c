"""Every shell and Python block of README.md and docs/*.md runs here in a tiny form, so a guide cannot rot;
and the plugin table of docs/methods-and-tasks.md is what `memdefrag plugins` generates.

How a block is shrunk, by the first word of each command line (`\\` continuations joined, comments dropped,
leading `VAR=value` assignments set for that command):
- `memdefrag <overrides>` and `memdefrag tracer-sweep <overrides>`: every job of the line (each point of a
  sweep) is composed and put through the runner's preflight, then the first job runs in-process. Each job
  runs on the tiny random checkpoint of tests/conftest.py (a tiny MemoryLLM or M+ for their models), with
  one group (one per shard), at most 2 updates (or up to the last of `eval_steps`), at most 3 fragments or
  questions, contexts cut to 200 tokens, 2 new tokens, one thread, no logger unless the line sets one, and
  the data made tiny under MEMDEFRAG_DATA; a `<placeholder>` the reader fills in (`model.source=<folder>`)
  is the tiny checkpoint. A line whose comment says `memdefrag: error: <message>` must be refused with
  exactly that message instead.
- `memdefrag <subcommand>`, `memdefrag-bench`, `python -m harness.<tool>`: the arguments are parsed by the
  tool's own parser and the tool stops there (an option or choice that no longer exists fails).
- `make <target>`: `make -n <target>` must succeed (it is a dry run: nothing is built).
- `pytest ...` (or `python -m pytest ...`): every `-m` marker is declared in pyproject.toml and every path
  exists.
- a script path (`results/run_gpu.sh`, `../shared/gpu/pack.sh`): it exists and `bash -n` parses it.
- other programs (`pip`, `wandb`, `git`, SLURM's, `tail`): not ours, not run; `timeout SECONDS` before a
  command is dropped, the command checked.
Python blocks run in a temporary folder. A block with `<!-- file: <path> -->` just above it is a file the
reader writes: it is written into a temporary plugin tree (`methods/`, `evals/`, `conf/`) that the page's
other blocks import and compose (`hydra.searchpath`), and a `tests/test_*.py` file has its tests called.
`<!-- doc-test: <overrides> -->` just above a block adds overrides to its `memdefrag` commands; the word `run`
there makes its `memdefrag <subcommand>` lines run for real instead of being parsed only.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"(?:<!-- (file|doc-test): (.*?) -->\n)?```(bash|python|yaml)\n(.*?)```", re.DOTALL)
EXTERNAL = {"pip", "wandb", "git", "sbatch", "srun", "squeue", "sinfo", "scancel", "sacct", "scontrol",
            "nvidia-smi", "ssh", "scp", "rsync", "cd", "export", "source", "ls", "cat", "tar", "tail", "rm"}
SUBCOMMANDS = {"compare", "report", "migrate", "collect", "merge", "cache", "plugins"}
STAND_INS = {"memoryllm_8b": "tiny_memoryllm", "mplus_8b": "tiny_mplus"}
SHRUNK = {"fragments": 3, "questions": 1, "max_context_tokens": 200}


class Parsed(Exception):
    """A tool parsed its arguments: where a parse-only command stops."""


def blocks(page: str) -> list[tuple[str | None, str | None, str, str]]:
    """(kind of the HTML comment above, its text, language, code) of every bash, Python or file block."""
    return [m.groups() for m in BLOCK.finditer((ROOT / page).read_text())
            if m.group(3) != "yaml" or m.group(1) == "file"]


def command_lines(code: str) -> list[tuple[list[str], str]]:
    """(words, comment) of each command of a shell block."""
    lines = []
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words and words != ["}"]:                # the end of a `{ ...; }` group: its lines were each checked
            lines.append((words, line.split(" #", 1)[1].strip() if " #" in line else ""))
    return lines


def tiny_data(folder: Path) -> Path:
    """A data folder every task reads from: NaturalQA and SQuAD in the authors' format (made from the synthetic
    set), LongBench from tests/testdata, LoCoMo's released file where ../shared has it."""
    from evals import synthetic

    data = synthetic.generate(42)
    for name in ("nqa", "squad"):
        (folder / name).mkdir(parents=True)
        (folder / name / "val_data.json").write_text(json.dumps(
            [{"context": t.context, "question": t.question, "answer": t.answer} for t in data.targets]))
        (folder / name / "unrelated_contexts_from_train.json").write_text(json.dumps(list(data.unrelated)))
    (folder / "longbench").symlink_to(ROOT / "tests" / "testdata" / "longbench")
    if (ROOT.parent / "shared" / "data" / "locomo").is_dir():
        (folder / "locomo").symlink_to(ROOT.parent / "shared" / "data" / "locomo")
    return folder


class Page:
    """One page's blocks, run in order in their own folder with their own plugin tree."""

    def __init__(self, request, folder: Path):
        self.request, self.folder, self.plugins, self.runs = request, folder, folder / "plugin", 0
        self.searchpath: list[str] = []

    def write(self, path: str, code: str) -> None:
        """A file the reader writes: importable (methods/, evals/) or composable (conf/) from the plugin tree."""
        target = self.plugins / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(code)
        package = ".".join(Path(path).parent.parts)
        if path.startswith(("methods/", "evals/")):
            module = importlib.import_module(package)
            if str(target.parent) not in module.__path__:
                module.__path__.append(str(target.parent))
        elif path.startswith("conf/"):
            from conf.schema import register_file

            register_file(target)
            self.searchpath = [f"hydra.searchpath=[file://{self.plugins / 'conf'}]"]
        elif path.startswith("tests/test_"):
            spec = importlib.util.spec_from_file_location(f"docs_{target.stem}", target)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            for name, test in inspect.getmembers(module, inspect.isfunction):
                if name.startswith("test_"):
                    test(**{p: self.fixture(p) for p in inspect.signature(test).parameters})
        else:
            raise AssertionError(f"{path}: the doc test writes files under methods/, evals/, conf/ or tests/ only")

    def fixture(self, name: str):
        if name == "tmp_path":
            self.runs += 1
            folder = self.folder / f"tmp{self.runs}"
            folder.mkdir()
            return folder
        return self.request.getfixturevalue(name)

    def shell(self, words: list[str], comment: str, extra: list[str], execute: bool = False) -> None:
        env = {}
        while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
            key, value = words.pop(0).split("=", 1)
            env[key] = value
        if words[:1] == ["timeout"]:                # `timeout SECONDS command`: the command is checked
            words = words[2:]
        program, args = words[0], words[1:]
        if program == "memdefrag" and args and args[0] in SUBCOMMANDS and execute:
            with pytest.MonkeyPatch.context() as patch, redirect_stdout(StringIO()):
                patch.setattr(sys, "argv", ["memdefrag", *args])
                importlib.import_module("harness.cli").main()
        elif program == "memdefrag" and args and args[0] in SUBCOMMANDS:
            self.parse_only("harness.cli", ["memdefrag", *args], argv=True)
        elif program == "memdefrag" and args[:1] == ["tracer-sweep"]:
            self.hydra("tracer_sweep", args[1:] + extra, comment)
        elif program == "memdefrag":
            self.hydra("config", args + extra, comment)
        elif program == "memdefrag-bench":
            self.parse_only("harness.measurement.benchmark", args)
        elif program.startswith("python") and args[:2] == ["-m", "pytest"]:
            self.pytest_args(args[2:])
        elif program.startswith("python") and args[:1] == ["-m"]:
            self.parse_only(args[1], args[2:])
        elif program == "make":
            done = subprocess.run(["make", "-n", *args], cwd=ROOT, env={**os.environ, **env},
                                  capture_output=True, text=True)
            assert done.returncode == 0, f"make -n {' '.join(args)}: {done.stderr}"
        elif program == "pytest":
            self.pytest_args(args)
        elif program.endswith(".sh"):
            assert (ROOT / program).is_file(), f"{program}: no such script"
            assert subprocess.run(["bash", "-n", str(ROOT / program)]).returncode == 0
        else:
            assert program in EXTERNAL, f"{program}: the doc test has no rule for this program (tests/test_docs.py)"

    def pytest_args(self, args: list[str]) -> None:
        options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
        markers = {m.split(":")[0] for m in options["markers"]}
        for flag, value in zip(args, args[1:] + [""]):
            if flag == "-m":
                assert set(re.findall(r"\w+", value)) - {"not", "and", "or"} <= markers, f"pytest -m {value}"
        for path in (a.split("::")[0] for a in args if a.startswith("tests/")):
            assert (ROOT / path).exists() or (self.plugins / path).exists(), f"pytest {path}: no such file"

    def parse_only(self, module: str, args: list[str], argv: bool = False) -> None:
        """Run a tool until its parser has read `args`; a bad argument exits with status 2."""
        from harness.errors import OneLineParser

        original = OneLineParser.parse_args

        def parsed(parser, *a, **k):
            original(parser, *a, **k)
            raise Parsed

        tool = importlib.import_module(module)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(OneLineParser, "parse_args", parsed)
            if argv:
                patch.setattr(sys, "argv", args)
            with pytest.raises(Parsed):
                tool.main() if argv else tool.main(args)

    def hydra(self, config_name: str, args: list[str], comment: str) -> None:
        """Compose and preflight every job of the command line in its tiny form, then run the first."""
        from hydra import initialize_config_module
        from omegaconf import open_dict

        from harness.errors import ConfigError
        from harness.running.jobs import composed, job_overrides
        from harness.running.runner import preflight, run
        from tests.conftest import tiny_overrides

        refused = re.search(r"memdefrag: error: (.*)", comment)
        args = [re.sub(r"<[^>]*>", "placeholder", a) for a in args]     # a value the reader fills in (a folder)
        configs = []
        with initialize_config_module("conf", version_base="1.3"):
            try:
                jobs = job_overrides(config_name, [*args, *self.searchpath]).jobs
                for job in jobs:
                    model = next((o.split("=", 1)[1] for o in job if o.startswith("model=")), None)
                    checkpoint = self.fixture(STAND_INS.get(model, "tiny_checkpoint"))
                    tiny = [o for o in tiny_overrides(checkpoint, small_task=False)     # a line that sets the
                            if o != "logger=none" or not any(a.startswith("logger") for a in job)]   # logger keeps it
                    cfg = composed(config_name, [*job, *tiny,
                                                 "model.memory_capacity=5000", "model.device=auto",
                                                 "max_new_tokens=2", "threads=1"], hydra=True)
                    with open_dict(cfg):
                        del cfg["hydra"]
                        shrink(cfg.task, int(str(cfg.shard).split("/")[1]) if cfg.shard else 1)
                    preflight(cfg)
                    configs.append(cfg)
            except ConfigError as err:
                assert refused, f"memdefrag {' '.join(args)}: refused: {err}"
                assert str(err) == refused.group(1), f"refused with another line: {err}"
                return
        assert not refused, f"memdefrag {' '.join(args)} was not refused"
        given = dict(a.split("=", 1) for a in args if a.startswith(("hydra.run.dir=", "hydra.sweep.dir=")))
        self.runs += 1
        folder = given.get("hydra.run.dir") or (given["hydra.sweep.dir"] + "/0" if "hydra.sweep.dir" in given
                                                else f"runs/{self.runs}")
        with redirect_stdout(StringIO()):
            run(configs[0], str(self.folder / folder))


def shrink(task, shards: int) -> None:
    """A task's tiny form: one group (one a shard), a few updates, fragments and questions, short contexts."""
    for key, most in {**SHRUNK, "groups": shards}.items():
        if key in task:
            task[key] = most if task[key] is None else min(task[key], most)
    if "updates" in task:
        task.updates = max(task.eval_steps) if task.get("eval_steps") else min(task.updates, 2)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tiny_data(tmp_path_factory.mktemp("data"))


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_every_block_of_the_page_runs_in_its_tiny_form(page, request, tmp_path, monkeypatch, data):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MEMDEFRAG_DATA", str(data))
    (tmp_path / "tracers.yaml").write_text((ROOT / "conf" / "tracers.yaml").read_text())   # tracer-sweep writes here
    monkeypatch.setenv("MEMDEFRAG_TRACERS", str(tmp_path / "tracers.yaml"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    runner = Page(request, tmp_path)
    found = blocks(page)
    for kind, note, language, code in sorted(found, key=lambda b: b[0] != "file"):   # the files first
        if kind == "file":
            runner.write(note, code)
        elif language == "python":
            exec(compile(code, f"{page} block", "exec"), {"__name__": "__docs__"})
        else:
            extra = shlex.split(note) if kind == "doc-test" else []
            for words, comment in command_lines(code):
                runner.shell(words, comment, [w for w in extra if w != "run"], execute="run" in extra)


def test_every_guide_has_blocks_and_the_readme_links_every_guide():
    readme = (ROOT / "README.md").read_text()
    for page in PAGES[1:]:
        assert f"({page})" in readme, f"README.md does not link {page}"
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150


def test_the_committed_plugin_table_is_the_generated_one():
    from harness.plugins.catalog import markdown, section

    committed = section((ROOT / "docs" / "methods-and-tasks.md").read_text())
    assert committed == markdown(), "docs/methods-and-tasks.md is stale: memdefrag plugins --write " \
                                    "docs/methods-and-tasks.md"


@pytest.mark.parametrize("line", ["memdefrag method=memdefrag method.kk=2", "memdefrag method=no_such_method",
                                  "memdefrag-bench --no-such-flag", "memdefrag compare A B --no-such-flag",
                                  "python -m harness.results.summary out --no-such-flag", "make no-such-target",
                                  "pytest -m no_such_marker", "frobnicate --now"])
def test_a_documented_command_or_option_that_no_longer_exists_fails(line, request, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (words, comment), = command_lines(line)
    with pytest.raises((AssertionError, SystemExit)):
        Page(request, tmp_path).shell(words, comment, [])
