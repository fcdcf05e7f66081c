"""`memdefrag collect RUNS_DIR STUDY`: copy finished or partial runs into RESULTS/STUDY/<dataset>/<run label>/
and rebuild RESULTS/README.md from everything there (`memdefrag report`).

A run's folder is named by the label its tables print (harness.results.summary.run_labels: method, forgetting,
compressor, then each other setting that differs between the runs collected together) made plain
(harness.results.folder.folder_name: its plain words, and a short digest of the label where it names a setting).
A destination that already holds a run of other settings is refused, before anything is copied: collecting
never overwrites another run's results.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from harness.report import document as report
from harness.report.compare import config_key
from harness.errors import ConfigError, OneLineParser
from harness.results.paths import inside, writable_folder
from harness.results.folder import atomic_write, folder_name, read_config
from harness.results.summary import run_folders, run_labels

FILES = ("config.yaml", "predictions.jsonl", "groups.jsonl", "metrics.csv", "run.json")


def destinations(runs: list[Path], into: Path) -> list[Path]:
    """Where each run goes: where a run of its settings already lies, or under its label among the runs already
    there and those collected with it (a setting that tells it from a run there joins its label); refused where
    a place is taken by a run of other settings, or by two runs."""
    present = run_folders(into) if into.is_dir() else []
    same = {config_key(folder, ()): folder for folder in present}
    configs = [OmegaConf.to_container(read_config(run)) for run in [*present, *runs]]
    labels = run_labels(configs)[len(present):]
    places = [same.get(config_key(run, ())) or into / config["task"]["dataset"] / folder_name(label)
              for run, config, label in zip(runs, configs[len(present):], labels)]
    for run, place in zip(runs, places):
        if places.count(place) > 1:
            together = [r for r, p in zip(runs, places) if p == place]
            if any(read_config(r).get("shard") for r in together):
                raise ConfigError(f"runs {[str(r) for r in together]} are shards of one run: join them with "
                                  f"`memdefrag merge {runs[0].parent}` and collect the merged run")
            raise ConfigError(f"runs {[str(r) for r in together]} would all be collected as {place}: collect "
                              f"them separately, or give them distinct labels")
        if (place / "config.yaml").is_file() and config_key(place, ()) != config_key(run, ()):
            raise ConfigError(f"{place} holds a run with other settings than {run}: collect into another "
                              "study, or move that run away first")
    return places


def collect(runs_dir: Path, study: str, into: Path) -> list[Path]:
    """Copy every run below runs_dir into into/study (which must stay inside `into`, a folder this user may
    write); returns the folders written."""
    writable_folder("--into", into)
    target = inside("study", study, into)
    runs = run_folders(runs_dir)
    if not runs:
        raise ConfigError(f"{runs_dir} holds no run (a folder with config.yaml and predictions.jsonl): "
                          "nothing collected")
    places = destinations(runs, target)
    for run, place in zip(runs, places):
        place.mkdir(parents=True, exist_ok=True)
        for name in FILES:
            if (run / name).is_file():
                atomic_write(place / name, (run / name).read_text(encoding="utf-8"))
    return places


def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(prog="memdefrag collect", description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, help="a folder holding run folders (a sweep, outputs/...)")
    parser.add_argument("study", help="the folder under RESULTS they go to, e.g. retention")
    parser.add_argument("--into", type=Path, default=Path("results"), help="RESULTS (default: results)")
    args = parser.parse_args(argv)
    for place in collect(args.runs, args.study, args.into):
        print(f"collected: {place}")
    print(report.write(args.into))
