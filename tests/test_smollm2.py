"""The embedded default model end to end (slow: minutes on 2 cores)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from evals.synthetic import generate
from methods.formation import Former
from methods.backends.hidden_prefix import HiddenPrefixBackend
from methods.backends.kv_prefix import KVPrefixBackend
from methods.memory import LatentMemory
from methods.baselines import NoMemory, Vanilla
from methods.prompting import format_prompt
from methods.session import Session
from methods.attention.tracing import densities
from tests.conftest import refused

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("formation", ["reference", "shared_sink"])
def test_fast_equals_hidden_prefix_on_smollm2(smollm2, formation):
    model, tokenizer = smollm2
    data = generate(0)
    memory = LatentMemory()
    former = Former(model, tokenizer, formation, keep_kv=True, keep_states=True)
    for text in [data.targets[0].context, *data.unrelated[:3]]:
        former.store(memory, text + "\n\n")
    prompt = format_prompt(tokenizer, data.targets[0].question, "chat")
    fast, ref = KVPrefixBackend(model), HiddenPrefixBackend(model)
    layers = list(range(model.config.num_hidden_layers))
    for view in (memory, memory.arranged([2, 0])):                    # vanilla; reordered Top-2
        torch.testing.assert_close(fast.prefill(view, prompt)[0], ref.prefill(view, prompt)[0], atol=1e-4, rtol=0)
        fast_rows, ref_rows = fast.attention_rows(view, prompt, layers), ref.attention_rows(view, prompt, layers)
        for layer in layers:
            torch.testing.assert_close(densities(fast_rows[layer], view.spans(), "mean"),
                                       densities(ref_rows[layer], view.spans(), "mean"), atol=1e-5, rtol=0)


def test_a_shared_prefix_is_the_chat_header_and_the_prompt_read_after_it_the_rest(smollm2):
    """APE's setting (formation=shared_prefix): the memory's sink is the chat template's header, the prompt read
    after the memory the question and the generation prompt; together they are the prompt whole. Before any
    fragment, and for a method that reads no memory, the prompt is read whole."""
    model, tokenizer = smollm2
    question = "Where did Alice go?"
    session = Session(model, tokenizer, KVPrefixBackend(model), Vanilla(), "shared_prefix", "chat", max_new_tokens=4)
    whole = format_prompt(tokenizer, question, "chat")
    assert torch.equal(session.prompt_ids(question), whole)
    session.store("Alice went to Paris in May.")
    header = session.memory.sink.token_ids
    assert tokenizer.decode(header).startswith("<|im_start|>system") and tokenizer.decode(header).endswith("user\n")
    assert torch.equal(torch.cat([header, session.prompt_ids(question)]), whole)
    assert session.ask(question).memory_tokens == len(header) + session.memory.n_tokens
    unread = Session(model, tokenizer, KVPrefixBackend(model), NoMemory(), "shared_prefix", "chat", max_new_tokens=4)
    unread.store("Alice went to Paris in May.")
    assert unread.ask(question).prompt_tokens == len(whole)


def memdefrag(*args, cwd):
    env = {**os.environ, "WANDB_MODE": "offline"}
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=900)


def test_cli_writes_a_self_describing_result_folder(tmp_path):
    out = tmp_path / "run"
    # answers of 8 tokens: what is tested is the folder a run writes, not its answers
    done = memdefrag("method=memdefrag_top1", "task.groups=2", "task.updates=3", "max_new_tokens=8",
                     f"hydra.run.dir={out}", cwd=os.getcwd())
    assert done.returncode == 0, done.stderr[-2000:]
    assert "memdefrag_top1 on synthetic" in done.stdout
    records = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 1, 2, 3]
    assert {"group", "step", "method", "output", "correct", "memory_tokens", "target_rank", "seconds"} <= set(records[0])
    info = json.loads((out / "run.json").read_text())
    assert info["formation"] == "shared_sink" and info["prompt"] == "chat" and info["versions"]["torch"]
    assert info["dtype"] == "float32" and info["self_check"]["exact"]
    assert (out / "metrics.csv").read_text().startswith("method,step,accuracy")
    assert list((out / "wandb").glob("offline-run-*"))


@pytest.mark.filterwarnings("error")      # a warning would be a second line on the terminal
def test_cli_refuses_bad_input_with_one_line(tmp_path, monkeypatch, capsys):
    assert refused(["method.k=0", f"hydra.run.dir={tmp_path}"], monkeypatch, capsys).startswith(
        "memdefrag: error: method.k=0 is not allowed")


def test_the_readme_library_example_runs_as_written(tmp_path, monkeypatch, capsys):
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    example = readme.split("## Use it as a library\n\n```python\n")[1].split("```")[0]
    monkeypatch.chdir(tmp_path)
    exec(compile(example, "README example", "exec"), {})
    text, densities = capsys.readouterr().out.strip().splitlines()[-2:]
    assert (tmp_path / "memory.pt").is_file() and "Quenby" in text
    density = eval(densities)
    assert len(density) == 3 and max(density, key=density.get) == 1          # the capital's fragment, densest


def test_the_main_job_on_the_embedded_model_answers_as_its_cached_run(tmp_path):
    """The main job's five methods on 2 groups of 5 updates (16 tokens an answer), answer for answer as cached."""
    from hydra import compose, initialize_config_module

    from harness.running.runner import run
    from tests.conftest import matches_cached, sweep_points

    for i, point in enumerate(sweep_points("main")):
        with initialize_config_module("conf", version_base="1.3"):
            cfg = compose("config", overrides=["experiment=main", *point, "task.groups=2", "task.updates=5",
                                               "task.eval_steps=[1,5]", "max_new_tokens=16", "threads=1",
                                               "logger=none"])
        run(cfg, str(tmp_path / str(i)))
        matches_cached(tmp_path / str(i), f"smollm2_main/{i}")
