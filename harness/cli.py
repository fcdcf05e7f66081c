"""The `memdefrag` command: a Hydra app composing a method plugin with a task plugin."""

from __future__ import annotations

import re
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

import conf  # noqa: F401 - registers the typed schemas the configs extend
from conf import schema
from conf.schema import CONF
from evals.probe import best_row
from harness.models import cache
from harness.plugins import catalog
from harness.report import collect
from harness.report import compare
from harness.report import migrate
from harness.report import document as report
from harness.running import shards
from harness.models import tracer_layers
from harness.errors import ConfigError, OneLineParser, stops_on_config_error
from harness.running.jobs import check_jobs
from harness.running.runner import run


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def app(cfg: DictConfig):
    hydra_cfg = HydraConfig.get()
    sweep_dir = hydra_cfg.sweep.dir if hydra_cfg.mode == RunMode.MULTIRUN else None
    with stops_on_config_error("memdefrag"):
        return run(cfg, hydra_cfg.runtime.output_dir, sweep_dir)


@hydra.main(config_path="../conf", config_name="tracer_sweep", version_base="1.3")
def tracer_sweep(cfg: DictConfig):
    """Probe the candidate layers, then record the best (layer, query mode) for the model."""
    with stops_on_config_error("memdefrag tracer-sweep"):
        table = run(cfg, HydraConfig.get().runtime.output_dir)
    best = best_row(table, cfg.task.select_by)
    choice = {"tracer_layer": int(best["layer"]), "query_mode": str(best["query_mode"]),
              "mean_rank": round(float(best["mean_rank"]), 3), "top1": round(float(best["top1"]), 1),
              "top2": round(float(best["top2"]), 1), "selected_by": cfg.task.select_by,
              "swept": tracer_layers.swept(cfg)}
    path = tracer_layers.record(cfg.model.name, choice)
    print(f"{cfg.model.name}: tracer_layer={choice['tracer_layer']} query_mode={choice['query_mode']} "
          f"(mean rank {choice['mean_rank']}, Top-1 {choice['top1']} %, selected by {cfg.task.select_by}), "
          f"recorded in {path}")


def verify_cache(argv: list[str]) -> None:
    """`memdefrag cache verify`: every entry of MEMDEFRAG_CACHE checked against its manifest; a damaged one is
    removed (its next use builds it again); exit 1 if any was."""
    parser = OneLineParser(prog="memdefrag cache", description=verify_cache.__doc__.splitlines()[0])
    parser.add_argument("action", choices=["verify"])
    parser.parse_args(argv)
    found = cache.verify()
    for entry, ok in found:
        print(f"{'intact' if ok else 'damaged, removed'}: {entry}")
    damaged = sum(not ok for _, ok in found)
    print(f"{len(found) - damaged} entries intact, {damaged} damaged ({cache.cache_dir()})")
    sys.exit(1 if damaged else 0)


def merge(argv: list[str]) -> None:
    """`memdefrag merge SWEEP_DIR...`: every complete set of shards below each folder, merged."""
    parser = OneLineParser(prog="memdefrag merge", description=merge.__doc__)
    parser.add_argument("folders", nargs="+")
    args = parser.parse_args(argv)
    with stops_on_config_error("memdefrag merge"):
        for folder in args.folders:
            for merged in shards.merge_sweep(folder):
                print(f"merged: {merged}")


def tracer_sweep_command(argv: list[str]) -> None:
    """`memdefrag tracer-sweep OVERRIDES`: every job checked first, then the sweep (as the run's)."""
    with stops_on_config_error("memdefrag tracer-sweep"):
        tracer_layers.start_file()
        schema.check_names()
        told = check_jobs("tracer_sweep", argv)
    sys.argv = [sys.argv[0], *argv, *told]
    tracer_sweep()


# Every subcommand: what runs it and what it does (the help's list).
COMMANDS = {
    "report": (report.main, "write the report of a folder of runs (its README.md, tables and figures)"),
    "plugins": (catalog.main, "list every method, task, forgetting, compressor, model and experiment"),
    "compare": (compare.main, "compare two runs answer by answer"),
    "migrate": (migrate.main, "bring committed run folders to the current format"),
    "collect": (collect.main, "copy a sweep's finished runs into a study folder of results/"),
    "merge": (merge, "merge the shards of a sweep into whole runs"),
    "cache": (verify_cache, "verify the cache of formed fragments (memdefrag cache verify)"),
    "tracer-sweep": (tracer_sweep_command, "probe the candidate tracer layers and record the best for the model"),
}


def help_text() -> str:
    """What `memdefrag --help` prints: the two ways to call it, every subcommand and every config group with its
    choices (the YAML files of conf/<group>/, not the schemas they extend)."""
    groups = sorted(p.name for p in CONF.iterdir() if p.is_dir() and p.name != "hydra" and any(p.glob("*.yaml")))
    lines = ["usage: memdefrag [GROUP=CHOICE ...] [KEY=VALUE ...]   run a method on a task with one model "
             "(-m: a sweep)", "       memdefrag SUBCOMMAND [ARGS ...]               (SUBCOMMAND --help: its own)",
             "", "subcommands:", *(f"  {name:<14}{text}" for name, (_, text) in COMMANDS.items()), "",
             "config groups (GROUP=CHOICE; `memdefrag plugins` gives each choice's options):"]
    lines += [f"  {group:<14}{', '.join(sorted(p.stem for p in (CONF / group).glob('*.yaml')))}" for group in groups]
    return "\n".join([*lines, "", "memdefrag --cfg job prints the composed config; memdefrag --hydra-help is Hydra's "
                                   "own page; docs/running.md says the rest."])


def main() -> None:
    """The Hydra app, or a subcommand named first."""
    command = sys.argv[1] if len(sys.argv) > 1 else None
    if command in COMMANDS:
        with stops_on_config_error(f"memdefrag {command}"):
            COMMANDS[command][0](sys.argv[2:])
    elif {"-h", "--help"} & set(sys.argv[1:]):
        print(help_text())
    else:
        with stops_on_config_error("memdefrag"):          # Ctrl-C or SIGTERM between a sweep's jobs too: one line
            if command is not None and re.fullmatch(r"\w[\w-]*", command):    # a word alone: no override
                raise ConfigError(f"{command!r} is neither a subcommand ({', '.join(COMMANDS)}) nor an override "
                                  f"(KEY=VALUE, GROUP=CHOICE); memdefrag --help lists both")
            schema.check_names()
            sys.argv += check_jobs("config", sys.argv[1:])
            app()
