"""The distortion study: density traced before every answer, correlated with accuracy per layer."""

import json

import pytest

from evals.distortion import Distortion, correlations
from methods.backends.kv_prefix import KVPrefixBackend
from methods.session import Session
from methods.baselines import TextMemory
from methods.baselines import Vanilla
from tests.test_retention import write


@pytest.mark.parametrize("method", [Vanilla(), TextMemory()])
def test_every_step_records_the_targets_density_at_every_layer(tmp_path, llama, tokenizer, method):
    write(tmp_path, [{"context": "the cat is on the mat", "question": "cat?", "answer": "mat"}],
          ["unrelated words", "more unrelated words", "zzz"])
    task = Distortion("nqa", str(tmp_path), groups=1, updates=4)
    session = Session(llama, tokenizer, KVPrefixBackend(llama), method, "shared_sink", "plain", max_new_tokens=3)
    records = list(task.run_group(session, task.groups(tokenizer)[0]))
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert all(r["target_position"] == 1 for r in records)               # stored first, never shuffled
    for record in records:
        for mode in ("last", "mean"):
            assert len(record["density"][mode]) == llama.config.num_hidden_layers
    first = records[0]["density"]["mean"]
    assert all(d > records[-1]["density"]["mean"][i] for i, d in enumerate(first))   # more memory, less each
    json.dumps(records)


def test_correlations_per_layer():
    records = [{"step": s, "correct": c, "density": {"last": [d, 0.5], "mean": [d, -d]}}
               for s, c, d in [(1, True, 0.9), (2, True, 0.8), (2, False, 0.6), (3, False, 0.1)]]
    table = correlations(records)
    mean = table[table.query_mode == "mean"].set_index("layer")
    # per step: density 0.9, 0.7, 0.1 against accuracy 1, 0.5, 0
    assert mean.loc[0, "spearman"] == pytest.approx(1.0) and mean.loc[0, "pearson"] == pytest.approx(0.9608, abs=1e-4)
    assert mean.loc[1, "spearman"] == pytest.approx(-1.0)
    assert mean.index.tolist() == [0, 1]                                  # best first
    assert (table["accuracy_levels"] == 3).all()
    last = table[table.query_mode == "last"].set_index("layer")
    assert last.loc[1].isna()["pearson"]                                   # a constant density has no r


def test_analysis_writes_the_figures_and_tables(tmp_path):
    from harness.report.analysis import write_analysis

    (tmp_path / "config.yaml").write_text("task:\n  _target_: evals.distortion.Distortion\nmethod: {label: vanilla}\n"
                                             "model: {name: tiny}\n")
    records = [{"step": s, "correct": s < 3, "density": {"last": [1 / s, 0.2], "mean": [1 / s, 1 / s ** 2]}}
               for s in (1, 2, 3, 4)]
    written = write_analysis(tmp_path, records)
    assert sorted(p.name for p in written) == sorted(
        ["correlations.md"] + [f"{kind}_{mode}.png" for kind in ("density_heatmap", "accuracy_density",
                                                                  "correlations") for mode in ("last", "mean")])
    assert all(p.stat().st_size > 1000 for p in written if p.suffix == ".png")
    assert "| query_mode" in (tmp_path / "correlations.md").read_text()
