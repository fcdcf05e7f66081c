"""`memdefrag report RESULTS_DIR`: the paper's tables (Markdown and LaTeX) and figures from whatever
result folders lie below RESULTS_DIR, and RESULTS_DIR/README.md that shows them.

The README is one generated section per table, in the paper's order, each with its command, its figure and a
short note; it links RESULTS_DIR/notes.md where there is one (written by people: setup, what the numbers mean).
A table without results says so; a task's own tables (its class's `tables`) are found without an edit here.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pandas as pd

from evals.distortion import correlations
from evals.locomo import layers_table, locomo_table, scores_by_category
from evals.locomo_scoring import Category
from evals.longbench import longbench_table
from evals.probe import band, tracing_table
from harness.report.analysis import write_analysis
from harness.report.claims import FEWEST, keyed, paired_groups, refuse_undrawn, supported
from harness.report.comparisons import peers_section, rankers_section
from evals.stats import wilson, with_interval
from harness.errors import OneLineParser
from harness.plugins.contracts import config_name, table_titles
from harness.results.figures import accuracy_against_time, accuracy_curves
from conf.schema import CONF
from harness.report.migrate import migrate_all, print_migrations
from harness.report.sections import (BASELINE_STUDIES, DEFAULT_MODEL, RELEASED, SHARED_DISTRACTORS, Run, Section,
                                     bench_table, file_part, in_percent, labelled, named, past_window,
                                     refuse_repeated_groups, rows_and_caption, run_columns, runs_under, settings_apart,
                                     step_records, step_table, with_bounds)
from harness.models.tracer_layers import recorded, swept, tracers_file
from harness.results.summary import accuracy_table, complete_groups
from methods.window import BEYOND_CELL, BEYOND_MARK


def per_model(models: set[str], make) -> list[Section]:
    """make(model) for each model, the default model's table first (drawn even without runs: it says what makes
    them), each other model's after it."""
    return [make(model) for model in sorted(models | {DEFAULT_MODEL}, key=lambda m: (m != DEFAULT_MODEL, m))]


def of_model(label: str, model: str, runs: list[Run]) -> tuple[str, str, str]:
    """A table's label, the words its title names the model in, and the command that makes its runs, for `model`:
    the default model's as they are, another model's with `_<model>`, ` on <model>` and its choice (`model=<model>`
    where conf/model/ has it, else the source one of its runs read: `model=hf model.source=... model.name=...`)."""
    command = COMMANDS[label]
    if model == DEFAULT_MODEL:
        return label, "", command
    shipped = (CONF / "model" / f"{model}.yaml").is_file()
    source = next((r.config["model"].get("source") for r in runs if r.model == model), None)
    choice = f"model={model}" if shipped or source is None else \
        f"model=hf {override('model.source', source)} {override('model.name', model)}"
    return f"{label}_{file_part(model)}", f" on {model}", "; ".join(f"{c} {choice}" for c in command.split("; "))


def override(key: str, value: str) -> str:
    """`key=value` as a shell and Hydra take it: a value holding more than a path's characters (a space, a comma,
    which Hydra reads as a sweep) quoted for Hydra, the whole quoted for the shell."""
    if re.fullmatch(r"[A-Za-z0-9_./@:+-]+", value):
        return f"{key}={value}"
    # Hydra reads a backslash as an escape only before a quote or at the string's end: those are doubled
    escaped = re.sub(r'(\\*)("|$)', lambda m: 2 * m.group(1) + ("\\" if m.group(2) else "") + m.group(2), value)
    return shlex.quote(f'{key}="{escaped}"')


def retention_run(run: Run, bounded: bool) -> bool:
    """A run of tab:retention (unbounded memory) or of tab:retention_comparison (with forgetting), of any model
    (a study's runs make tables of their own)."""
    kind = "tab:retention_comparison" if bounded else "tab:retention"
    return kind in run.tables and run.bounded == bounded and not run.study


def retention_section(root, runs, bounded: bool, figures, model: str) -> Section:
    """One model's tab:retention (unbounded memory) or tab:retention_comparison (with forgetting; the released
    MemoryLLM and M+ checkpoints join the default model's), with its claims (claims.yaml's `retention` or
    `retention_comparison`)."""
    table = "retention_comparison" if bounded else "retention"
    label, on, command = of_model(f"tab:{table}", model, runs)
    title = (f"Knowledge retention with forgetting{on}, accuracy (%) at steps 10..50" if bounded
             else f"Knowledge retention{on}, accuracy (%) per update step (unbounded memory)")
    chosen = [r for r in runs if (retention_run(r, bounded) and r.model == model)
              or (bounded and r.baseline and model == DEFAULT_MODEL and f"tab:{table}" in r.tables)]
    if not chosen:
        return Section(label, title, missing=f"no runs yet: {command}", command=command)
    records = step_records(sorted(chosen, key=baselines_first), label)
    figure = figures / f"{label.split(':')[1]}.png"
    accuracy_curves(accuracy_table(records), figure)
    claims = supported(root / "claims.yaml", table, keyed(table, (
        (row, frame) for row, frame in complete_groups(records).groupby(["model", "dataset", "run"]))), model)
    return Section(label, title, step_table(records), figure=str(figure.relative_to(root)),
                   after=INTERVALS + (f" {capacities(chosen)}" if bounded else "") + claims, command=command)


def compression_section(root, runs, figures) -> tuple[Section, Section]:
    """`tab:compression_comparison`: accuracy per step and the target's mean rank, a column per compressor
    and kept-token ratio (100 % = uncompressed), from that experiment's runs."""
    accuracy = Section("tab:compression_comparison", "Compression before formation: accuracy (%) per step, "
                       "a column per compressor@kept-token ratio")
    rank = Section("tab:compression_rank", "Compression before formation: mean density rank of the target")
    chosen = [r for r in runs if r.study == "compression_comparison"]
    if not chosen:
        accuracy.missing = rank.missing = "no runs yet: memdefrag experiment=compression_comparison"
        return accuracy, rank
    records = step_records(chosen, accuracy.label)
    records["run"], shared = compressor_columns(records["run"])
    accuracy.table = step_table(records)
    figure = figures / "compression_comparison.png"
    accuracy_curves(accuracy_table(records), figure)
    accuracy.figure = str(figure.relative_to(root))
    rank.table = step_table(records, value="target_rank")
    runs_are = f" Every run: {shared}. 1 = every token kept (no compression). {capacities(chosen)}"
    accuracy.after, rank.after = INTERVALS + runs_are, MEANS + runs_are
    return accuracy, rank


def capacities(runs: list[Run]) -> str:
    """Each data set's N_max (model.memory_capacity) among `runs`, in one sentence."""
    per_set: dict[str, set] = {}
    for run in runs:
        per_set.setdefault(run.config["task"]["dataset"], set()).add(run.config["model"].get("memory_capacity"))
    return "; ".join(f"{dataset}: N_max {'/'.join(str(c or 'unbounded') for c in sorted(caps, key=str))}"
                     for dataset, caps in sorted(per_set.items())) + "."


def compressor_columns(labels: pd.Series) -> tuple[pd.Series, str]:
    """Run labels `method+forgetting+compressor@rate [setting=...]` cut to `compressor@rate` where the
    rest is the same for every run (the dataset's own settings, e.g. its N_max, aside), and that rest."""
    heads = labels.str.split(" ").str[0]
    short = heads.str.rsplit("+", n=1).str[-1]
    shared = set(heads.str.rsplit("+", n=1).str[0])
    if len(shared) > 1:
        return labels, "see the column names"
    return short, shared.pop()


def memoryllm_sections(root, runs, figures) -> list[Section]:
    """`tab:defrag_memoryllm_mplus`: accuracy per step with and without defragmentation, the released checkpoints
    in one table; another checkpoint (a tiny random one) gets a section of its own, labelled plumbing."""
    chosen = [r for r in runs if r.study in BASELINE_STUDIES]
    released = [r for r in chosen if r.config["model"]["source"] in RELEASED]
    title = "MemoryLLM and M+ with and without defragmentation, accuracy (%)"
    sections = [] if released else [Section("tab:defrag_memoryllm_mplus", title, missing="no runs yet: memdefrag "
                                            "experiment=memoryllm_comparison and experiment=mplus_comparison "
                                            "(the released checkpoints, a GPU)")]
    groups = ([("", ", ".join(sorted({RELEASED[r.config['model']['source']] for r in released})), released)]
              if released else [])
    for source in sorted({r.config["model"]["source"] for r in chosen} - set(RELEASED)):
        mine = [r for r in chosen if r.config["model"]["source"] == source]
        groups.append(("_" + file_part(mine[0].model), mine[0].model, mine))
    for suffix, name, mine in groups:
        section = Section(f"tab:defrag_memoryllm_mplus{suffix}", f"{name} with and without defragmentation "
                          "(layer, query mode: " + ", ".join(sorted({f"{r.config['method']['tracer_layer']} "
                                                                    f"{r.config['method']['query_mode']}"
                                                                    for r in mine})) + "), accuracy (%)")
        records = step_records(mine, section.label)
        section.table = step_table(records)
        figure = figures / f"{section.label.split(':')[1]}.png"
        accuracy_curves(accuracy_table(records), figure)
        section.figure, section.after = str(figure.relative_to(root)), INTERVALS
        if suffix:
            source = mine[0].config["model"]["source"]
            section.after += (f" **Plumbing only**: `{source}` is not a released checkpoint (random weights); these "
                             "runs show that the pipeline works end to end, not how well the model remembers.")
        sections.append(section)
    return sections


def bounded_step_section(runs, kind: str, title: str, value: str, model: str) -> Section:
    """One model's per-step table of its forgetting runs: mean `value` per question ('seconds': the update's
    formation and forgetting plus the question's phases); `title` names the model where it says {on}."""
    label, on, command = of_model(kind, model, runs)
    title = title.format(on=on)
    chosen = [r for r in runs if kind in r.tables and r.bounded and not r.study and r.model == model]
    if not chosen:
        return Section(label, title, missing=f"no runs yet: {command}", command=command)
    records = step_records(chosen, label)
    after = MEANS
    if value == "seconds":
        records["seconds"] = records["seconds"].map(lambda phases: sum(phases.values()))
        after += " " + timed_at(chosen, run_columns(chosen, label))
    return Section(label, title, step_table(records, value=value), after=after, command=command)


def timed_at(runs: list[Run], labels: list[str]) -> str:
    """Under what the columns' seconds were measured (run.json: the commit, threads, the device; the run's
    reuse_formed): what all share once, what differs per column, and a warning where anything does (a difference
    between two columns may then be the code's or the machine's) or where a formation may have been served."""
    fields = {"commit": lambda r: r.info["git"][:8] if r.info.get("git") else None,
              "threads": lambda r: r.info.get("threads"), "device": lambda r: r.device,
              "reuse_formed": lambda r: r.config.get("reuse_formed")}
    shared, differing = settings_apart(runs, labels, fields)
    text = "Timed with " + ", ".join(shared) + "".join(
        f". {name}: " + "; ".join(f"{label} {'/'.join(seen)}" for label, seen in per_column.items())
        for name, per_column in differing.items()) + "."
    if differing:
        text += " The columns were not timed alike: a difference between two may be the code's or the machine's."
    if any(run.config.get("reuse_formed") for run in runs):
        text += (" reuse_formed True: a run after another in its process was served the distractors that one formed, "
                 "its formation left out.")
    return text


def probe_section(root, runs) -> Section:
    label, title = "tab:retrieval_layers", "Tracing per layer: mean rank of the target, Top-k tracing accuracy (%)"
    chosen = [r for r in runs if label in r.tables]
    if not chosen:
        return Section(label, title, missing="no runs yet: memdefrag experiment=probe")
    frames, legend = [], []
    for run in (r for r in chosen if r.records):
        records = run.records
        table = with_bounds(tracing_table(records).groupby("query_mode").head(5))
        layers = records[0]["layers"]
        if layers == list(range(len(layers))):          # every layer probed: the paper's band is known
            table["in_band"] = table["layer"].isin(band(len(layers))).map({True: "yes", False: "no"})
        elif run.config["task"].get("layers") == "band":    # only the band probed
            table["in_band"] = "yes"
        folder = str(run.folder.relative_to(root))
        table.insert(0, "run", named(run, folder))      # the folder names a run in a few words; the legend says it
        frames.append(table)
        memory = "text" if run.config["method"]["label"] == "text" else "latent memory"
        [full] = write_analysis(run.folder, records)
        legend.append(f"[{folder}]({full.relative_to(root)}): {run.config['model']['name']}, {memory}, "
                      f"{run.config['prompt']} prompt, {run.config['formation']}, {placements(records)}")
    return Section(label, title, pd.concat(frames, ignore_index=True).round(2),
                   after="Mean rank with its 95 % bootstrap interval over groups, Top-k with its Wilson interval over "
                         "the effective number of probes (a group's probes share its target and memory). Every group "
                         "stores the same distractors in the same order, its target moved through the positions: an "
                         "interval covers the targets drawn, for that one set of distractors. "
                         "`in_band`: the layer lies in floor(L/3)..ceil(L/2), where the paper (App. F) looks for the "
                         "tracer layer (blank where a run probed a list of layers, which does not give L). The runs, "
                         "each with its every layer, best first:\n\n"
                         + "\n".join(f"- {line}" for line in legend))


def placements(records: list[dict]) -> str:
    """Where a probe run put the target: the paper's probe puts it at every position of every group."""
    groups, positions = len({r["group"] for r in records}), sorted({r["position"] for r in records})
    if positions == list(range(1, records[0]["fragments"] + 1)):
        return f"{groups} groups, target at all {len(positions)} positions"
    one_each = ", one per group" if len(records) == groups and len(positions) > 1 else ""
    return f"{groups} groups, target at positions {'/'.join(map(str, positions))}{one_each}"


def distortion_section(root, runs) -> Section:
    """Per run (latent or text memory): accuracy per step, the best-correlated layers, and the
    figures of harness.report.analysis, written beside the run's files."""
    label, title = "fig:distortion", "Positional distortion: accuracy and target density over updates, and their correlation"
    chosen = [r for r in runs if label in r.tables]
    if not chosen:
        return Section(label, title, missing="no runs yet: memdefrag experiment=distortion")
    parts = []
    for run in chosen:
        records = run.records
        figures = [p for p in write_analysis(run.folder, records) if p.suffix == ".png"]
        frame = pd.DataFrame(records)
        steps = frame.groupby("step").agg(correct=("correct", "sum"), n=("correct", "size"),
                                          memory_tokens=("memory_tokens", "mean"))
        steps.insert(0, "accuracy", [with_interval(k / n, *wilson(int(k), int(n))) for k, n in
                                     zip(steps["correct"], steps["n"])])
        steps = steps.drop(columns=["correct", "n"])
        best = with_bounds(correlations(records).groupby("query_mode").head(3), digits=3)
        levels, correct = frame.groupby("step")["correct"].mean().nunique(), int(frame["correct"].sum())
        floor = ([f"Accuracy takes only {levels} value{'s' * (levels != 1)} over the steps ({correct} correct "
                  f"answer{'s' * (correct != 1)} in all): an r here says little."] if levels <= 2 else [])
        parts += ["### " + named(run, f"{run.config['task']['dataset']}, {run.config['method']['label']} memory "
                                       f"({frame.group.nunique()} groups, `{run.folder.relative_to(root)}`)"),
                  steps.T.astype(object).to_markdown(), best.to_markdown(index=False), *floor,
                  *(f"![{p.stem}]({p.relative_to(root)})" for p in figures)]
    parts.append("Accuracy with its 95 % Wilson interval over the groups; Pearson r with its 95 % Fisher interval "
                 "over the steps (`steps`), which takes them as independent though every step asks the same groups "
                 "again, so it is narrower than it should be; `accuracy_levels`: how many distinct accuracies the "
                 "steps take.")
    return Section(label, title, text="\n\n".join(parts))



def study_table(runs, study: str, value, per_group: bool) -> tuple[pd.DataFrame, str, list[str]] | None:
    """Datasets as rows, methods as columns (baselines first, then by method): value(run) of the runs of one
    experiment (`study`) and of the released MemoryLLM baselines, the runs of one cell (shards of a run) pooled:
    a mean over their groups where the value is per group, else the highest; a caption naming the timing settings
    every row shares, and a line per row naming those in which the rows differ. None without such runs."""
    if not any(r.study == study and r.info for r in runs):
        return None
    chosen, labels = study_runs(runs, study)
    frame = pd.DataFrame([{"dataset": f"{named(r, r.config['task']['dataset'])} ({r.info.get('model')}, "
                                      f"{r.device})", "method": label, "value": value(r),
                           "groups": r.info.get("groups") or 1}
                          for r, label in zip(chosen, labels)])        # a CPU's and a GPU's runs on rows of their own
    frame["groups"] = frame["groups"].where(frame["value"].notna())
    cells = frame.assign(weighted=frame["value"] * frame["groups"]).groupby(["dataset", "method"])
    pooled = cells["weighted"].sum(min_count=1) / cells["groups"].sum() if per_group else cells["value"].max()
    table = pooled.unstack("method")
    order = {label: (*baselines_first(r), label) for r, label in zip(chosen, labels)}
    table = table[sorted(order, key=order.get)]          # the same columns whichever folder a run lies in
    table.columns.name = None
    def setting(key: str):
        if key == "N_max":
            return lambda run: run.config["model"].get("memory_capacity") or "unbounded"
        return lambda run: run.info.get(key, BEFORE_THE_SETTING.get(key))

    keys = ("dtype", "threads", "groups", "N_max", "decode", "formation_batch", "reuse_formed")
    shared, differing = settings_apart(chosen, list(frame["dataset"]), {key: setting(key) for key in keys})
    per_row = [f"{name}: " + ", ".join(f"{key} {'/'.join(sorted(values[name]))}" for key, values in differing.items())
               for name in table.index] if differing else []
    mixed = [label for r, label in zip(chosen, labels) if r.info.get("seconds", {}).get("retimed")]
    return table, "; ".join(shared + ([f"{', '.join(mixed)} resumed under other timing settings, its seconds mixing "
                                       f"both (run.json: seconds.retimed)"] if mixed else [])), per_row


def study_runs(runs, study: str) -> tuple[list[Run], list[str]]:
    """The runs of one experiment (`study`) and the released MemoryLLM baselines, and each one's column."""
    chosen = [r for r in runs if (r.study == study or r.baseline) and r.info]
    return chosen, run_columns(chosen, f"tab:{study}", per_device=True)      # a row per device: one run on each


BEFORE_THE_SETTING = {"formation_batch": "solo"}     # what a run made before a caption's setting existed did


def runtime_section(runs) -> tuple[Section, Section]:
    """`tab:runtime` (seconds per group) and `tab:gpu-memory` (peak memory) from their experiments' runs only."""
    runtime = Section("tab:runtime", "Time per group (s)")
    memory = Section("tab:gpu-memory", "Peak memory (decimal GB, as the paper's)")
    seconds = study_table(runs, "runtime", lambda r: r.info.get("seconds", {}).get("per_group"), per_group=True)
    peaks = study_table(runs, "gpu_memory", lambda r: peak_gb(r.info.get("peak_memory", {})), per_group=False)
    for section, found, study in ((runtime, seconds, "runtime"), (memory, peaks, "gpu_memory")):
        if found is None:
            section.missing = f"no runs yet: memdefrag experiment={study}"
            continue
        section.table, caption, per_row = found[0].round(2), found[1], found[2]
        section.title += f"; {caption}" if caption else ""
        section.after = ("Each row's settings where the rows differ: " + "; ".join(per_row) + ". ") if per_row else ""
    if seconds is not None:
        runtime.after += ("reuse_formed False (the caption): every group formed, and was charged, every fragment it "
                         "read, whatever ran before it in the process; True: fragments formed earlier in the process "
                         "were served again, their formation left out. formation_batch solo: each fragment formed "
                         "in a forward of its own; batched: a group's fragments formed together, padded "
                         "(docs/gpu.md). The paper's (Llama-3.1-8B-Instruct, a GPU): NaturalQA vanilla 59.30, "
                         "MemoryLLM 64.19, M+ 87.24, Top-1 75.07, Top-2 76.49, Top-all 103.67; SQuAD vanilla 60.11, "
                         "Top-1 79.23, Top-2 81.01, Top-all 107.95." + first_groups(runs))
    if peaks is not None:
        memory.after += ("`none` reads no memory and keeps no latent memory: its peak is the weights and the "
                         "largest forward it ran (a question's, or a stored fragment's, which informativeness "
                         "forgetting runs to score its tokens), not the paper's 'weights and memory', which holds the "
                         "memory too. "
                         "The paper's (Llama-3.1-8B-Instruct, NaturalQA, step 50, N_max 12,800): weights and memory "
                        "18.11, vanilla 23.03, Top-2 19.73. "
                        "On a GPU the CUDA allocator's peak of each run; on a CPU the process's peak RSS, which "
                        "covers every job a process ran before (run a sweep with hydra/launcher=local for one "
                        "process per job)." + peak_phases(runs))
    return runtime, memory


SLOW_FIRST = 1.5        # a run's first group this many times its later groups' mean is named beside the table


def first_groups(runs) -> str:
    """The tab:runtime runs whose first group took more than SLOW_FIRST times their later groups' mean, with both
    figures: the cell's mean holds the process's one-time costs (CUDA's set-up, a compiled decoding step's
    compile), which the later groups do not pay. Empty where no run's first group stands out."""
    slow = []
    for run, label in zip(*study_runs(runs, "runtime")):
        seconds = [s for _, s in sorted(run.finished.seconds.items()) if s is not None]
        later = sum(seconds[1:]) / (len(seconds) - 1) if len(seconds) > 1 else None
        if later is not None and seconds[0] > SLOW_FIRST * later:
            slow.append(f"{run.info.get('model')}, {run.config['task']['dataset']} ({run.device}), {label}: "
                        f"{seconds[0]:.2f} s, then {later:.2f} s a group over {len(seconds) - 1}")
    return "" if not slow else (" A run's first group holds its process's one-time costs (CUDA's set-up, a compiled "
                                "decoding step's compile), which its later groups do not pay; first groups that "
                                f"took more than {SLOW_FIRST} times the later ones: " + "; ".join(slow) + ".")


def peak_phases(runs) -> str:
    """Where each tab:gpu-memory run whose records name the phases that raised the CUDA allocator's peak
    (methods/phase_peaks.py) reached it: the phase that raised it highest, from what was allocated as it began;
    or outside the timed phases, where the job's peak is above theirs. Empty where no run recorded them (a CPU's,
    or one older than the records' field)."""
    where = []
    for run, label in zip(*study_runs(runs, "gpu_memory")):
        rises = [(rise["peak"], rise["start"], phase, f"step {r['step']}" if "step" in r else f"group {r['group']}")
                 for r in run.records for phase, rise in r.get("peak_mb", {}).items()]
        if not rises:
            continue
        peak, start, phase, question = max(rises)
        at = f"{phase} at {question}, {in_gb(peak):.2f} GB (from {in_gb(start):.2f} GB allocated as it began)"
        job = run.info.get("peak_memory", {}).get("cuda_mb", peak)
        if job > peak + 1:
            at = f"outside the timed phases, {in_gb(job):.2f} GB (the highest of them: {at})"
        elif job < peak - 1:
            at += f", in an earlier process of this resumed run (its last process's peak: {in_gb(job):.2f} GB)"
        where.append(f"{run.info.get('model')}, {run.config['task']['dataset']}, {label}: {at}")
    return "" if not where else (" Where each GPU run reached its peak (the timed phase that raised the allocator's "
                                 "peak highest; a store's phases count toward the next question): "
                                 + "; ".join(where) + ".")


def peak_gb(peak: dict) -> float | None:
    """The CUDA allocator's peak where a GPU was used, else the process's peak RSS (both recorded in MiB), in GB
    (10^9 bytes, the paper's unit)."""
    value = peak.get("cuda_mb", peak.get("cpu_rss_mb"))
    return None if value is None else in_gb(value)


def in_gb(mib: float) -> float:
    """MiB, as runs record memory, in GB (10^9 bytes), as the paper's tables give it."""
    return mib * 2**20 / 1e9


INTERVALS = ("Each accuracy with its 95 % Wilson interval over the questions at that step, in brackets; a blank "
             "cell: that run did not ask at that step (its task.eval_steps). " + SHARED_DISTRACTORS)
MEANS = "Each mean with its 95 % bootstrap interval over the groups, in brackets. " + SHARED_DISTRACTORS
BASELINES = ("none", "text", "vanilla")       # the rows a table of methods starts with, in this order


def baselines_first(run: Run) -> tuple[int, str]:
    label = run.config["method"]["label"]
    return (BASELINES.index(label), "") if label in BASELINES else (len(BASELINES), label)


def longbench_section(root, runs, model: str) -> Section:
    """Methods as rows, the four metrics (x100) as columns, one block per set; the BERTScore model named."""
    label = "tab:longbench" + ("" if model == DEFAULT_MODEL else f"_{file_part(model)}")
    title = "LongBench: string match, F1, ROUGE-L, BERTScore (x100), mean rank of the answer's chunk" + \
        ("" if model == DEFAULT_MODEL else f" ({model})")
    chosen = sorted((r for r in runs if "tab:longbench" in r.tables and r.model == model), key=baselines_first)
    if not chosen:
        return Section(label, title, missing="no runs yet: memdefrag experiment=longbench")
    records = [{**record, "run": run_label, "method": run.config["method"]["label"]}
               for run, run_label in zip(chosen, labelled(chosen, label)) for record in run.records]
    scorers = sorted({f"{r['bertscore_model']} (layer {r['bertscore_layers']}, "
                      f"{'rescaled' if r['bertscore_rescaled'] else 'not rescaled'})" for r in records})
    folders = ", ".join(f"`{r.folder.relative_to(root)}`" for r in chosen)
    data = "; ".join(sorted({"the embedded fictional long-context set (task.dataset=synthetic), asked as LongBench "
                             "asks, not LongBench's data" if r.config["task"]["dataset"] == "synthetic" else
                             f"task.dataset={r.config['task']['dataset']}" for r in chosen}))
    return Section(label, title, longbench_table(records).round(1),
                   after=f"Each metric with its 95 % bootstrap interval over the items; `f1 vs vanilla`: the F1 "
                         f"difference against the set's vanilla run on the same items and its paired bootstrap "
                         f"interval. "
                         f"BERTScore: {', '.join(scorers)}. `target_rank`: density rank of the best-ranked chunk "
                         f"holding a gold answer (methods that trace). `items`: the items asked; `truncated`: of "
                         f"them, those whose context was cut in the middle to task.max_tokens (LongBench's own "
                         f"pred.py); `skipped`: the set's items left out for their length (the authors'). Model: "
                         f"{model}. Data: {data}. Runs: {folders}.")


def protocol_of(run: Run) -> str:
    """How a LoCoMo run asked its questions (task.protocol; migrate gives the runs older than it `bare`), which
    every tab:locomo row names, as the protocols' scores are not the same quantity."""
    return f"protocol={run.config['task']['protocol']}"


def unclaimed(rows: dict[tuple, pd.DataFrame]) -> str:
    """Where claims.yaml compares no tab:locomo rows, one sentence saying why: the most conversations two rows of
    one model and protocol pair (harness.report.claims.paired_groups), against the fewest a difference over them needs."""
    pairing: dict[int, list[str]] = {}
    for (model, protocol), n in sorted(paired_groups(rows, "locomo").items()):
        pairing.setdefault(n, []).append(f"{model} {protocol}")
    most = [f"{n}{' conversations' if i == 0 else ''} ({', '.join(where)}"
            f"{': enough, but `claims.yaml` compares none of them' if n >= FEWEST else ''})"
            for i, (n, where) in enumerate(sorted(pairing.items()))]
    return (f"\n\nNo comparison of its rows is claimed (`claims.yaml`): a difference over conversations needs at "
            f"least {FEWEST}, and two rows of one model and protocol pair at most "
            + (f"{', '.join(most[:-1])} or {most[-1]}" if len(most) > 1 else most[0]) + ".")


def locomo_sections(root, runs, figures) -> list[Section]:
    """`tab:locomo`: single-hop F1 under LoCoMo's own protocol, a row per method and a column per model, with the
    claims made of it and its figure (that F1 against seconds per question); then a table per model and protocol
    (`tab:locomo_<model>_<protocol>`, as scores of two protocols are not one quantity): per category and method,
    LoCoMo's F1 and the substring accuracy with their intervals, the evidence hit, its rank, seconds per
    question, its rows named by what differs between them and its caption saying what they share;
    `tab:locomo_layers`: for runs that traced every layer, the evidence session's hit@2 per layer."""
    what = ("LoCoMo's F1 and substring accuracy (%), evidence session read (%), its rank and what ranked it, "
            "seconds per question")
    single = Section("tab:locomo", "LoCoMo dialogue memory: single-hop F1 (%) under LoCoMo's own protocol, a column "
                     "per model")
    layers = Section("tab:locomo_layers", "LoCoMo: evidence session among the 2 densest (%) when traced at each "
                     "layer", missing="no runs yet: memdefrag experiment=locomo task.trace_layers=true")
    chosen = [r for r in runs if "tab:locomo" in r.tables]
    if not chosen:
        single.missing = "no runs yet: memdefrag experiment=locomo"
        return [single, layers]
    tables: dict[tuple[str, str], list[Run]] = {}
    for run in sorted(chosen, key=lambda r: (r.model, protocol_of(r) != "protocol=locomo", protocol_of(r))):
        tables.setdefault((run.model, protocol_of(run)), []).append(run)
    sections, records = [], []
    for (model, protocol), mine in tables.items():
        labels, shared = rows_and_caption(mine, chosen, titled=("task.protocol",))
        refuse_repeated_groups("tab:locomo", mine, labels)
        mine, labels = zip(*sorted(zip(mine, labels), key=lambda pair: (*baselines_first(pair[0]), pair[1])))
        found = [[{**record, "run": f"{model} {protocol}: {label}", "model": model, "method": label,
                   "protocol": protocol} for record in run.records]
                 for run, label in zip(mine, labels)]
        records += [record for answered in found for record in answered]
        sizes = "; ".join(f"{label} {len(answered)} from {len({r['group'] for r in answered})} conversations"
                          for label, answered in zip(labels, found))
        name = file_part(f"{model}_{protocol.split('=')[-1]}")
        answers = [r | {"run": r["method"]} for answered in found for r in answered]
        table = locomo_table(answers).round(1)
        table["f1"] += pd.DataFrame(answers).groupby(["category", "run"]).apply(past_window).reindex(table.index)
        sections.append(Section(f"tab:locomo_{name}", f"LoCoMo on {model} under {protocol}: {what}"
                                + (f"; every row: {shared}" if shared else ""),
                                table.rename_axis(index=["category", "method"]), after=f"Questions asked per row: "
                                f"{sizes}. The measures: as under `tab:locomo`."))
    rows = keyed("locomo", pd.DataFrame(records).groupby(["model", "protocol", "method"]))   # `run` by its parts
    claims = supported(root / "claims.yaml", "locomo", rows) or unclaimed(rows)
    points = scores_by_category(records, ("model", "protocol", "method"))
    points = points[(points.protocol == "protocol=locomo") & (points.category == Category.single_hop)]
    keys = ["model", "protocol", "method", "category"]
    by = pd.DataFrame(records).groupby(keys)
    points = points.join(pd.DataFrame({"past window": by.apply(past_window),
                                       "conversations": by["sample_id"].nunique()}), on=keys)
    if not points.empty:
        figure = figures / "locomo.png"
        accuracy_against_time(points, "f1", figure, name="method", interval=("f1 low", "f1 high"),
                              measure="LoCoMo single-hop F1")
        single.table = single_hop_table(points)
        single.figure = str(figure.relative_to(root))
    else:
        single.missing = "no runs under LoCoMo's own protocol yet: memdefrag experiment=locomo"
    single.after = (f"F1: LoCoMo's own score (evals/locomo_scoring.py) on its single-hop questions (category "
                    f"{int(Category.single_hop)}) with its 95 % bootstrap interval resampling conversations; a cell "
                    f"asked on fewer conversations than the table's most says how many (of two, its interval is only "
                    f"the range of their two means). {asked(chosen)} The figure: the same F1 "
                    f"against seconds per question. Every category, protocol and measure: the tables below, a table "
                    f"per model and protocol. {LOCOMO_NOTES}{claims}")
    if any("evidence_rank_by_layer" in r for r in records):
        layers.table, layers.missing = layers_table(records), ""
        layers.after = ("Each question's evidence session ranked by attention density over the whole memory at "
                        "every layer, in both query modes, with its 95 % Wilson interval over the questions; "
                        "`best layer`: the layer with the most hits.")
    return [single, *sections, layers]


def asked(runs: list[Run]) -> str:
    """What the runs under LoCoMo's own protocol asked per conversation (every question, or a seeded sample), and
    over what memory, per model: LoCoMo's evaluation asks with the whole conversation in the context."""
    per_model = {}
    for run in runs:
        if protocol_of(run) == "protocol=locomo":
            task, capacity = run.config["task"], run.config["model"].get("memory_capacity")
            questions, categories = task.get("questions"), sorted(task.get("categories") or range(1, 6))
            each = questions if isinstance(questions, list) else [questions] * 5        # one number per category
            which = f"categor{'y' if len(categories) == 1 else 'ies'} {'/'.join(map(str, categories))}"
            counts = [each[c - 1] for c in categories]
            sample = f"every question of {which}" if all(n is None for n in counts) else \
                f"a seeded {'/'.join('all' if n is None else str(n) for n in counts)} questions of {which}"
            bound = f"{capacity:,}" if capacity else "unbounded"
            per_model.setdefault(run.model, set()).add(f"{sample} (N_max {bound})")
    if not per_model:
        return ""
    return ("Asked per conversation (LoCoMo's own evaluation asks every question with the whole conversation in "
            "context; these runs ask over the memory each method forms of it, forgetting past N_max): "
            + "; ".join(f"{model}: {' or '.join(sorted(what))}" for model, what in sorted(per_model.items())) + ".")


LOCOMO_NOTES = ("F1: LoCoMo's own score (evals/locomo_scoring.py) with its 95 % bootstrap interval resampling "
                "conversations (category 5, adversarial: LoCoMo's 0 or 100, 100 where the reply says the "
                "information is not there); f1 authors: the MemDefrag authors' (LongBench's qa_f1_score); "
                "accuracy: the gold, cut as LoCoMo's score cuts it, inside the scored reply, Wilson interval; "
                "evidence hit: an evidence session among the fragments read (methods that choose); evidence rank: "
                "its best rank under what ranked (`ranked by`: attention density, or a retriever's own score).")


def single_hop_table(points: pd.DataFrame) -> pd.DataFrame:
    """Method x model: single-hop F1 with its interval (`7.0 [4.7, 9.7]`), marked where an answer read past the
    window, with the conversations asked where fewer than the table's most; baselines first."""
    most = points["conversations"].max()
    cells = [with_interval(f / 100, low / 100, high / 100) + mark
             + ("" if n == most else f" ({n} conversation{'s' * (n > 1)})")
             for f, low, high, mark, n in zip(points["f1"], points["f1 low"], points["f1 high"], points["past window"],
                                              points["conversations"])]
    table = points.assign(cell=cells).pivot(index="method", columns="model", values="cell").fillna("")
    base = {m: m.split("+")[0].split(" ")[0] for m in table.index}         # the method a label begins with
    order = sorted(table.index, key=lambda m: (BASELINES.index(base[m]) if base[m] in BASELINES else len(BASELINES),
                                               m))
    return table.loc[order].rename_axis(columns=None)


def tracer_summary_section(root: Path, runs: list[Run]) -> Section:
    """The layer and query mode `memdefrag tracer-sweep` recorded per model (conf/tracers.yaml), their mean rank
    and Top-1 with the intervals of the sweep's own run (from its records), found by how it swept."""
    section = Section("tab:top_tracing_layer_summary", "Recommended tracer layer per model (memdefrag tracer-sweep)")
    chosen = recorded()
    if not chosen:
        section.missing = f"no model swept yet ({tracers_file().name} is empty)"
        return section
    rows, overlaps = [], []
    for model, choice in chosen.items():
        row = {"model": model, **{key: choice.get(key) for key in ("tracer_layer", "query_mode", "mean_rank", "top1",
                                                                   "swept")},
               "selected_by": choice.get("selected_by", "mean_rank")}
        found = sweep_of(runs, model, choice)
        if found is None:
            rows.append({**row, "run": "not among these results: no interval"})
            continue
        run, metrics = found
        shown = with_bounds(metrics[["mean_rank", "mean_rank low", "mean_rank high", "top1", "top1 low",
                                     "top1 high"]]).iloc[0]
        rows.append({**row, "model": named(run, model), **shown, "run": str(run.folder.relative_to(root))})
        if also := also_asked(run, runs, root):
            overlaps.append(f"- {model}: {also}")
    section.table = pd.DataFrame(rows).set_index("model")
    section.after = ("Mean rank of the target with its 95 % bootstrap interval over groups, Top-1 with its Wilson "
                     "interval over the effective number of probes (a group's probes share its target and memory), "
                     "at the recorded layer and query mode of the sweep's run; `selected_by`: what chose that row of "
                     "the sweep (`memdefrag tracer-sweep task.select_by=...`).")
    if overlaps:
        section.after += ("\n\nThe layer was chosen on targets that these runs of the same model ask too: their "
                          "first groups are drawn as the sweep's were (the same data set, seed and context cut), so "
                          "in those groups a table's method reads at a layer chosen on its own questions.\n\n"
                          + "\n".join(overlaps))
    return section


def also_asked(sweep: Run, runs: list[Run], root: Path) -> str:
    """The folders (their parents below `root`) of `sweep`'s model's runs, probes aside, that draw their groups as
    the sweep did (evals.probe draws through evals.retention: data set, seed and context cut), with how many of
    their groups hold the targets the tracer layer was chosen on; '' where none does."""
    def draw(run: Run) -> tuple:
        task = run.config["task"]
        return task.get("dataset"), task.get("seed", 42), task.get("max_context_tokens", 512)   # Retention's defaults

    swept = {r.get("group") for r in sweep.records}
    overlap: dict[str, tuple[int, int]] = {}
    for run in runs:
        if run.model == sweep.model and "tab:retrieval_layers" not in run.tables and "groups" in run.config["task"] \
                and draw(run) == draw(sweep):
            asked = {r.get("group") for r in run.records}
            where, shared = str(run.folder.relative_to(root).parent), len(asked & swept)
            if shared:                       # a folder's runs (its methods) ask the same groups: the most of them
                overlap[where] = max(overlap.get(where, (0, 0)), (shared, len(asked)))
    return "; ".join(f"`{where}` ({shared} of its {asked} group{'s' * (asked != 1)})"
                     for where, (shared, asked) in sorted(overlap.items()))


def sweep_of(runs: list[Run], model: str, choice: dict) -> tuple[Run, pd.DataFrame] | None:
    """The tracer-sweep run that recorded `choice` for `model` (the same sweep, and its metrics at the chosen layer
    and query mode give the recorded mean rank) and that row of its metrics; None where none is here."""
    for run in runs:
        if run.model != model or "tab:retrieval_layers" not in run.tables or swept(run.config) != choice.get("swept") \
                or not run.records:
            continue
        metrics = tracing_table(run.records)
        row = metrics[(metrics["query_mode"] == choice["query_mode"]) & (metrics["layer"] == choice["tracer_layer"])]
        if len(row) and round(float(row["mean_rank"].iloc[0]), 3) == choice["mean_rank"]:
            return run, row
    return None


def speed_section(root: Path) -> Section:
    section = Section("speed", "Speed per question: each method against no memory, the fast backend against "
                               "the hidden-prefix one (memdefrag-bench)")
    files = sorted(root.glob("speed*.md")) + sorted(root.glob("gpu/*speed*.md")) \
        + sorted(root.glob("gpu/decode_*.md"))      # results/run_gpu.sh's speed, peers and decode tables
    if files:
        section.text = "\n\n".join(bench_table(f, root) for f in files)
    else:
        section.missing = "no runs yet: memdefrag-bench --out results/speed_cpu.md"
    return section


NOT_YET = {
    "tab:larger_backbones": "no results: run experiment=larger_backbones on GPUs with the real weights",
}

# The command that makes each table's runs, by the label it begins with (the longest that fits).
COMMANDS = {
    "fig:distortion": "memdefrag experiment=distortion",
    "tab:retrieval_layers": "memdefrag experiment=probe",
    "tab:retention": "memdefrag experiment=accuracy",
    "tab:retention_comparison": "memdefrag experiment=retention_comparison",
    "tab:forgetting": "memdefrag experiment=forgetting_ablation",
    "tab:forgetting_rank": "memdefrag experiment=retention_comparison; memdefrag experiment=forgetting_ablation",
    "tab:forgetting_seconds": "memdefrag experiment=forgetting_runtime; memdefrag experiment=retention_comparison",
    "tab:longbench": "memdefrag experiment=longbench",
    "tab:runtime": "memdefrag experiment=runtime",
    "tab:gpu-memory": "memdefrag experiment=gpu_memory",
    "tab:top_tracing_layer_summary": "memdefrag tracer-sweep model=<name>",
    "tab:defrag_memoryllm_mplus": "memdefrag experiment=memoryllm_comparison; memdefrag experiment=mplus_comparison",
    "tab:compression": "memdefrag experiment=compression_comparison",
    "tab:larger_backbones": "memdefrag experiment=larger_backbones",
    "tab:locomo": "memdefrag experiment=locomo",
    "tab:locomo_layers": "memdefrag experiment=locomo task.trace_layers=true",
    "tab:rankers": "memdefrag experiment=rankers; memdefrag experiment=rankers_sizes",
    "tab:peers": "memdefrag experiment=peers",
    "speed": "memdefrag-bench --out results/speed_cpu.md",
}
# The paper's order of its tables and figures (../paper: Sec. 2-5, then the appendix); the tables of this
# harness's own studies come after, in this order; any other after those.
ORDER = ("fig:distortion", "tab:retrieval_layers", "tab:retention", "tab:retention_comparison", "tab:forgetting",
         "tab:longbench", "tab:runtime", "tab:gpu-memory", "tab:top_tracing_layer_summary",
         "tab:defrag_memoryllm_mplus", "tab:compression", "tab:larger_backbones", "tab:rankers", "tab:peers",
         "tab:locomo", "speed")


def prefixed(label: str, keys) -> str | None:
    """The longest of `keys` that `label` begins with (None where none does)."""
    return max((k for k in keys if label.startswith(k)), key=len, default=None)


def place(section: Section) -> int:
    found = prefixed(section.label, ORDER)
    return len(ORDER) if found is None else ORDER.index(found)


def declared_sections(runs: list[Run], built: set[str]) -> list[Section]:
    """A table for every label a task declares (its class's `tables`) that no section above builds: the metrics
    of each of its runs as the task computes them (metrics.csv, brought to the current format by `memdefrag
    migrate`), one block of rows per run. So a new task gets its table without an edit here."""
    sections = []
    for label in sorted({t for r in runs for t in r.tables} - built):
        chosen = [r for r in runs if label in r.tables and (r.folder / "metrics.csv").is_file()]
        task = chosen[0].config["task"]["_target_"] if chosen else ""
        section = Section(label, table_titles(task).get(label) or label.split(":")[1].replace("_", " "),
                          command=f"memdefrag task={config_name('task', task)}")
        if not chosen:
            section.missing = "no finished runs yet"
        else:
            section.table = in_percent(pd.concat([pd.read_csv(r.folder / "metrics.csv").assign(
                model=r.model, dataset=named(r, r.config["task"]["dataset"])) for r in chosen], ignore_index=True))
        sections.append(section)
    return sections


def build(root: Path) -> list[Section]:
    runs = runs_under(root)
    figures = root / "figures"
    figures.mkdir(exist_ok=True)
    retained, compared = ({r.model for r in runs if retention_run(r, bounded)} for bounded in (False, True))
    refuse_undrawn(root / "claims.yaml", "retention", retained)
    refuse_undrawn(root / "claims.yaml", "retention_comparison", compared)
    sections = [
        *per_model(retained, lambda model: retention_section(root, runs, False, figures, model)),
        *per_model(compared, lambda model: retention_section(root, runs, True, figures, model)),
        # Where accuracy sits at the floor (a small model on NaturalQA/SQuAD) the target's rank still
        # shows whether forgetting kept what the question needs findable.
        *per_model(compared, lambda model: bounded_step_section(
            runs, "tab:forgetting_rank", "Knowledge retention with forgetting{on}, mean density rank of the target "
            "(1 = first)", "target_rank", model)),
        *per_model(compared, lambda model: bounded_step_section(
            runs, "tab:forgetting_seconds", "Knowledge retention with forgetting{on}, seconds per step (that update's "
            "formation and forgetting, the question's trace and answer)", "seconds", model)),
        *per_model({r.model for r in runs if "tab:longbench" in r.tables},
                   lambda model: longbench_section(root, runs, model)),
        *locomo_sections(root, runs, figures),
        *compression_section(root, runs, figures),
        rankers_section(root, runs, figures),
        peers_section(root, runs, figures),
        *memoryllm_sections(root, runs, figures),
        probe_section(root, runs),
        distortion_section(root, runs),
        tracer_summary_section(root, runs),
        *runtime_section(runs),
        speed_section(root),
    ]
    sections += [Section(label, label.split(":")[1].replace("_", " "), missing=why) for label, why in NOT_YET.items()]
    sections += declared_sections(runs, {s.label for s in sections})
    for section in sections:
        section.command = section.command or COMMANDS.get(prefixed(section.label, COMMANDS), "")
    return sorted(sections, key=place)


def header(root: Path) -> str:
    """The README's head: the command that wrote it, naming the folder it was given (by its name, as run from the
    folder above), and notes.md where there is one (people write it)."""
    name = root.resolve().name
    notes = " How the runs were set up and what the numbers say: [notes.md](notes.md)." \
        if (root / "notes.md").is_file() else ""
    return f"""# Results

Every table of the paper this harness reproduces, in the paper's order, each with the command that makes its
runs, then the harness's own studies. Regenerated whole, deterministically, from the run folders below this one
by `memdefrag report {name}` (which first brings older run folders to the current record format, as `memdefrag
migrate {name}` does alone).{notes}

A cell marked "{BEYOND_CELL}" counts answers that read positions past their model's trained window
(`max_position_embeddings`: 8,192 for SmolLM2), as does a row, column or heading marked "{BEYOND_MARK}" (a run
any of whose answers did): a deliberate study run with `allow_beyond_window=true`, each record saying how far
past it read (`beyond_window`).

<!-- Generated by `memdefrag report {name}`: edit harness/report/document.py{' or notes.md' if notes else ''} instead. -->"""


def write(root: Path) -> Path:
    """Every run folder below root migrated (harness.report.migrate), then tables under root/tables (Markdown and LaTeX),
    figures under root/figures, root/README.md."""
    print_migrations(migrate_all(root, "memdefrag report")[0])     # older run folders read as this version writes
    sections = build(root)
    tables = root / "tables"
    tables.mkdir(exist_ok=True)
    parts = [header(root)]
    for section in sections:
        parts.append(f"## {section.title} (`{section.label}`)")
        if section.command:
            parts.append(f"Command: `{section.command}`")
        if section.text is not None:
            parts.append(section.text)
            continue
        if section.table is None:
            parts.append(f"_{section.missing}_")
            continue
        name = section.label.split(":")[1]
        flat = section.table if isinstance(section.table.index, pd.RangeIndex) else section.table.reset_index()
        markdown = flat.astype(object).where(flat.notna(), "").to_markdown(index=False)
        (tables / f"{name}.md").write_text(markdown + "\n")
        (tables / f"{name}.tex").write_text(section.table.to_latex(float_format="%.1f", na_rep="--",
                                                                   caption=section.title, label=section.label))
        parts.append(markdown)
        if section.figure:
            parts.append(f"![{section.title}]({section.figure})")
        if section.after:
            parts.append(section.after)
    readme = root / "README.md"
    readme.write_text("\n\n".join(parts) + "\n")
    return readme


def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(prog="memdefrag report", description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="?", default="results")
    print(write(Path(parser.parse_args(argv).results)))
