"""memdefrag-bench end to end on a tiny random shape, the path a GPU run takes (--shape, --device, --dtype)."""

import pandas as pd

from harness.benchmark import main


def test_the_benchmark_times_every_method_at_a_fixed_answer_length_and_checks_both_backends(tmp_path, capsys):
    out = tmp_path / "speed.md"
    main(["--shape", "tiny", "--sizes", "2", "3", "--new-tokens", "5", "--repeats", "1", "--threads", "1",
          "--hidden-prefix", "--out", str(out)])
    header, _, *lines = out.read_text().splitlines()
    assert header.startswith("model=tiny (random weights), device=cpu, dtype=float32, threads=1")
    table = pd.DataFrame([[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]],
                         columns=[c.strip() for c in lines[0].strip("|").split("|")])
    assert sorted(set(table.method)) == ["memdefrag_top1", "memdefrag_top2", "none", "vanilla"]
    assert len(table) == 2 * 7                                  # none on the fast backend only
    assert set(table.tokens) == {"5"}                           # no method stops early
    hidden = table[table.backend == "hidden_prefix"]
    assert set(hidden.same_output) == {"yes"} and all(float(s) > 0 for s in hidden.speedup)
    traced = table[table.method.str.startswith("memdefrag")]
    assert all(0 < float(t) < float(total) for t, total in zip(traced.trace_s, traced.total_s))
    assert all(float(r) == 1.0 for r in table[table.method == "none"].vs_none)
    assert all(float(f) > 0 for f in table.update_total_s)     # the question right after an update, apart


def test_a_random_checkpoint_of_a_shape_runs_through_the_harness(tmp_path):
    from harness.runner import run
    from tests.conftest import tiny_run_config

    main(["--shape", "tiny", "--save-random", str(tmp_path / "tiny")])
    cfg = tiny_run_config(str(tmp_path / "tiny"), "method=memdefrag_top2", "task.groups=1")
    metrics = run(cfg, str(tmp_path / "run"))
    assert list(metrics["step"]) == [1, 2, 3]


def test_the_benchmark_times_only_the_methods_asked_for(tmp_path):
    out = tmp_path / "speed.md"
    main(["--shape", "tiny", "--sizes", "2", "--new-tokens", "2", "--repeats", "1", "--methods", "vanilla",
          "--out", str(out)])
    rows = out.read_text().splitlines()[4:]
    assert len(rows) == 1 and "| vanilla " in rows[0]
