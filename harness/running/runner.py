"""One run: a method plugin on a task plugin with one model. Never branches on which."""

from __future__ import annotations

import json
import logging
import math
import os
import time
import traceback
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from tqdm import tqdm

from harness.measurement.device import device_name, peak_memory_mb, reset_peak_memory
from harness.models import selfcheck
from harness.running import shards
from harness.errors import ConfigError, Interrupted, raised
from harness.running.formed import FormedFragments, Unkept
from harness.models.loading import ModelSpec, check_source, load, one_line_cause
from harness.plugins.contracts import (LABELLED, answer_budget, build, check_first_record, check_groups, check_record,
                                       checked, checked_call, metrics_table, prompt_positions, refused)
from harness.results.folder import ResultFolder, flattened
from harness.results.summary import phase_totals
from methods.attention.decoder import num_layers
from methods.compression.compressor import kept_count
from methods.forgetting import CapacityError, pairing_refusal
from methods.backends.hidden_prefix import HiddenPrefixBackend
from methods.backends.kv_prefix import KVPrefixBackend
from methods.formation import default_formation_batch, formation_header, sink_ids
from methods.generation import default_decode
from methods.prompting import format_prompt
from methods.session import Session
from methods.tokens import token_count
from methods.window import WAYS_OUT, Window, WindowError, check_capacity, trained_window, window_summary

log = logging.getLogger(__name__)
BACKENDS = {"fast": KVPrefixBackend, "hidden_prefix": HiddenPrefixBackend}
Backend = StrEnum("Backend", list(BACKENDS))
_FORMED: dict[tuple, FormedFragments] = {}
FORMED_BYTES = 4 << 30          # host bytes of formed fragments kept: the 8B shape's probe distractors (~3.3 GB)


def formed_fragments(spec: ModelSpec) -> FormedFragments:
    """Recurring fragments already formed with this model in this process: formation is
    deterministic, so the jobs of a sequential sweep (and the groups of a run) form each distractor once.
    Only the current model's are kept (a sweep runs one model's jobs in a row), on the host, FORMED_BYTES at most."""
    key = (spec.source, spec.gguf_file, spec.dtype, spec.device, spec.device_map)
    for other in [k for k in _FORMED if k != key]:
        del _FORMED[other]
    return _FORMED.setdefault(key, FormedFragments(FORMED_BYTES))


def check_given(cfg: DictConfig) -> None:
    """Every setting of the run's is given (a config group, say; a missing value inside one is named where it is
    read)."""
    missing = [key for key in cfg if key != "hydra" and OmegaConf.is_missing(cfg, key)]
    if missing:
        raise ConfigError(f"{', '.join(missing)}: missing, a run needs a value (a command line's ~key takes a "
                          f"config group's away): give it one")
    unlabelled = [group for group in LABELLED if OmegaConf.is_missing(cfg[group], "label")]
    if unlabelled:
        raise ConfigError(f"{unlabelled[0]}.label: missing; the runs of a {unlabelled[0]} are named by its label: "
                          f"give its YAML one (label: my_{unlabelled[0]})")


def preflight(cfg: DictConfig, choices: dict | None = None):
    """Every check that can fail on input, before any model weight is loaded. choices: the option the command
    line chose in each config group (Hydra's), which messages name; a group's label where they are unknown."""

    def named(group: str) -> str:
        return f"{group}={(choices or {}).get(group) or cfg[group].label}"

    try:
        resolved = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as err:         # an interpolation that failed, a value missing (`~task`)
        cause = err
        while cause is not None and not isinstance(cause, ConfigError):
            cause = cause.__cause__ or cause.__context__
        raise (cause or ConfigError(f"{err.full_key}: {str(err).splitlines()[0]}")) from None
    check_given(cfg)
    for key, value in flattened(resolved).items():
        for number in value if isinstance(value, list) else [value]:
            if isinstance(number, float) and not math.isfinite(number):
                raise ConfigError(f"{key}={value}: every number of a run must be finite")
    shard = shards.parse(cfg.shard)
    if cfg.max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens={cfg.max_new_tokens} must be >= 1")
    if cfg.threads is not None and cfg.threads < 1:
        raise ConfigError(f"threads={cfg.threads} must be >= 1, or null for torch's default")
    spec = ModelSpec.of(cfg.model)
    model_config, tokenizer = check_source(spec)
    try:
        format_prompt(tokenizer, "?", cfg.prompt)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    method = build(cfg.method, "method")
    if isinstance(method.backends, str) or not method.backends or not set(method.backends) <= set(Backend):
        raise ConfigError(f"{named('method')}: {type(method).__name__}.backends={method.backends!r} must list some "
                          f"of {[b.value for b in Backend]}, those that can read its memory")
    if cfg.backend not in method.backends:
        raise ConfigError(f"backend={cfg.backend}: {named('method')} reads its memory with "
                          f"backend={' or '.join(method.backends)}")
    selfcheck.refuse_unsupported(BACKENDS[cfg.backend], model_config)
    checked_call("method", f"{type(method).__name__}.check_model", lambda: method.check_model(model_config),
                 cfg.method)
    checked_call("method", f"{type(method).__name__}.check", lambda: method.check(num_layers(model_config)),
                 cfg.method)
    task = build(cfg.task, "task")
    if method.needs_targets and not getattr(task, "marks_targets", False):
        raise ConfigError(f"{named('method')} reads the fragments a task marks as holding the answer, and "
                          f"task {cfg.task._target_.rsplit('.', 1)[-1]} marks none: use a task that does "
                          f"(retention, distortion, longbench)")
    checked_call("task", f"{type(task).__name__}.check", task.check, cfg.task)
    checked_call("task", f"{type(task).__name__}.check_model", lambda: task.check_model(model_config, tokenizer),
                 cfg.task)
    positions, budget = trained_window(model_config), answer_budget(task, cfg.max_new_tokens)
    if positions is not None and budget >= positions:
        asked = f"max_new_tokens={budget}" if budget == cfg.max_new_tokens else \
            f"the answer budget {budget} task {cfg.task._target_.rsplit('.', 1)[-1]} asks with"
        raise ConfigError(f"{asked} must be smaller than the model's {positions} positions (model {spec.name}), "
                          f"which also hold the memory and the prompt")
    forgetting = build(cfg.forgetting, "forgetting")
    unpaired = pairing_refusal(method, forgetting, named("method"), named("forgetting"))
    if unpaired:
        raise ConfigError(unpaired)
    compressor = build(cfg.compression, "compression")
    checked_call("compression", f"{type(compressor).__name__}.check", compressor.check, cfg.compression)
    with refused("task", f"{type(task).__name__}.groups"):
        found = checked(task.groups(tokenizer), task, "task", "groups")
    check_groups(found)
    with refused("task", f"{type(task).__name__}.describe"):
        described = checked(task.describe(), task, "task", "describe")     # what groups() found, for run.json
    try:
        json.dumps(described)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"task {type(task).__name__}.describe returned what run.json cannot hold ({err}): a dict "
                          f"of plain values") from None
    groups = shards.select(found, shard)
    rate = getattr(compressor, "rate", 1.0)
    tokens = {text: kept_count(token_count(tokenizer, text), rate) for group in groups for text in group.texts()}
    longest = max(tokens.values(), default=0)
    if forgetting.capacity is not None and longest > forgetting.capacity:
        raise ConfigError(f"forgetting.capacity={forgetting.capacity} is smaller than a fragment of this task "
                          f"({longest} tokens): raise model.memory_capacity or lower task.max_context_tokens")
    most = max(((sum(tokens[t] for t in g.texts()), len(g.texts()), g.index) for g in groups), default=None)
    stored = (most[0], f"task {type(task).__name__}: group {most[2]} stores {most[1]} fragments") \
        if most and getattr(method, "reads_memory", True) else None
    header = formation_header(tokenizer, cfg.formation, cfg.prompt)     # the memory's sink holds it (shared_prefix)
    try:
        check_capacity(model_config, forgetting.capacity, len(sink_ids(tokenizer, header)),
                       prompt_positions(task, tokenizer, cfg.prompt, header), budget,
                       cfg.allow_beyond_window, spec.name, stored, longest)
    except WindowError as err:
        raise ConfigError(str(err)) from None
    return spec, method, task, forgetting, compressor, groups


def ready(spec, backend_name: str):
    """(model, tokenizer, backend, self-check verdict). Whatever fails while the model loads or the backend is
    checked on it (a layer list it cannot find, a rotary function it cannot read, a row it cannot record) ends
    the run with one line naming model.source, its type, the step and the cause; MEMDEFRAG_DEBUG=1 shows the
    traceback instead."""
    model, step = None, "loading it"
    try:
        model, tokenizer = load(spec)
        step = f"checking backend={backend_name} on it"
        backend = BACKENDS[backend_name](model)
        return model, tokenizer, backend, selfcheck.verify(backend, tokenizer, spec)
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 - any model's failure here is the user's model, said in one line
        if os.environ.get("MEMDEFRAG_DEBUG"):
            raise
        kind = getattr(getattr(model, "config", None), "model_type", None) or declared_type(spec)
        raise ConfigError(f"model.source={spec.source!r} (model type {kind!r}) failed while {step}: "
                          f"{type(err).__name__}: {one_line_cause(err)}; this harness cannot run it"
                          + ("" if model is None else f" with backend={backend_name}")) from None


def declared_type(spec) -> str:
    """The model type the source's config declares (what a failed load still tells), or 'unknown'."""
    try:
        return check_source(spec)[0].model_type
    except Exception:  # noqa: BLE001 - only names the type in a message about another failure
        return "unknown"


def compression_summary(compressor, logs: list[dict]) -> dict:
    """The compressor, and over every fragment this invocation stored: tokens before and after, the
    share kept, the seconds it took."""
    tokens, kept = sum(log["tokens"] for log in logs), sum(log["kept"] for log in logs)
    return {**compressor.describe(), "fragments": len(logs), "tokens": tokens, "kept": kept,
            "kept_share": kept / tokens if tokens else None, "seconds": sum(log["seconds"] for log in logs),
            "per_fragment": logs}


TRACEBACK = "traceback.txt"          # a run folder's: what a run that stopped on a plugin's error raised


def _run_groups(cfg, folder: ResultFolder, logger, spec, method, task, forgetting, compressor, groups,
                run_dir: str):
    """Answer every group the folder does not hold yet, each logged as it ends; write the metrics and run.json.
    Returns (metrics, records, info)."""
    model, tokenizer, backend, verdict = ready(spec, cfg.backend)
    reset_peak_memory(model.device)     # after the self-check, whose fp32 weights are a load transient (docs/gpu.md)
    label = cfg.method.label
    formed = formed_fragments(spec) if cfg.reuse_formed else Unkept()    # a timed study: each group forms its own
    compressed: list[dict] = []
    window = Window(trained_window(model.config), cfg.allow_beyond_window, spec.name, WAYS_OUT)
    if folder.done:
        log.info("resuming %s: %d of %d groups already finished", run_dir, len(folder.done), len(groups))
    folder.timing = {"threads": torch.get_num_threads(),                          # ResultFolder.TIMING, in effect
                     "device_name": device_name(model.device)}
    if folder.done and (retimed := folder.retimed(folder.timing)):
        log.warning("%s: resumed under other timing settings than its finished groups ran under (%s): its seconds "
                    "per group mix them (run.json: seconds.retimed)", run_dir,
                    ", ".join(f"{key} {' then '.join(map(str, values))}" for key, values in retimed.items()))
    if folder.rerun:
        log.warning("%s: groups %s had damaged, missing or doubled records on disk: they run again", run_dir,
                    folder.rerun)
    read_one = False
    for group in tqdm([g for g in groups if g.index not in folder.done], desc=f"{label} groups", unit="group",
                      initial=len(folder.done), total=len(groups)):
        start, answered = time.perf_counter(), []
        with kept_on_failure(run_dir, f"group {group.index}"), window.watching(model):
            session = Session(model, tokenizer, backend, method.for_group(group.index), cfg.formation, cfg.prompt,
                              cfg.max_new_tokens, reuse=formed, forgetting=forgetting.for_group(group.index),
                              compressor=compressor, memory_on=cfg.memory_on, window=window, decode=cfg.decode,
                              formation_batch=cfg.formation_batch)
            session.expect(group.texts())
            for record in task.run_group(session, group):
                check_record(record, group.index)
                record.update(method=label, forgetting=cfg.forgetting.label, beyond_window=window.take())
                if not read_one:            # the run's first record, at once: can the task's metrics read it?
                    read_one = check_first_record(task, record)
                folder.add(record)
                answered.append(record)
        folder.end_group(group.index, time.perf_counter() - start)
        with kept_on_failure(run_dir, f"logging group {group.index} (its metrics, the logger)"):
            logger.log_group(answered, lambda: metrics_table(task, folder.records, label), len(folder.done))
        compressed += [{"group": group.index, **log} for log in session.compressed]
    with kept_on_failure(run_dir, "the run's metrics and run.json"):
        records, group_seconds = folder.records, list(folder.done.values())
        metrics = metrics_table(task, records, label)
        info = {"method": label, "forgetting": cfg.forgetting.label, "capacity": forgetting.capacity,
                "model": spec.name, "dtype": spec.dtype, "device": str(model.device), "self_check": verdict,
                "backend": cfg.backend, "decode": cfg.decode or default_decode(model.device),
                "formation_batch": cfg.formation_batch or default_formation_batch(model.device),
                "reuse_formed": cfg.reuse_formed, **folder.timing,
                "device_name": folder.devices(folder.timing["device_name"]),    # every one its groups ran on
                "compression": compression_summary(compressor, compressed), "task": task.describe(),
                "formation": cfg.formation, "prompt": cfg.prompt, "groups": len(groups),
                "window": window_summary(window.limit, cfg.allow_beyond_window, records),
                "seconds": {"total": sum(group_seconds), "per_group": sum(group_seconds) / len(groups),
                            "phases": phase_totals(records), **({"retimed": retimed} if (retimed := folder.retimed())
                                                                else {})},
                "peak_memory": peak_memory_mb(model.device)}
        folder.finish(metrics, info)
    (Path(run_dir) / TRACEBACK).unlink(missing_ok=True)          # an earlier attempt's, now resumed and finished
    return metrics, records, info


@contextmanager
def kept_on_failure(run_dir: str, where: str):
    """Whatever a plugin (or the harness) raises while a run answers and scores, as one line saying where it
    failed and that the finished groups are kept (a rerun resumes); the traceback goes to the run folder's
    traceback.txt (MEMDEFRAG_DEBUG=1 raises it as it is)."""
    try:
        yield
    except ConfigError:
        raise
    except (CapacityError, WindowError) as err:
        raise ConfigError(f"{where}: {err} (finished groups are kept in {run_dir})") from None
    except Exception as err:  # noqa: BLE001 - a plugin may fail any way; one line, its traceback kept
        if os.environ.get("MEMDEFRAG_DEBUG"):
            raise
        trace = Path(run_dir) / TRACEBACK
        try:
            trace.write_text(traceback.format_exc())
            kept = f"the traceback is in {trace}"
        except OSError as unwritten:
            kept = f"the traceback could not be written ({unwritten.strerror})"
        raise ConfigError(f"{where}: {raised(err)} (finished groups are kept in {run_dir}; {kept}, MEMDEFRAG_DEBUG=1 "
                          f"raises it)") from None


def run(cfg: DictConfig, run_dir: str, sweep_dir: str | None = None):
    """Run the task with the method; returns the task's metrics table. sweep_dir: the multirun's folder."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    choices = dict(HydraConfig.get().runtime.choices) if HydraConfig.initialized() else None
    spec, method, task, forgetting, compressor, groups = preflight(cfg, choices)
    label = cfg.method.label
    tags = [f"method:{label}", f"task:{cfg.task._target_.rsplit('.', 1)[-1]}", f"dataset:{cfg.task.dataset}",
            f"model:{spec.name}", f"forgetting:{cfg.forgetting.label}"]
    with ResultFolder(run_dir, cfg, resume=cfg.resume) as folder:
        if folder.complete([group.index for group in groups]):
            log.info("%s: the run finished every one of its %d groups before; nothing to run, its files left as they "
                     "are (pass resume=false to run it again)", run_dir, len(groups))
            metrics = metrics_table(task, folder.records, label)
        else:
            logger = instantiate(cfg.logger, _partial_=True)(
                run_dir=run_dir, run_config=OmegaConf.to_container(cfg, resolve=True),
                default_group=Path(sweep_dir).name if sweep_dir else None, default_tags=tags)
            logger.start()
            try:
                metrics, records, info = _run_groups(cfg, folder, logger, spec, method, task, forgetting, compressor,
                                                     groups, run_dir)
            except KeyboardInterrupt:
                raise Interrupted(f"{len(folder.done)} of {len(groups)} groups finished, kept in {run_dir}; the same "
                                  f"command given that folder (hydra.run.dir, or a sweep's hydra.sweep.dir) resumes "
                                  f"it") from None
            logger.finish(metrics, records, info)
    print(f"\n{label} on {cfg.task.dataset} ({len(groups)} groups, model {spec.name}, backend {cfg.backend}, "
          f"prompt {cfg.prompt}, formation {cfg.formation})")
    print(metrics.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"results: {run_dir}")
    return metrics
