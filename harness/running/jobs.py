"""Every job a command line asks for, composed as Hydra will and checked before the first one starts.

Hydra reports a bad override over several lines, and a multirun finds a bad job only when it
reaches it, after running the ones before. Here the command line (with an experiment's sweep
parameters) is expanded into its jobs; each is composed against the typed schemas and put through
the runner's preflight, so bad input anywhere ends the command with one line, before any job runs
or any weights load.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from pathlib import Path
from typing import NamedTuple

from hydra import compose, initialize_config_module
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from harness.errors import ConfigError
from harness.plugins.contracts import LABELLED
from harness.results.folder import ResultFolder, RunLock, holds_results, read_config, same_run, settings_of
from harness.results.paths import job_folder, writable_folder
from harness.running.runner import check_given, preflight

CONF = Path(__file__).resolve().parents[2] / "conf"
RUN_FLAGS = ("-m", "--multirun")          # any other Hydra flag (--help, --cfg, ...) asks for no run, except:
# Hydra's flags that run another config, or one from elsewhere, than the one every job is checked against
CONFIG_FLAGS = ("-cp", "--config-path", "-cn", "--config-name", "-cd", "--config-dir", "--experimental-rerun")


# Hydra's words for a key of a config file that its schema (the plugin's constructor) lacks
AVAILABLE = re.compile(r"Available options in '(?P<group>[^']+)':\n(?P<options>(?:\t.*\n?)*)")
UNKNOWN_KEY = re.compile(r"In '(?P<file>[^']+)': ConfigKeyError raised while composing config:\n"
                         r"Key '(?P<key>[^']+)' not in '(?P<schema>\w+)'")


def one_line(err: Exception) -> ConfigError:
    """A composition error as one line: the key, the value and what is allowed."""
    while err.__cause__ is not None and isinstance(err, HydraException):
        err = err.__cause__
    unknown = UNKNOWN_KEY.match(str(err))
    if unknown:
        return unknown_key(**unknown.groupdict())
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    key, schema = getattr(err, "full_key", None), getattr(err, "object_type", None)
    if isinstance(err, (ConfigAttributeError, ConfigKeyError)) and key and dataclasses.is_dataclass(schema):
        return ConfigError(not_an_option(key, schema.__name__, [f.name for f in dataclasses.fields(schema)]))
    if isinstance(err, OmegaConfBaseException) and key:
        return ConfigError(f"{key}: {text}")
    offered = AVAILABLE.search(str(err))                # a config group's option it lacks: Hydra lists the others
    if offered:
        options = [o for o in offered.group("options").split() if not o.endswith("_schema")]
        return ConfigError(f"{text}; {offered.group('group')} is one of {', '.join(options)}")
    return ConfigError(text)


def unknown_key(file: str, key: str, schema: str) -> ConfigError:
    """A config file's key that its plugin's constructor does not take: the key, the file and the options the
    constructor does take (its schema's, conf/schema.py)."""
    group = file.split("/")[0]
    nodes = ConfigStore.instance().repo.get(group, {})
    found = next((entry.node for entry in nodes.values() if hasattr(entry, "node")
                  and OmegaConf.get_type(entry.node).__name__ == schema), None)
    path = CONF / f"{file}.yaml"
    return ConfigError(f"{path.relative_to(CONF.parent) if path.is_file() else file + '.yaml'}: "
                       f"{not_an_option(key, schema, list(found.keys()) if found is not None else [])}")


def not_an_option(key: str, schema: str, options: list[str]) -> str:
    """A key its schema (a plugin's constructor, or the run's settings) lacks, and the options it takes."""
    taken = [option for option in options if option not in ("_target_", "label")]
    return (f"{key} is not an option of {schema.removesuffix('Schema')}, which takes "
            f"{', '.join(taken) or 'none'} (besides _target_ and label)")


def composed(config_name: str, overrides: list[str], hydra: bool = False):
    try:
        return compose(config_name, overrides=overrides, return_hydra_config=hydra)
    except (HydraException, OmegaConfBaseException, ValueError) as err:
        raise one_line(err) from None


class CommandLine(NamedTuple):
    """A command line's overrides less its sweeps, those composed (with Hydra's config), and every job's overrides:
    one for a run (the overrides as given: the composition's own unless a sweep is among them, which Hydra
    refuses without -m), one per point of a multirun."""
    lines: list[str]
    composed: DictConfig
    jobs: list[list[str]]
    multirun: bool


def job_overrides(config_name: str, args: list[str]) -> CommandLine:
    """Every job `args` ask for, its boolean options checked on the command line's composition."""
    overrides = [a for a in args if a not in RUN_FLAGS]
    parser = OverridesParser.create()
    try:
        parsed = parser.parse_overrides(overrides)
    except HydraException as err:
        raise one_line(err) from None
    lines = [o.input_line for o in parsed if not o.is_sweep_override()]
    base = composed(config_name, lines, hydra=True)
    check_booleans(loose_values(parsed), base)
    multirun = any(a in RUN_FLAGS for a in args) or base.hydra.mode == RunMode.MULTIRUN
    launcher = base.hydra.runtime.choices.get("hydra/launcher")
    if not multirun and launcher not in (None, "basic"):
        raise ConfigError(f"hydra/launcher={launcher} launches a sweep's jobs: add -m (--multirun), or leave the "
                          f"launcher out to run here")
    check_given(base)                           # before the folder, which may be named by what is missing
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    try:
        folder = OmegaConf.select(base, key, throw_on_missing=True)
    except OmegaConfBaseException as err:       # a folder named by a value the command line took away (~task)
        raise one_line(err) from None
    if not str(folder or "").strip():
        raise ConfigError(f"{key}={folder or ''}: names no folder; give the folder the run writes into")
    writable_folder("output folder", folder)
    if not multirun:
        return CommandLine(lines, base, [overrides], False)
    params = base.hydra.sweeper.params
    params = OmegaConf.to_container(params) if params else {}
    return CommandLine(lines, base, expanded(parser.parse_overrides(                  # the sweeper's order: its
        [f"{key}={value}" for key, value in params.items()] + overrides)), True)      # params, then the command line


def loose_values(parsed) -> list[tuple[str, str]]:
    """(key, value) of every command-line value other than true, false or null (each of a sweep's)."""
    return [(o.key_or_group, value) for o in parsed if o.value_type is not None
            for value in (o.sweep_string_iterator() if o.is_sweep_override() else [o.get_value_element_as_str()])
            if str(value).lower() not in ("true", "false", "null")]


def check_booleans(loose: list[tuple[str, str]], cfg: DictConfig) -> None:
    """Refuse a loose value given to a boolean option (OmegaConf would take 2 as true), naming the key and the
    value: `cfg` is the command line composed, where such an option's value came out a bool."""
    for key, value in loose:              # a value that resolves only inside the job (${hydra:...}) is no boolean
        if isinstance(OmegaConf.select(cfg, key, default=None, throw_on_resolution_failure=False), bool):
            raise ConfigError(f"{key}={value}: {key} is a boolean option, it takes true or false")


def expanded(parsed) -> list[list[str]]:
    """Every job of a multirun, as Hydra's basic sweeper forms them: per key (the last override of a key
    wins, in the place of its first), its value or each of its sweep's values; the cartesian product."""
    choices: dict[str, list[str]] = {}
    for override in parsed:
        key = override.get_key_element()
        if override.is_sweep_override() and not override.is_discrete_sweep():
            raise ConfigError(f"{override.input_line}: the basic sweeper takes lists, choice() and range(), not "
                              f"{override.value_type.name.lower()} sweeps")
        choices[key] = ([f"{key}={value}" for value in override.sweep_string_iterator()]
                        if override.is_sweep_override() else [f"{key}={override.get_value_element_as_str()}"])
    return [list(job) for job in itertools.product(*choices.values())]


def check_jobs(config_name: str, args: list[str]) -> list[str]:
    """Compose and preflight every job of the command line, a run's one composed once; for an informational flag
    (--cfg, ...), which runs nothing, only its boolean values, and Hydra reports any other error itself. Returns
    what Hydra's run takes beside the command line: a sweep's folder names told apart (`told_apart`)."""
    other = next((a for a in args if a.split("=", 1)[0] in CONFIG_FLAGS), None)
    if other is not None:
        raise ConfigError(f"{other}: memdefrag runs conf/{config_name}.yaml, every job checked before the first "
                          f"starts; choose what runs by overrides, or by experiment=<name> (conf/experiment/)")
    with initialize_config_module("conf", version_base="1.3"):
        if any(a.startswith("-") and a not in RUN_FLAGS for a in args):
            check_informational(config_name, [a for a in args if not a.startswith("-")])
            return []
        line = job_overrides(config_name, args)
        jobs = line.jobs
        configs = [line.composed if jobs == [line.lines] else composed(config_name, job, hydra=True) for job in jobs]
        folders = [job_folder(cfg, num, line.multirun) for num, cfg in enumerate(configs)]
        subdir = told_apart(jobs, configs, folders, args) if line.multirun else None
        if subdir is not None:
            folders = [job_folder(cfg, num, multirun=True) for num, cfg in enumerate(configs)]
        earlier = EarlierRuns(folders, configs) if line.multirun else None
        named: dict[tuple[str, str], set[str]] = {}      # (kind, label) -> the classes the sweep gives it to
        writes: dict[Path, str] = {}                     # folder -> the job that writes it
        for job, cfg, folder in zip(jobs, configs, folders):
            choices = dict(cfg.hydra.runtime.choices)
            with open_dict(cfg):
                del cfg["hydra"]
            try:
                preflight(cfg, choices)
                check_folder(folder, cfg, " ".join(job), writes)
                if earlier is not None and cfg.resume and folder is not None and not folder.exists():
                    earlier.claim(folder, cfg)
            except ConfigError as err:
                raise ConfigError(f"{err} (job {' '.join(job)})" if len(jobs) > 1 else str(err)) from None
            for kind in LABELLED:
                named.setdefault((kind, cfg[kind].label), set()).add(cfg[kind]._target_)
        for (kind, label), targets in named.items():
            if len(targets) > 1:
                raise ConfigError(f"{kind}.label={label!r} names {len(targets)} {kind} classes in this sweep "
                                  f"({', '.join(sorted(targets))}), whose runs the tables would pool: give each its "
                                  f"own label")
        if earlier is not None:
            earlier.take_over()
    return [] if subdir is None else [f"hydra.sweep.subdir='{subdir}'"]


class EarlierRuns:
    """The runs a sweep's folder holds under a name the sweep named them by before, which no job of the command
    writes: numbered (`<n>_<name>`, before 2026-11-29) or without the words of a setting swept since (`<name>` for
    `<name>_seed-0`). A job whose folder is not there yet takes over a run of its settings so named, renamed to the
    job's folder once every job has passed its checks, so that it resumes there rather than runs again beside it.
    Its settings are those a resume keeps, and those a resume may change (ResultFolder.FREE: threads, logger, ...)
    where the command's jobs differ in them (a sweep over threads: the run goes to the job of its own threads).
    Never a run named after more settings than the job: two commands sharing a folder do not rename each other's
    runs back and forth."""

    def __init__(self, folders: list[Path | None], configs: list[DictConfig]):
        named = set(folders)
        self.aside = tuple(key for key in ResultFolder.FREE if len({repr(cfg.get(key)) for cfg in configs}) == 1)
        self.left = {earlier: settings for sweep in sorted({f.parent for f in named if f is not None})
                     if sweep.is_dir() for earlier in sorted(sweep.iterdir())
                     if earlier.is_dir() and earlier not in named and holds_results(earlier)
                     for settings in [self.settings(earlier)] if settings is not None}
        self.renames: list[tuple[Path, Path]] = []

    def settings(self, folder: Path) -> dict | None:
        """The settings of the run a folder holds; None where its config cannot be read (no run to take over)."""
        try:
            return settings_of(read_config(folder), aside=self.aside)
        except (ConfigError, OmegaConfBaseException):
            return None

    def claim(self, folder: Path, cfg: DictConfig) -> None:
        """The first earlier run of `cfg`'s settings named before `folder`, to be renamed `folder`."""
        wanted = settings_of(cfg, aside=self.aside)
        for earlier, settings in self.left.items():
            base = re.sub(r"^\d+_", "", earlier.name)
            if settings == wanted and re.fullmatch(re.escape(base) + r"(_.+)?", folder.name):
                del self.left[earlier]
                self.renames.append((earlier, folder))
                return

    def take_over(self) -> None:
        """Every claimed run locked first (refused in one line, nothing renamed, while another run writes one),
        then renamed."""
        locks = []
        try:
            for earlier, folder in self.renames:
                locks.append(RunLock(earlier, then=f"its job ({folder.name}) would resume it: run the command again "
                                                   f"once it has ended"))
            for earlier, folder in self.renames:
                earlier.rename(folder)
                print(f"memdefrag: {earlier} holds the run of {folder.name}: renamed so, to resume it there")
        finally:
            for lock in locks:
                lock.release()


def told_apart(jobs: list[list[str]], configs: list[DictConfig], folders: list[Path | None],
               args: list[str]) -> str | None:
    """A sweep's folder name (hydra.sweep.subdir) followed by `_<key>-<value>` for each setting that differs
    between jobs the name alone would put in one folder (`folders`: each job's by that name; sorted by key: the
    names do not depend on the order of the sweep's values, so a sweep reordered or extended resumes into the same
    folders); set on `configs`. None where every job has a folder of its own, or the command line names the
    folders itself."""
    if None in folders or len(set(folders)) == len(folders) or any(a.startswith("hydra.sweep.subdir=") for a in args):
        return None
    settings = [dict(override.split("=", 1) for override in job) for job in jobs]
    keys: set[str] = set()
    for folder in {f for f in folders if folders.count(f) > 1}:
        together = [setting for setting, f in zip(settings, folders) if f == folder]
        keys |= {key for setting in together for key in setting
                 if len({s.get(key) for s in together}) > 1 and re.fullmatch(r"\+*[\w.]+", key)}
    if not keys:
        return None
    keys = {key.lstrip("+") for key in keys}
    short = {key: key.rsplit(".", 1)[-1] for key in keys}
    groups = configs[0].hydra.runtime.choices
    words = [f"{short[key] if list(short.values()).count(short[key]) == 1 else key}-"
             + ("${hydra.runtime.choices." + key + "}" if key in groups else "${folder_word:${" + key + "}}")
             for key in sorted(keys)]
    subdir = "_".join([OmegaConf.to_container(configs[0].hydra.sweep, resolve=False)["subdir"], *words])
    for cfg in configs:
        cfg.hydra.sweep.subdir = subdir
    return subdir


def check_folder(folder: Path | None, cfg: DictConfig, job: str, writes: dict[Path, str]) -> None:
    """The folder a job writes: no other job of the command writes it, and it holds no other run's results
    (refused before Hydra writes the folder's .hydra/); `writes`: folder -> the job before that writes it. None (a
    name only the running job knows) is checked as the run opens its folder."""
    if folder is None:
        return
    if folder in writes:
        raise ConfigError(f"{folder}: job {writes[folder]} writes it too; name the sweep's folders by what tells its "
                          f"jobs apart (hydra.sweep.subdir, e.g. with ${{hydra.job.num}})")
    if cfg.resume and holds_results(folder):
        same_run(folder, cfg)
    writes[folder] = job


def check_informational(config_name: str, args: list[str]) -> None:
    """An informational command's boolean values (it prints what it composes: 2 would print as true)."""
    parser, parsed = OverridesParser.create(), []
    for arg in args:                            # a flag's value (--cfg job) is no override
        try:
            parsed += parser.parse_overrides([arg])
        except HydraException:
            pass
    try:
        loose = loose_values(parsed)
        cfg = compose(config_name, [o.input_line for o in parsed if not o.is_sweep_override()]) if loose else None
    except (HydraException, OmegaConfBaseException, ValueError):
        return                                  # Hydra reports it itself
    check_booleans(loose, cfg)
