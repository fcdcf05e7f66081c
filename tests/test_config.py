"""Every shipped config composes; bad input stops in preflight with one clear message."""

import pytest
from hydra import compose, initialize_config_module

from conf.schema import CONF
from harness.errors import ConfigError
from harness.plugins.contracts import build
from harness.running.runner import preflight
from tests.conftest import EXPERIMENTS, sweep_points


def composed(*overrides):
    with initialize_config_module("conf", version_base="1.3"):
        return compose("config", overrides=list(overrides))


@pytest.mark.parametrize("group", ["method", "task", "forgetting", "logger"])
def test_every_plugin_config_instantiates(group):
    for path in sorted((CONF / group).glob("*.yaml")):
        cfg = composed(f"{group}={path.stem}")
        if group == "logger":
            assert callable(build(cfg.logger, "logger", _partial_=True))
        else:
            build(cfg[group], group)


@pytest.mark.parametrize("launcher, target", [("slurm", "SlurmLauncher"), ("local", "LocalLauncher")])
def test_the_launchers_compose_to_submitit(launcher, target):
    with initialize_config_module("conf", version_base="1.3"):
        cfg = compose("config", overrides=[f"hydra/launcher={launcher}"], return_hydra_config=True)
    assert cfg.hydra.launcher._target_ == f"hydra_plugins.memdefrag_launchers.{target}"    # harness/running/slurm.py
    assert cfg.hydra.launcher.gpus_per_node is None            # settled from model.device (and, local, the GPUs seen)
    assert launcher == "slurm" or cfg.hydra.launcher.array_parallelism == 1      # local: one job at a time


def test_every_model_config_composes():
    for path in sorted((CONF / "model").glob("*.yaml")):
        overrides = ["model.source=x"] if path.stem == "hf" else []
        if "${tracer:tracer_layer,none}" in path.read_text():       # no default: a tracer sweep sets it
            overrides += ["model.tracer_layer=1", "model.query_mode=last"]
        cfg = composed(f"model={path.stem}", *overrides)
        assert cfg.model.source and cfg.method.tracer_layer == cfg.model.tracer_layer


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_run_of_every_experiment_passes_preflight(experiment):
    for point in sweep_points(experiment):
        cfg = composed(f"experiment={experiment}", *point)
        if cfg.model.source == "smollm2":
            preflight(cfg)
        else:            # a hub model: offline it must stop with the clear message, before any work
            with pytest.raises(ConfigError, match="cannot be loaded|tracer-sweep"):
                preflight(cfg)


@pytest.mark.parametrize("study", ["runtime", "gpu_memory", "compression_comparison", "memoryllm_comparison",
                                   "mplus_comparison"])
def test_a_studys_runs_are_marked_as_its_own(study):
    """Their tables take only these runs; the other tables leave them out."""
    assert composed(f"experiment={study}").study == study and composed().study is None


def test_memdefrag_labels_name_k():
    assert composed("method=memdefrag_top1").method.label == "memdefrag_top1"
    assert composed("method=memdefrag", "method.k=all").method.label == "memdefrag_topall"


def test_methods_that_never_trace_need_no_tracer_layer(tiny_checkpoint):
    for method in ("vanilla", "none", "text"):
        cfg = composed("model=hf", f"model.source={tiny_checkpoint}", "model.dtype=float32", f"method={method}")
        assert cfg.model.tracer_layer is None
        preflight(cfg)


def test_bad_data_is_refused_before_the_model_loads(tmp_path):
    with pytest.raises(ConfigError, match="task.data_dir=.*nowhere.* has no folder nqa/"):
        preflight(composed("task.dataset=nqa", f"task.data_dir={tmp_path / 'nowhere'}"))
    (tmp_path / "nqa").mkdir()
    (tmp_path / "nqa" / "val_data.json").write_text("[]")
    with pytest.raises(ConfigError, match="val_data.json.*non-empty JSON list"):
        preflight(composed("task.dataset=nqa", f"task.data_dir={tmp_path}"))


@pytest.mark.parametrize("overrides", [["method=vanilla,memdefrag", "method.k=1,2", "task.groups=3", "shard=0/2,1/2"],
                                       ["+foo=1,2", "a.b=x", "a.b=y"], ["method=choice(a,b)", "k=range(1,4)"],
                                       ["x='a=b'", "x=1,2", "y=[1,2]"]])
def test_a_multirun_expands_into_the_jobs_hydras_basic_sweeper_runs(overrides):
    """harness.running.jobs forms the jobs itself (no private Hydra import); they are the sweeper's, in its order."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from harness.running.jobs import expanded

    parser = OverridesParser.create()
    sweeper = [job for batch in BasicSweeper.split_arguments(parser.parse_overrides(overrides), None) for job in batch]
    assert expanded(parser.parse_overrides(overrides)) == sweeper


@pytest.mark.parametrize("given", [["prompt=plain,chat"], ["formation=reference"], ["task.groups=2", "prompt=chat"]])
def test_an_experiments_sweep_with_its_keys_given_again_keeps_the_sweepers_job_order(given, tmp_path):
    """An experiment's sweep parameters come first and the command line after, a key given twice keeping its first
    place (Hydra's basic sweeper): the jobs, so the numbers in their folders' names, are the sweeper's, which the
    check of each job's folder before Hydra writes it relies on."""
    from hydra import initialize_config_module
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from harness.running.jobs import job_overrides

    args = ["experiment=probe", *given, f"hydra.sweep.dir={tmp_path}"]
    with initialize_config_module("conf", version_base="1.3"):
        jobs = job_overrides("config", ["-m", *args]).jobs
    parser = OverridesParser.create()
    sweeper = BasicSweeper.split_arguments(parser.parse_overrides(["prompt=chat,plain",
                                                                   "formation=shared_sink,reference", *args]), None)
    assert jobs == sweeper[0]


@pytest.mark.parametrize("subdir, named", [("${hydra.job.id}", "job_id_for_1"), ("${hydra:job.num}", None),
                                           ("${hydra.job.num}_${method.label}", "1_text")])
def test_a_sweeps_job_folder_is_named_as_hydra_will_or_left_to_the_job(subdir, named, tmp_path):
    """Each job's folder, as the launchers name it (its number and id), for the check of what it holds before
    Hydra writes there; a name only the running job can resolve (Hydra's own ${hydra:...}) is left to the run."""
    from hydra import initialize_config_module

    from harness.results.paths import job_folder
    from harness.running.jobs import check_jobs

    with initialize_config_module("conf", version_base="1.3"):
        cfg = composed_with_hydra(["method=text", f"hydra.sweep.dir={tmp_path}", f"hydra.sweep.subdir={subdir}"])
        assert job_folder(cfg, 1, multirun=True) == (tmp_path / named if named else None)
    check_jobs("config", ["-m", "method=vanilla,text", f"hydra.sweep.dir={tmp_path}", f"hydra.sweep.subdir={subdir}"])


@pytest.mark.parametrize("swept, folders", [
    (["method=vanilla,text"], ["vanilla_unbounded_synthetic", "text_unbounded_synthetic"]),
    (["method=memdefrag", "method.k=1,2"],
     ["memdefrag_top1_unbounded_synthetic", "memdefrag_top2_unbounded_synthetic"]),
    (["method=vanilla", "shard=1/2,0/2", "model=gemma3_270m,smollm2"],
     [f"vanilla_unbounded_synthetic_model-{model}_shard-{shard}"
      for shard in ("1-2", "0-2") for model in ("gemma3_270m", "smollm2")]),
    (["method=memdefrag", "method.query_mode=last,mean", "model.query_mode=last"],
     ["memdefrag_top2_unbounded_synthetic_query_mode-last", "memdefrag_top2_unbounded_synthetic_query_mode-mean"]),
    (["method=none", "decode=null,eager", "resume=true,false"],
     [f"none_unbounded_synthetic_decode-{decode}_resume-{resume}"
      for decode in ("null", "eager") for resume in ("true", "false")]),
    (["method=none", "task.updates=60", f"task.eval_steps=[{','.join(map(str, range(1, 61)))}],[60]"],
     ["none_unbounded_synthetic_eval_steps-1-2-3-4-5-6-7-8-9-10-11-12-13-1-8be302c8",
      "none_unbounded_synthetic_eval_steps-60"]),
    (["method=memdefrag", "method.query_mode=last,mean", "model.query_mode=last,mean"],
     [f"memdefrag_top2_unbounded_synthetic_method.query_mode-{a}_model.query_mode-{b}"
      for a in ("last", "mean") for b in ("last", "mean")]),
])
def test_a_sweeps_folders_are_named_by_what_tells_its_jobs_apart(swept, folders, tmp_path):
    """A sweep's folder name, then `_<key>-<value>` for each setting that tells apart jobs the name alone would put
    in one folder (a config group by its choice, a value as a plain word, a key by its last part unless two share
    it): no job's place in the sweep, so reordering or extending a sweep keeps the names of its runs."""
    from harness.results.paths import job_folder
    from harness.running.jobs import check_jobs, job_overrides

    args = ["-m", *swept, f"hydra.sweep.dir={tmp_path}"]
    told = check_jobs("config", args)
    with initialize_config_module("conf", version_base="1.3"):
        jobs = job_overrides("config", args).jobs
        assert [job_folder(composed_with_hydra([*job, *told]), num, multirun=True).name
                for num, job in enumerate(jobs)] == folders


def earlier_run(folder, *overrides):
    """A folder holding a run of `overrides` (its config and one finished group, as far as a check reads them)."""
    from omegaconf import OmegaConf

    folder.mkdir()
    (folder / "config.yaml").write_text(OmegaConf.to_yaml(composed(*overrides), resolve=True))
    (folder / "groups.jsonl").write_text('{"group": 0, "seconds": 1.0}\n')
    return folder


def test_an_earlier_run_of_a_job_is_taken_over_only_when_no_other_run_writes_it(tmp_path, capsys):
    """A run the sweep's folder holds under the name it had before (`seed` swept since, or numbered) is renamed for
    the job of exactly its settings, under its lock: while another process writes any of them, the command is
    refused in one line and nothing moves; a folder whose config cannot be read is left alone."""
    from harness.results.folder import RunLock
    from harness.running.jobs import check_jobs

    unnamed = earlier_run(tmp_path / "vanilla_unbounded_synthetic", "method=vanilla", "task.groups=3")
    numbered = earlier_run(tmp_path / "1_vanilla_unbounded_synthetic", "method=vanilla", "task.groups=3", "seed=1")
    (tmp_path / "stray").mkdir()
    (tmp_path / "stray" / "config.yaml").write_text("note: ${oops}\n")
    (tmp_path / "stray" / "groups.jsonl").write_text("")
    args = ["-m", "method=vanilla", "task.groups=3", "seed=1,0,2", f"hydra.sweep.dir={tmp_path}"]
    held = RunLock(numbered)
    with pytest.raises(ConfigError, match=f"{numbered} is being written by another run .*; its job "
                                          f"\\(vanilla_unbounded_synthetic_seed-1\\) would resume it"):
        check_jobs("config", args)
    held.release()
    assert sorted(p.name for p in tmp_path.iterdir()) == [numbered.name, "stray", unnamed.name]
    assert check_jobs("config", args) == ["hydra.sweep.subdir='${folder:${method.label}}_${forgetting.label}_"
                                          "${task.dataset}_seed-${folder_word:${seed}}'"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stray", "vanilla_unbounded_synthetic_seed-0",
                                                          "vanilla_unbounded_synthetic_seed-1"]
    assert capsys.readouterr().out.count("renamed so, to resume it there") == 2


def test_an_earlier_run_goes_to_the_job_of_its_settings_and_never_to_a_name_of_fewer(tmp_path):
    """threads changes no answer, and a resume may change it: a sweep over seed takes over the run of threads=2
    for its job of threads=1. A sweep over threads names a run by it: the run of threads=2 goes to the job of
    threads=2, none to threads=1. A run named after more settings than a job (`_seed-0`, a command sweeping seed
    beside) stays where it is: two commands sharing a folder do not rename each other's runs."""
    from harness.running.jobs import check_jobs

    earlier_run(tmp_path / "vanilla_unbounded_synthetic", "method=vanilla", "threads=2")
    check_jobs("config", ["-m", "method=vanilla", "threads=1", "seed=0,1", f"hydra.sweep.dir={tmp_path}"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vanilla_unbounded_synthetic_seed-0"]
    (tmp_path / "vanilla_unbounded_synthetic_seed-0").rename(tmp_path / "vanilla_unbounded_synthetic")
    check_jobs("config", ["-m", "method=vanilla", "threads=1,2", f"hydra.sweep.dir={tmp_path}"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vanilla_unbounded_synthetic_threads-2"]
    check_jobs("config", ["-m", "method=vanilla", "threads=2", f"hydra.sweep.dir={tmp_path}"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vanilla_unbounded_synthetic_threads-2"]


def composed_with_hydra(overrides: list[str]):
    from hydra import compose

    return compose("config", overrides=overrides, return_hydra_config=True)


def test_each_plugin_yaml_extends_its_derived_schema_and_sets_every_option():
    """An option is declared once, in the plugin's constructor; each YAML composes to a node of the schema
    derived from it and gives every option a value, so the two cannot drift apart."""
    import dataclasses

    from omegaconf import OmegaConf

    from conf.schema import plugin_schema

    checked = 0
    for path in sorted(CONF.glob("*/*.yaml")):
        group = path.parent.name
        if group in ("model", "experiment", "launcher"):
            continue
        node = composed(f"{group}={path.stem}")[group]
        _, schema = plugin_schema(group, node._target_)
        assert OmegaConf.get_type(node).__name__ == schema.__name__, path
        assert set(OmegaConf.to_container(node)) == {f.name for f in dataclasses.fields(schema)}, path
        assert "???" not in OmegaConf.to_yaml(node), f"{path} leaves an option without a value"
        written = OmegaConf.load(path)
        if any(str(d).endswith("_schema") for d in written.get("defaults", [])):     # it extends the schema itself
            assert set(written) - {"defaults"} == set(node), f"{path} must give every option its default"
        checked += 1
    assert checked >= 20
