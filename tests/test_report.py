"""`memdefrag report`: tables from whatever results exist, a note where none do, notes kept on top."""

import json
import re
import shutil
from pathlib import Path

from omegaconf import OmegaConf

from evals.locomo import layers_table
from harness.report.document import write


def fake_run(folder, task, method, records, forgetting="unbounded", info=None, study=None, dataset="nqa",
             compression=None, model=None, method_options=None, seed=42, task_options=None):
    folder.mkdir(parents=True)
    config = {"task": {"_target_": f"evals.{task.lower()}.{task}", "dataset": dataset, "updates": 50, "seed": seed,
                       **(task_options or {})},
              "method": {"label": method, **(method_options or {})}, "forgetting": {"label": forgetting},
              "model": model or {"name": "smollm2"},
              "prompt": "chat", "formation": "shared_sink", "study": study,
              "compression": compression or {"label": "none"}}
    (folder / "config.yaml").write_text(OmegaConf.to_yaml(config))
    (folder / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if info:
        (folder / "run.json").write_text(json.dumps(info))


def test_report_builds_what_exists_and_names_what_does_not(tmp_path):
    (tmp_path / "notes.md").write_text("# Our results\n\nHow they were made.")
    steps = [{"group": 0, "step": s, "correct": s == 10, "target_rank": s / 10 + 0.25,
              "seconds": {"formation": 1.0, "trace": s / 4}} for s in (10, 20)]
    fake_run(tmp_path / "f" / "a", "Retention", "memdefrag_top2", steps, "informativeness",
             {"threads": 1, "seconds": {"per_group": 12.5}, "peak_memory": {"cpu_rss_mb": 900}})
    fake_run(tmp_path / "p" / "b", "Probe", "vanilla", [{"ranks": {"last": [2, 1], "mean": [1, 3]}, "layers": [0, 1],
                                                          "group": 0, "position": p, "fragments": 2} for p in (1, 2)])
    fake_run(tmp_path / "p" / "t", "Probe", "text", [{"ranks": {"last": [2, 1], "mean": [1, 3]}, "layers": [0, 1],
                                                       "group": g, "position": 1 + g % 2, "fragments": 3} for g in (0, 1)])
    fading = [{"group": g, "step": s, "correct": s + g < 3, "memory_tokens": 100 * s,
               "density": {"last": [0.5 / s, 0.1], "mean": [0.4 / s, 0.2 * s]}} for g in (0, 1) for s in (1, 2, 3)]
    fake_run(tmp_path / "d" / "c", "Distortion", "vanilla", fading)
    for dataset, seconds in (("nqa", (64.2, 75.07)), ("squad", (60, 70))):
        for job, (method, per_group) in enumerate(zip(("vanilla", "memdefrag_top1"), seconds)):   # a sweep's order
            fake_run(tmp_path / "r" / dataset / f"{job}_{method}", "Retention", method, steps, "informativeness",
                     {"threads": 1 if dataset == "nqa" else 4, "model": "llama31_8b", "device": "cuda:0",
                      "dtype": "bfloat16", "seconds": {"per_group": per_group}}, study="runtime", dataset=dataset)
    for job, (method, mb) in enumerate((("none", 15e9 / 2**20), ("memdefrag_top2", 19.73e9 / 2**20))):
        fake_run(tmp_path / "g" / f"{job}_{method}", "Retention", method, steps, "informativeness",
                 {"threads": 1, "model": "llama31_8b", "device": "cuda:0", "device_name": "NVIDIA H200",
                  "dtype": "bfloat16", "peak_memory": {"cpu_rss_mb": 3000, "cuda_mb": mb}}, study="gpu_memory")
    for job, rate in enumerate((0.3, 1.0)):
        fake_run(tmp_path / "c" / f"{job}_top3", "Retention", "memdefrag_top3",
                 [{"group": 0, "step": 10, "correct": rate < 1, "target_rank": 1}], "informativeness",
                 study="compression_comparison", compression={"label": "self_information", "rate": rate})
    scorer = {"bertscore_model": "minilm", "bertscore_layers": 6, "bertscore_rescaled": False}
    fake_run(tmp_path / "l" / "m", "LongBench", "memdefrag_top2",
             [{"group": g, "subset": "fictional_document", "string_match": 100.0 * g, "f1": 50.0 + 50 * g,
               "rouge_l": 60.0, "bertscore": 40.0, "target_rank": 1 + g, "chunks": 3, "memory_tokens": 900,
               **scorer} for g in (0, 1)])
    readme = write(tmp_path).read_text()
    assert "_no runs yet: memdefrag experiment=longbench_" not in readme
    assert "[notes.md](notes.md)" in readme and "How they were made." not in readme     # linked, not inlined
    assert "_no runs yet: memdefrag experiment=accuracy_" in readme                       # tab:retention
    assert "memdefrag_top2+informativeness" in readme                               # tab:retention_comparison
    assert re.search(r"\| nqa +\| 10 +\| 100.0 \[20.7, 100.0\] +\|", readme)          # with its Wilson interval
    assert re.search(r"\| nqa +\| 20 +\| 2.25 \[2.25, 2.25\] +\|", readme.split("tab:forgetting_rank")[1])
    assert re.search(r"\| nqa +\| 10 +\| 3.50 \[3.50, 3.50\] +\|", readme.split("tab:forgetting_seconds")[1])
    assert "in_band" in readme and "(p/b/tracing.md)" in readme and (tmp_path / "p" / "b" / "tracing.md").is_file()
    assert re.search(r"\| p/b +\| ", readme) and re.search(r"\| p/t +\| ", readme)     # a run's row: its folder
    assert "[p/b](p/b/tracing.md): smollm2, latent memory, chat prompt, shared_sink, 1 groups, target at all 2 " \
           "positions" in readme                                                    # its legend: the rest
    assert "[p/t](p/t/tracing.md): smollm2, text, chat prompt, shared_sink, 2 groups, target at positions 1/2, " \
           "one per group" in readme
    runtime = readme.split("(`tab:runtime`)")[0].split("## ")[-1] + readme.split("(`tab:runtime`)")[1].split("\n## ")[0]
    assert "Time per group (s); dtype bfloat16; groups unrecorded; N_max 12800; " in runtime   # what all rows share
    assert ("Each row's settings where the rows differ: nqa (llama31_8b, cuda:0): threads 1; squad (llama31_8b, "
            "cuda:0): threads 4.") in runtime
    assert "; formation_batch solo; " in runtime              # a run made before the setting formed alone
    assert re.search(r"\| dataset +\| +vanilla\+informativeness \| +memdefrag_top1\+informativeness \|", runtime)
    assert re.search(r"\| nqa \(llama31_8b, cuda:0\) +\| +64.2 \| +75.07 \|", runtime)      # a device's runs on rows of
    assert re.search(r"\| squad \(llama31_8b, cuda:0\) +\| +60 +\| +70 +\|", runtime)       # their own
    assert "12.5" not in runtime                                        # a run of another study
    memory = readme.split("(`tab:gpu-memory`)")[0].split("## ")[-1] + readme.split("(`tab:gpu-memory`)")[1].split("\n## ")[0]
    assert re.search(r"\| nqa \(llama31_8b, NVIDIA H200\) +\| +15 \| +19.73 \|", memory)    # named where recorded
    assert "Peak memory (decimal GB, as the paper's); dtype bfloat16; threads 1;" in memory
    compressed = readme.split("(`tab:compression_comparison`)")[1].split("\n## ")[0]
    assert re.search(r"\| self_information@0.3 +\|", compressed)
    assert "Every run: memdefrag_top3+informativeness." in compressed
    assert re.search(r"\| nqa +\| 10 +\| 100.0 \[20.7, 100.0\] +\| 0.0 \[0.0, 79.3\] +\|", compressed)
    assert "self_information" not in readme.split("(`tab:retention_comparison`)")[1].split("\n## ")[0]
    longbench = readme.split("(`tab:longbench`)")[1].split("\n## ")[0]
    assert re.search(r"\| fictional_document \| memdefrag_top2 \| 50.0 \[0.0, 100.0\] +\| 75.0 \[50.0, 100.0\] +\| "
                     r"60.0 \[60.0, 60.0\] +\| 40.0 \[40.0, 40.0\] +\| +1.5 \| +2 \|", longbench)   # 2 items, bootstrapped
    assert "BERTScore: minilm (layer 6, not rescaled)" in longbench and "`l/m`" in longbench
    assert (tmp_path / "tables" / "longbench.tex").is_file()
    distortion = readme.split("fig:distortion")[1]
    assert "### nqa, vanilla memory (2 groups, `d/c`)" in distortion and re.search(
        r"\| accuracy +\| 100.0 \[34.2, 100.0\] +\| 50.0 \[9.5, 90.5\] +\| 0.0 \[0.0, 65.8\] +\|", distortion)
    assert "![density_heatmap_last](d/c/density_heatmap_last.png)" in distortion
    assert (tmp_path / "d" / "c" / "density_heatmap_last.png").stat().st_size > 1000
    assert (tmp_path / "tables" / "retention_comparison.tex").read_text().count("\\label{tab:retention_comparison}")
    assert (tmp_path / "figures" / "retention_comparison.png").stat().st_size > 1000


def test_tab_gpu_memory_says_in_which_phase_each_gpu_run_reached_its_peak(tmp_path):
    """From the records' `peak_mb` (methods/phase_peaks.py): the phase that raised the peak highest, with its step;
    a job whose peak lies above every timed phase's says so, one below them (a resumed run's last process) too; a
    run without them (a CPU's) is not named."""
    info = {"threads": 1, "model": "llama31_8b", "device": "cuda:0", "dtype": "bfloat16"}
    record = {"group": 0, "step": 50, "correct": False, "target_rank": 1,
              "peak_mb": {"formation": {"start": 16_000.0, "peak": 17_000.0},
                          "plan": {"start": 17_500.0, "peak": 18_157.0},
                          "decode": {"start": 17_500.0, "peak": 18_100.0}}}
    for method, job_mb in (("memdefrag_top2", 18_157.0), ("vanilla", 18_867.0), ("memdefrag_top1", 17_900.0)):
        fake_run(tmp_path / "g" / method, "Retention", method, [record], "informativeness",
                 {**info, "peak_memory": {"cuda_mb": job_mb}}, study="gpu_memory")
    item = {"group": 3, "subset": "fictional_document", "string_match": 0.0, "f1": 0.0, "rouge_l": 0.0,
            "bertscore": 0.0, "bertscore_model": "minilm", "bertscore_layers": 6, "bertscore_rescaled": False,
            "chunks": 3, "memory_tokens": 900, "target_rank": 1,
            "peak_mb": {"decode": {"start": 1_000.0, "peak": 2_000.0}}}           # a LongBench record: no step
    fake_run(tmp_path / "b" / "long", "LongBench", "memdefrag_top2", [item], "informativeness",
             {**info, "peak_memory": {"cuda_mb": 2_000.0}}, study="gpu_memory", dataset="longbench")
    fake_run(tmp_path / "c" / "none", "Retention", "none", [{k: v for k, v in record.items() if k != "peak_mb"}],
             "informativeness",
             {**info, "device": "cpu", "peak_memory": {"cpu_rss_mb": 1300.0}}, study="gpu_memory")
    memory = write(tmp_path).read_text().split("(`tab:gpu-memory`)")[1].split("\n## ")[0]
    at = "plan at step 50, 19.04 GB (from 18.35 GB allocated as it began)"
    assert f"llama31_8b, nqa, memdefrag_top2+informativeness: {at}" in memory
    assert f"llama31_8b, nqa, vanilla+informativeness: outside the timed phases, 19.78 GB (the highest of them: {at})" \
        in memory
    assert f"memdefrag_top1+informativeness: {at}, in an earlier process of this resumed run (its last process's " \
           "peak: 18.77 GB)" in memory
    assert "llama31_8b, longbench, memdefrag_top2+informativeness: decode at group 3, 2.10 GB (from 1.05 GB" in memory
    assert "none+informativeness:" not in memory


def test_a_runtime_runs_slow_first_group_is_named_beside_the_table_with_its_later_groups_mean(tmp_path):
    """A run's first group holds its process's one-time costs (a compiled step's compile): where it took more than
    1.5 times the later groups' mean, both are given beside tab:runtime, whose cell stays the mean of all; a run
    whose first group does not stand out, or that has one group, is not named."""
    record = {"correct": False, "target_rank": 1}
    for folder, seconds in (("cold", (40.0, 2.5, 2.7)), ("even", (3.0, 2.5)), ("one", (9.0,))):
        fake_run(tmp_path / "r" / folder, "Retention", folder, [{**record, "group": g, "step": 10}
                                                                 for g in range(len(seconds))], "informativeness",
                 {"threads": 16, "model": "llama31_8b", "device": "cuda:0", "device_name": "NVIDIA H200",
                  "seconds": {"per_group": sum(seconds) / len(seconds)}}, study="runtime")
        (tmp_path / "r" / folder / "groups.jsonl").write_text(
            "".join(json.dumps({"group": g, "seconds": s}) + "\n" for g, s in enumerate(seconds)))
    runtime = write(tmp_path).read_text().split("(`tab:runtime`)")[1].split("\n## ")[0]
    assert re.search(r"\| nqa \(llama31_8b, NVIDIA H200\) +\| +15.07 \| +2.75 \| +9 \|", runtime)
    assert "first groups that took more than 1.5 times the later ones: llama31_8b, nqa (NVIDIA H200), " \
           "cold+informativeness: 40.00 s, then 2.60 s a group over 2." in runtime
    assert "even+informativeness:" not in runtime and "one+informativeness:" not in runtime


def test_runs_on_rows_of_their_own_device_share_a_column_whatever_else_differs_between_them(tmp_path):
    """tab:gpu-memory's rows are per device: Top-2 on two GPUs, each from a random checkpoint saved in another
    folder, is one column; a setting the runs differ in (the tracer layer) still splits them, across devices too."""
    record = {"group": 0, "step": 50, "correct": False, "target_rank": 1}
    for folder, gpu, source, mb in (("h100", "NVIDIA H100", "/tmp/ckpt/llama31_8b", 18_157.0),
                                    ("h200", "NVIDIA H200", "/tmp/memdefrag-checkpoints/llama31_8b", 17_795.0)):
        fake_run(tmp_path / "g" / folder, "Retention", "memdefrag_top2", [record], "informativeness",
                 {"threads": 16, "model": "llama31_8b", "device": "cuda:0", "device_name": gpu, "dtype": "bfloat16",
                  "peak_memory": {"cuda_mb": mb}}, study="gpu_memory", method_options={"tracer_layer": 13},
                 model={"name": "llama31_8b", "source": source})
    memory = write(tmp_path).read_text().split("(`tab:gpu-memory`)")[1].split("\n## ")[0]
    assert re.search(r"\| dataset +\| +memdefrag_top2\+informativeness \|\n", memory)
    assert re.search(r"\| nqa \(llama31_8b, NVIDIA H100\) +\| +19.04 \|", memory)
    assert re.search(r"\| nqa \(llama31_8b, NVIDIA H200\) +\| +18.66 \|", memory)
    for folder, gpu, mb in (("h100_layer8", "NVIDIA H100", 1_000.0), ("h200_layer8", "NVIDIA H200", 2_000.0)):
        fake_run(tmp_path / "g" / folder, "Retention", "memdefrag_top2", [{**record, "group": 1}], "informativeness",
                 {"threads": 16, "model": "llama31_8b", "device": "cuda:0", "device_name": gpu, "dtype": "bfloat16",
                  "peak_memory": {"cuda_mb": mb}}, study="gpu_memory", method_options={"tracer_layer": 8},
                 model={"name": "llama31_8b", "source": f"/{folder}"})
    memory = write(tmp_path).read_text().split("(`tab:gpu-memory`)")[1].split("\n## ")[0]
    assert "source=" not in memory
    assert re.search(r"\| nqa \(llama31_8b, NVIDIA H100\) +\| +19.04 \| +1.05 \|", memory)     # layer 8: a column
    assert re.search(r"\| nqa \(llama31_8b, NVIDIA H200\) +\| +18.66 \| +2.1 +\|", memory)     # of its own


def test_memoryllm_runs_get_their_table_and_only_the_released_checkpoint_joins_the_comparisons(tmp_path):
    released = {"name": "memoryllm_8b", "source": "YuWangX/memoryllm-8b"}
    mplus = {"name": "mplus_8b", "source": "YuWangX/mplus-8b"}
    tiny = {"name": "memoryllm_tiny_random", "source": "/tmp/memoryllm_tiny"}
    info = {"threads": 1, "model": "x", "device": "cuda:0", "dtype": "bfloat16", "seconds": {"per_group": 64.19}}
    for model, kind in ((released, "memoryllm"), (mplus, "mplus"), (tiny, "memoryllm")):
        for job, (method, correct) in enumerate(((kind, False), (f"{kind}_defrag", True))):
            fake_run(tmp_path / model["name"] / f"{job}_{method}", "Retention", method,
                     [{"group": 0, "step": 10, "correct": correct, "target_rank": 1}], info=info,
                     study=f"{kind}_comparison", model=model,
                     method_options={"defragment": method.endswith("defrag"), "tracer_layer": 13, "query_mode": "last"})
    fake_run(tmp_path / "runtime" / "0_vanilla", "Retention", "vanilla", [{"group": 0, "step": 10, "correct": True}],
             "informativeness", {**info, "seconds": {"per_group": 75.07}}, study="runtime")
    readme = write(tmp_path).read_text()
    real = readme.split("(`tab:defrag_memoryllm_mplus`)")[1].split("\n## ")[0]
    assert "M+-8B, MemoryLLM-8B with and without defragmentation (layer, query mode: 13 last)" in readme
    none, every = r"0.0 \[0.0, 79.3\] +", r"100.0 \[20.7, 100.0\] +"      # one question each, Wilson intervals
    assert re.search(rf"\| nqa +\| 10 +\| {none}\| {every}\| {none}\| {every}\|", real) and "Plumbing" not in real
    plumbing = readme.split("(`tab:defrag_memoryllm_mplus_memoryllm_tiny_random`)")[1].split("\n## ")[0]
    assert "**Plumbing only**: `/tmp/memoryllm_tiny` is not a released checkpoint" in plumbing
    comparison = readme.split("(`tab:retention_comparison`)")[1].split("\n## ")[0]
    assert "memoryllm" in comparison and "mplus" in comparison and "_defrag" not in comparison
    assert "tiny" not in comparison
    runtime = readme.split("(`tab:runtime`)")[1].split("\n## ")[0]
    assert re.search(r"\| +vanilla\+informativeness +\| +memoryllm +\| +mplus +\|", runtime)  # the paper's order
    assert re.search(r"\| nqa \(x, cuda:0\) +\| +75.07 \| +64.19 \| +64.19 \|", runtime)


def test_the_committed_results_readme_is_what_report_writes(tmp_path):
    results = Path(__file__).resolve().parents[1] / "results"
    copy = shutil.copytree(results, tmp_path / "results")
    assert write(copy).read_text() == (results / "README.md").read_text()


def test_the_rankers_table_gives_accuracy_hit_rates_and_the_time_split_per_variant(tmp_path):
    method = {"ranker": "bm25", "size": "topk", "k": 1, "tau": 2.0, "k_max": 4, "arrangement": "best_last",
              "window": 2, "reading": "text"}
    records = [{"group": g, "step": s, "correct": g == 0, "target_rank": 1 + g, "target_read": g == 0,
                "seconds": {"formation": 9.0, "rank": 0.1, "select": 0.0, "prefill": 0.4, "decode": 1.5}}
               for g in (0, 1) for s in (1, 20)]
    records.append({"group": 2, "step": 1, "correct": True, "target_rank": 1, "target_read": True,   # unfinished
                    "seconds": {"rank": 0.1, "select": 0.0, "prefill": 0.4, "decode": 1.5}})
    fake_run(tmp_path / "k" / "0", "Retention", "bm25_text", records, study="rankers", dataset="synthetic",
             method_options=method)
    fake_run(tmp_path / "k" / "1", "Retention", "density_latent", records[:4], study="rankers", dataset="synthetic",
             method_options={**method, "ranker": "density", "reading": "latent", "arrangement": "rotate"})
    readme = write(tmp_path).read_text()
    table = readme.split("(`tab:rankers`)")[1].split("\n## ")[0]
    row = next(line for line in table.splitlines() if "bm25 top1 text" in line)
    cells = [c.strip() for c in row.strip("|").split("|")]
    half = "50.0 [9.5, 90.5]"                                    # 1 of 2, with its 95 % Wilson interval
    assert cells[:11] == ["smollm2", "synthetic", "bm25 top1 text", half, half, "50", "100", "50", "2", "0.1", "0"]
    assert "density rotate w2 latent" in table and (tmp_path / "figures" / "rankers.png").is_file()


def test_the_peers_table_gives_accuracy_and_time_to_first_token_per_method(tmp_path):
    records = [{"group": g, "step": s, "correct": g == 0, "target_rank": None, "memory_tokens": 10 * s,
                "seconds": {"formation": 9.0, "check": 0.5, "prefill": 0.25 * s, "decode": 1.5}}
               for g in (0, 1) for s in (1, 20)]
    fake_run(tmp_path / "p" / "0", "Retention", "cacheblend", records, study="peers", dataset="synthetic")
    fake_run(tmp_path / "p" / "1", "Retention", "text", records[:2], study="peers", dataset="synthetic")
    both = [dict(r, correct=True) for r in records]
    fake_run(tmp_path / "p" / "2", "Retention", "memdefrag_top1", both, study="peers", dataset="synthetic")
    (tmp_path / "peers").mkdir()
    (tmp_path / "peers" / "speed_cpu.md").write_text("| method | ttft_s |\n|---|---|\n| epic | 1.5 |\n")
    readme = write(tmp_path).read_text()
    table = readme.split("(`tab:peers`)")[1].split("\n## ")[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines() if "| smollm2" in line]
    assert [row[2] for row in rows] == ["text", "memdefrag_top1", "cacheblend"]    # the table's method order
    half = "50.0 [9.5, 90.5]"                                    # 1 of 2, with its 95 % Wilson interval
    assert rows[2][:9] == ["smollm2", "synthetic", "cacheblend", half, half, "5.5", "4.62", "200", "2"]
    assert rows[2][-1] == "-50.0 (p 1, n 2)" and rows[1][-1] == "reference"     # paired on the same questions
    assert "| epic | 1.5 | n = 1, no interval |" in table and (tmp_path / "figures" / "peers.png").is_file()


def test_the_recommended_tracer_layer_shows_its_sweeps_intervals(tmp_path, monkeypatch):
    probes = [{"ranks": {"last": [2, 1], "mean": [1, 2]}, "layers": [0, 1], "group": g, "position": 1, "fragments": 2}
              for g in (0, 1)]
    fake_run(tmp_path / "sweep", "Probe", "vanilla", probes)
    config = OmegaConf.load(tmp_path / "sweep" / "config.yaml")
    config.task = {"_target_": "evals.probe.Probe", "dataset": "nqa", "groups": 2, "fragments": 2, "layers": "all",
                   "seed": 42}
    (tmp_path / "sweep" / "config.yaml").write_text(OmegaConf.to_yaml(config))
    for dataset in ("nqa", "squad"):        # nqa's first two groups hold the sweep's targets; squad's do not
        fake_run(tmp_path / dataset / "vanilla", "Retention", "vanilla",
                 [{"group": g, "step": 1, "correct": True} for g in range(3)], dataset=dataset,
                 task_options={"groups": 3})
    (tmp_path / "sweep" / "metrics.csv").write_text("method\nvanilla\n")       # the task's, once migrated
    swept = "layers all on nqa, 2 groups x 2 fragments, prompt chat, formation shared_sink"
    tracers = tmp_path / "tracers.yaml"
    tracers.write_text(OmegaConf.to_yaml({
        "smollm2": {"tracer_layer": 1, "query_mode": "last", "mean_rank": 1.0, "top1": 100.0, "swept": swept},
        "other": {"tracer_layer": 3, "query_mode": "mean", "mean_rank": 2.5, "top1": 40.0, "swept": swept}}))
    monkeypatch.setenv("MEMDEFRAG_TRACERS", str(tracers))
    table = write(tmp_path).read_text().split("(`tab:top_tracing_layer_summary`)")[1].split("\n## ")[0]
    rows = {cells[0]: cells[1:] for line in table.splitlines() if line.startswith("| ") and "---" not in line
            for cells in [[c.strip() for c in line.strip("|").split("|")]]}
    # Top-1: both groups' one probe hit, an interval over 2 observations
    assert rows["smollm2"] == ["1", "last", "1.00 [1.00, 1.00]", "100.00 [34.24, 100.00]", swept, "mean_rank",
                               "sweep"]
    assert rows["other"][2:4] == ["2.5", "40.0"] and rows["other"][-1] == "not among these results: no interval"
    assert "\n- smollm2: `nqa` (2 of its 3 groups)\n" in table and "squad" not in table


def test_a_seconds_table_says_under_what_its_columns_were_timed_and_where_they_differ(tmp_path):
    """What every column shares is said once; a commit that differs is said per column, with the warning that the
    columns were not timed alike; reuse_formed (True, migrated in) says a formation may have been served."""
    steps = [{"group": 0, "step": 10, "correct": True, "target_rank": 1, "seconds": {"trace": 1.0}}]
    for method, commit in (("vanilla", "a" * 40), ("memdefrag_top1", "b" * 40)):
        fake_run(tmp_path / "f" / method, "Retention", method, steps, "informativeness",
                 {"threads": 1, "git": commit, "device_name": "Some CPU"})
    seconds = write(tmp_path).read_text().split("(`tab:forgetting_seconds`)")[1].split("\n## ")[0]
    assert "Timed with threads 1, device Some CPU, reuse_formed True. commit: " in seconds
    assert "vanilla+informativeness aaaaaaaa" in seconds and "memdefrag_top1+informativeness bbbbbbbb" in seconds
    assert "not timed alike" in seconds and "served the distractors that one formed" in seconds


def test_a_distortion_run_at_the_floor_says_its_correlations_say_little(tmp_path):
    """One correct answer over three steps: two accuracy levels, so every r rests on one step; said under its table,
    and not under a run whose accuracy moves over three levels."""
    def steps(correct):
        return [{"group": g, "step": s, "correct": correct(g, s), "memory_tokens": 100 * s,
                 "density": {"last": [0.5 / s, 0.1], "mean": [0.4 / s, 0.2 * s]}} for g in (0, 1) for s in (1, 2, 3)]

    fake_run(tmp_path / "d" / "floor", "Distortion", "vanilla", steps(lambda g, s: g == 0 and s == 1))
    fake_run(tmp_path / "d" / "moving", "Distortion", "text", steps(lambda g, s: s + g < 3))
    section = write(tmp_path).read_text().split("(`fig:distortion`)")[1].split("\n## ")[0]
    floor, moving = section.split("`d/floor`")[1].split("###")[0], section.split("`d/moving`")[1]
    assert "Accuracy takes only 2 values over the steps (1 correct answer in all): an r here says little." in floor
    assert "Accuracy takes only" not in moving


def test_a_bench_table_says_each_timing_is_one_number_without_an_interval(tmp_path):
    fake_run(tmp_path / "r", "Retention", "vanilla", [{"group": 0, "step": 1, "correct": True}])
    (tmp_path / "speed_cpu.md").write_text("model=smollm2, best of 3 questions right after an update\n\n"
                                           "| method | ttft_s |\n|---|---|\n| none | 0.2 |\n")
    speed = write(tmp_path).read_text().split("(`speed`)")[1]
    assert "`speed_cpu.md`: model=smollm2" in speed
    assert "| method | ttft_s | interval |" in speed
    assert "| none | 0.2 | n = 1, no interval (the fastest of 3) |" in speed
    assert "Written before the bench checked its reads against the model's trained window" in speed
    (tmp_path / "speed_cpu.md").write_text("model=smollm2, best of 3 questions (past_window: how far past it)\n\n"
                                           "| method | past_window |\n|---|---|\n| none | 0 |\n")
    assert "Written before" not in write(tmp_path).read_text()


def test_the_locomo_layer_table_gives_each_hit_rate_its_interval():
    records = [{"run": "top2", "evidence_rank_by_layer": {"last": [1, 3], "mean": [2, 1]}},
               {"run": "top2", "evidence_rank_by_layer": {"last": [5, 2], "mean": [1, 1]}}]
    table = layers_table(records)
    assert list(table["top2 (last)"]) == ["50.0 [9.5, 90.5]", "50.0 [9.5, 90.5]", 0]
    assert list(table["top2 (mean)"]) == ["100.0 [34.2, 100.0]", "100.0 [34.2, 100.0]", 0]


def test_a_figure_takes_an_interval_whose_rounded_end_lies_past_its_mean(tmp_path):
    """A constant sample's bootstrap ends, rounded, can lie a hair past the mean (0.2 -> low 0.20000000000000004):
    the point is drawn, not refused for a negative error bar."""
    import pandas as pd

    from harness.results.figures import accuracy_against_time

    table = pd.DataFrame({"model": ["m"], "method": ["vanilla"], "s/question": [1.0], "f1": [20.0],
                          "f1 low": [20.000000000000004], "f1 high": [20.0]})
    accuracy_against_time(table, "f1", tmp_path / "f.png", name="method", interval=("f1 low", "f1 high"))
    assert (tmp_path / "f.png").stat().st_size > 0


def test_a_report_written_elsewhere_names_its_own_folder_and_links_no_notes_that_are_not_there(tmp_path):
    steps = [{"group": 0, "step": 1, "correct": True}]
    fake_run(tmp_path / "mine" / "r", "Retention", "vanilla", steps)
    readme = write(tmp_path / "mine").read_text()
    assert "`memdefrag report results`" not in readme and "notes.md" not in readme
    assert "by `memdefrag report mine`" in readme and "Generated by `memdefrag report mine`" in readme
    (tmp_path / "mine" / "notes.md").write_text("# How\n")
    assert "[notes.md](notes.md)" in write(tmp_path / "mine").read_text()


def test_locomo_gets_a_table_per_model_and_protocol_its_rows_named_by_what_differs_and_a_single_hop_one(tmp_path):
    """Rows named by the method and the one setting that tells two apart (trace_layers), what every row shares in
    the caption; the single-hop F1 a row per method, a column per model; a cell past the window marked, and a cell
    of fewer conversations than the table's most (another model's) marked with how many; the sample asked per
    model, against LoCoMo's every question, in the caption."""
    from tests.test_claims import locomo_runs

    conversations = {f"conv-{c}": [0.5, 0.25] for c in range(2)}
    locomo_runs(tmp_path / "smollm2", {m: conversations for m in ("vanilla", "memdefrag_top2", "none")})
    locomo_runs(tmp_path / "traced", {"memdefrag_top2": conversations})
    for path in (tmp_path / "traced").glob("*/config.yaml"):
        path.write_text(path.read_text().replace("protocol: locomo", "protocol: locomo\n  trace_layers: true"))
    for path in (tmp_path / "smollm2").glob("*/config.yaml"):
        path.write_text(path.read_text().replace("protocol: locomo", "protocol: locomo\n  trace_layers: false"))
    locomo_runs(tmp_path / "authors", {"vanilla": {"conv-0": [1.0]}})
    config = tmp_path / "authors" / "vanilla" / "config.yaml"
    config.write_text(config.read_text().replace("protocol: locomo", "protocol: authors\n  trace_layers: false"))
    locomo_runs(tmp_path / "gemma", {"vanilla": {"conv-0": [0.5, 0.25]}})
    config = tmp_path / "gemma" / "vanilla" / "config.yaml"
    config.write_text(config.read_text().replace("name: smollm2", "name: gemma3_270m").replace(
        "protocol: locomo", "protocol: locomo\n  trace_layers: false"))
    past = tmp_path / "gemma" / "vanilla" / "predictions.jsonl"
    past.write_text(past.read_text().replace('"category": 4,', '"category": 4, "beyond_window": 3,', 1))
    readme = write(tmp_path).read_text()
    single = readme.split("(`tab:locomo`)")[1].split("\n## ")[0]
    assert re.search(r"\| method +\| gemma3_270m +\| smollm2 +\|", single)
    assert re.search(r"\| none +\| +\| 37.5 \[37.5, 37.5\] +\|", single)
    assert re.search(r"\| vanilla +\| 37.5 \[37.5, 37.5\] † \(1 conversation\) +\| 37.5 \[37.5, 37.5\] +\|", single)
    assert "gemma3_270m: every question of categories 1/2/3/4/5 (N_max 12,800); smollm2: every question of " \
           "categories 1/2/3/4/5 (N_max 12,800)." in single
    smollm2 = readme.split("## LoCoMo on smollm2 under protocol=locomo: ")[1].split("\n## ")[0]
    assert smollm2.splitlines()[0].endswith("per question (`tab:locomo_smollm2_locomo`)")     # nothing shared
    rows = [line.split("|")[2].strip() for line in smollm2.splitlines() if re.match(r"\| +4 \|", line)]
    assert rows == ["none", "vanilla", "memdefrag_top2 trace_layers=False", "memdefrag_top2 trace_layers=True"]
    authors = readme.split("## LoCoMo on smollm2 under protocol=authors: ")[1].split("\n")[0]
    assert authors.endswith("; every row: trace_layers=False (`tab:locomo_smollm2_authors`)")
    assert "(`tab:locomo_gemma3_270m_locomo`)" in readme


def test_a_run_with_no_answer_yet_is_left_out_in_one_line_and_alone_is_refused(tmp_path, capsys):
    """A run killed (or still) before its first record: its predictions.jsonl empty, or a line cut short."""
    import pytest

    from harness.errors import ConfigError

    fake_run(tmp_path / "r" / "empty", "Retention", "vanilla", [])
    (tmp_path / "r" / "cut").mkdir(parents=True)
    (tmp_path / "r" / "cut" / "config.yaml").write_text((tmp_path / "r" / "empty" / "config.yaml").read_text())
    (tmp_path / "r" / "cut" / "predictions.jsonl").write_text('{"group": 0, "st')
    with pytest.raises(ConfigError, match=r"holds no run with an answer .*nothing to report, nothing written"):
        write(tmp_path)
    assert not (tmp_path / "README.md").exists() and not (tmp_path / "figures").exists()
    fake_run(tmp_path / "r" / "answered", "Retention", "memdefrag_top2", [{"group": 0, "step": 1, "correct": True}])
    capsys.readouterr()
    assert "memdefrag_top2" in write(tmp_path).read_text()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "memdefrag report: left out 2 run folders with no finished group yet: "), err
