"""Every bad input ends `memdefrag` with exit status 2 and one line naming the key and the value,
before any job runs or any model weights load (table-driven, through the real command in-process)."""

import sys

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM

from harness import cli

NQA_MISSING = "task.dataset=nqa"
CASES = [
    # wrong types, refused by the typed schemas (conf/schema.py)
    (["method.tracer_layer=abc"], "method.tracer_layer: Value 'abc'"),
    (["method.tracer_layer=1.5"], "method.tracer_layer: Value '1.5'"),
    (["method.tracer_layer=true"], "method.tracer_layer: Value 'True'"),
    (["model.tracer_layer=x"], "model.tracer_layer: Value 'x'"),
    (["max_new_tokens=1.5"], "max_new_tokens: Value '1.5'"),
    (["max_new_tokens=many"], "max_new_tokens: Value 'many'"),
    (["task.groups=2.5"], "task.groups: Value '2.5'"),
    (["task.groups=ten"], "task.groups: Value 'ten'"),
    (["task.updates=x"], "task.updates: Value 'x'"),
    (["task.eval_steps=[a]"], "task.eval_steps[0]: Value 'a'"),
    (["task.eval_steps=5"], "task.eval_steps: "),
    (["task.shuffle=maybe"], "task.shuffle: Value 'maybe'"),
    (["task.seed=x"], "task.seed: Value 'x'"),
    (["task.max_context_tokens=big"], "task.max_context_tokens: Value 'big'"),
    (["task.dataset=imdb"], "task.dataset: Invalid value 'imdb', expected one of [synthetic, nqa, squad]"),
    (["backend=slow"], "backend: Invalid value 'slow', expected one of [fast, hidden_prefix]"),
    (["formation=joint"], "formation: Invalid value 'joint', expected one of [shared_sink, reference]"),
    (["prompt=foo"], "prompt: Invalid value 'foo', expected one of [chat, plain]"),
    (["model.dtype=float64"], "model.dtype: Invalid value 'float64'"),
    (["model.dtype=int8"], "model.dtype: Invalid value 'int8'"),
    (["model.query_mode=first"], "model.query_mode: Invalid value 'first', expected one of [last, mean]"),
    (["method.query_mode=first"], "method.query_mode: Invalid value 'first'"),
    (["logger=wandb", "logger.mode=onlin"], "logger.mode: Invalid value 'onlin', expected one of [offline, online"),
    (["logger=wandb", "logger.tags=x"], "logger.tags: "),
    (["resume=perhaps"], "resume: Value 'perhaps'"),
    (["seed=x"], "seed: Value 'x'"),
    (["threads=two"], "threads: Value 'two'"),
    (["model.trust_remote_code=maybe"], "model.trust_remote_code: Value 'maybe'"),
    (["model.memory_capacity=lots"], "model.memory_capacity: Value 'lots'"),
    (["task=probe", "task.one_position_per_group=perhaps"], "task.one_position_per_group: Value 'perhaps'"),
    (["task=probe", "task.fragments=x"], "task.fragments: Value 'x'"),
    (["task=probe", "task.positions=[x]"], "task.positions[0]: Value 'x'"),
    (["forgetting=random", "forgetting.capacity=x"], "forgetting.capacity: Value 'x'"),
    # unknown keys and choices
    (["method.kk=1"], "method.kk: Key 'kk' not in 'MemDefragSchema'"),
    (["task.grups=3"], "task.grups: Key 'grups' not in 'RetentionSchema'"),
    (["model.nme=x"], "model.nme: Key 'nme' not in 'ModelSchema'"),
    (["foo=1"], "foo: Key 'foo' not in 'RunSchema'"),
    (["method=nosuch"], "Could not find 'method/nosuch'"),
    (["task=nosuch"], "Could not find 'task/nosuch'"),
    (["model=nosuch"], "Could not find 'model/nosuch'"),
    (["forgetting=nosuch"], "Could not find 'forgetting/nosuch'"),
    (["experiment=nosuch"], "Could not find 'experiment/nosuch'"),
    (["method.k=="], "Error parsing override 'method.k=='"),
    # values out of range, refused by the plugins and the runner's preflight
    (["method.k=0"], "method.k=0 is not allowed: use an integer >= 1 or 'all'"),
    (["method.k=-1"], "method.k=-1 is not allowed"),
    (["method.k=some"], "method.k='some' is not allowed"),
    (["method.tracer_layer=30"], "method.tracer_layer=30 is out of range: this model has 30 decoder layers, "
     "allowed 0..29"),
    (["method.tracer_layer=-1"], "method.tracer_layer=-1 is out of range"),
    (["model.tracer_layer=null"], "method.tracer_layer and method.query_mode must be set"),
    (["threads=0"], "threads=0 must be >= 1"),
    (["threads=-1"], "threads=-1 must be >= 1"),
    (["max_new_tokens=0"], "max_new_tokens=0 must be >= 1"),
    (["task.eval_steps=[]"], "task.eval_steps=[] asks at no step"),
    (["task.eval_steps=[0]"], "task.eval_steps=[0] must lie in 1..task.updates=20"),
    (["task.eval_steps=[99]"], "task.eval_steps=[99] must lie in 1..task.updates=20"),
    (["task.groups=0"], "task.groups=0 and task.updates=20 must both be >= 1"),
    (["task.updates=0"], "task.groups=20 and task.updates=0 must both be >= 1"),
    (["task.groups=100000"], "task.groups=100000 and task.updates=20 need 100000"),
    (["task.max_context_tokens=1"], "offers 0 targets within 1 tokens"),
    (["forgetting=informativeness", "model.memory_capacity=0"], "forgetting.capacity=0 must be a positive"),
    (["forgetting=random", "model.memory_capacity=null"], "capacity=None must be a positive"),
    (["forgetting=informativeness", "model.memory_capacity=20"], "forgetting.capacity=20 is smaller than a fragment"),
    (["forgetting=random_layerwise", "method=text"], "method=text has no layers"),
    (["shard=3/2"], "shard"),
    (["shard=x"], "shard"),
    ([NQA_MISSING, "task.data_dir=/nowhere"], "task.data_dir='/nowhere' has no folder nqa/"),
    (["model.device=gpu"], "model.device='gpu' is not a device: use auto, cpu, cuda or cuda:<index>"),
    (["model.source=/no/such/model"], "model.source='/no/such/model' cannot be loaded"),
    (["model=hf", "model.source=nobody/not-a-model-xyz"], "model.source='nobody/not-a-model-xyz' cannot be loaded"),
    (["model=gemma3_270m", "prompt=chat"], "prompt='chat' needs a tokenizer with a chat template"),
    (["task=probe", "task.layers=middle"], "task.layers='middle' must be 'all', 'band' or a list"),
    (["task=probe", "task.fragments=1"], "task.fragments=1 must be >= 2"),
    (["task=probe", "task.positions=[0]"], "task.positions=[0] must lie in 1..task.fragments=20"),
    (["hydra.run.dir=/etc/hostname/run"], "output folder '/etc/hostname/run' cannot be created"),
    (["task=longbench", "task.subsets=[nosuch]"], "task.subsets=['nosuch'] must name some of ['fictional_passages'"),
    (["task=longbench", "task.dataset=longbench", "task.subsets=[musique]", "task.data_dir=/nowhere"],
     "task.subsets: no data for 'musique' in /nowhere/longbench"),
    (["task=longbench", "task.dataset=longbench"], "task.subsets: no data for '2wikimqa'"),
    (["task=longbench", "task.dataset=hotpotqa"], "task.dataset: Invalid value 'hotpotqa', expected one of "
     "[synthetic, longbench]"),
    (["task=longbench", "task.chunk_tokens=0"], "task.chunk_tokens=0 must be >= 1"),
    (["task=longbench", "task.groups=0"], "task.groups=0 must be >= 1"),
    (["task=longbench", "task.max_tokens=10"], "no item of 'fictional_passages' fits task.max_tokens=10"),
    (["task=longbench", "task.chunking=words"], "task.chunking: Invalid value 'words', expected one of "
     "[passages, sentences, fixed]"),
    (["task=longbench", "task.overflow=wrap"], "task.overflow: Invalid value 'wrap'"),
    (["task=longbench", "task.prompt=fancy"], "task.prompt: Invalid value 'fancy'"),
    (["task=longbench", "task.bertscore_layers=0"], "task.bertscore_layers=0 must be >= 1"),
    (["compression=self_information", "compression.rate=0"], "compression.rate=0.0 must lie in (0, 1]"),
    (["compression=self_information", "compression.rate=1.5"], "compression.rate=1.5 must lie in (0, 1]"),
    (["compression=self_information", "compression.rate=half"], "compression.rate: Value 'half'"),
    (["compression=llmlingua", "compression.segment_tokens=0"], "compression.segment_tokens=0 must be a whole"),
    (["compression=llmlingua", "compression.model=nobody/missing"], "compression.model='nobody/missing' is neither"),
    (["compression=llmlingua2", "compression.model=nobody/missing"], "compression.model='nobody/missing' is neither"),
    (["compression=nosuch"], "Could not find 'compression/nosuch'"),
    (["method=memoryllm"], "backend=fast: method=memoryllm reads its memory with backend=hidden_prefix"),
    (["method=mplus_defrag", "backend=hidden_prefix"], "method mplus needs a checkpoint of model_type 'memoryllm'"),
    (["method=memoryllm", "method.defragment=maybe"], "method.defragment: Value 'maybe'"),
    (["compression=none", "compression.rate=0.5"], "compression.rate: Key 'rate' not in 'CompressionSchema'"),
    # a sweep: every job is checked before the first one starts
    (["-m", "method=vanilla,memdefrag", "model.tracer_layer=40"], "method.tracer_layer=40 is out of range: this "
     "model has 30 decoder layers, allowed 0..29 (job method=memdefrag model.tracer_layer=40"),
    (["-m", "method.k=1,0"], "method.k=0 is not allowed"),
    (["-m", "method=vanilla,nosuch"], "Could not find 'method/nosuch'"),
    (["experiment=main", "task.groups=ten"], "task.groups: Value 'ten'"),
]


@pytest.fixture
def no_work(monkeypatch):
    """Fails the test if any model weights load; records every job that starts."""
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("weights loaded"))
    started = []
    monkeypatch.setattr(cli, "run", lambda *a, **k: started.append(a))
    return started


def refused(argv, monkeypatch, capsys) -> str:
    """The one line `memdefrag argv` printed as it exited with status 2."""
    monkeypatch.setattr(sys, "argv", ["memdefrag", *argv])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    assert exit_.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("memdefrag: error: "), lines
    return lines[0]


@pytest.mark.parametrize("overrides, message", CASES, ids=[" ".join(o) for o, _ in CASES])
def test_bad_input_is_refused_with_one_line_before_any_work(overrides, message, tmp_path, monkeypatch, capsys,
                                                             no_work):
    where = [] if any(o.startswith("hydra.run.dir") for o in overrides) else \
        [f"hydra.run.dir={tmp_path / 'run'}", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    line = refused([*overrides, "logger=none", *where] if "logger=wandb" not in overrides else [*overrides, *where],
                   monkeypatch, capsys)
    assert message in line
    assert no_work == [] and not (tmp_path / "run").exists()


def test_a_longbench_item_without_answers_is_refused_before_weights_load(tmp_path, monkeypatch, capsys, no_work):
    folder = tmp_path / "longbench"
    folder.mkdir()
    (folder / "hotpotqa.jsonl").write_text('{"input": "Who?", "context": "Passage 1:\\nA.", "answers": []}\n')
    line = refused(["task=longbench", "task.dataset=longbench", "task.subsets=[hotpotqa]", f"task.data_dir={tmp_path}",
                    "logger=none", f"hydra.run.dir={tmp_path / 'run'}"], monkeypatch, capsys)
    assert f"{folder / 'hotpotqa'}: item 0 has no 'answers'" in line and no_work == []


def test_there_are_at_least_sixty_cases():
    assert len(CASES) >= 60


def test_resuming_into_a_folder_of_another_run_is_refused_before_weights_load(tmp_path, monkeypatch, capsys):
    from tests.test_config import composed
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "config.yaml").write_text(OmegaConf.to_yaml(composed("task.groups=3", "logger=none"), resolve=True))
    (folder / "groups.jsonl").write_text('{"group": 0, "seconds": 1.0}\n')
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("weights loaded"))
    line = refused(["task.groups=4", "logger=none", f"hydra.run.dir={folder}"], monkeypatch, capsys)
    assert f"{folder} holds a run with other settings (task)" in line


def test_a_checkpoint_that_ships_code_is_refused_unless_trusted(tmp_path, monkeypatch, capsys, no_work):
    folder = tmp_path / "remote"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "memdefrag_custom", "auto_map": {"AutoConfig": '
                                        '"configuration_custom.CustomConfig"}}')
    (folder / "configuration_custom.py").write_text("raise SystemExit('the checkpoint code ran')\n")
    line = refused(["model=hf", f"model.source={folder}", "method=vanilla", "logger=none",
                    f"hydra.run.dir={tmp_path / 'run'}"], monkeypatch, capsys)
    assert f"model.source='{folder}' runs code of its own: set model.trust_remote_code=true" in line


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_a_cuda_device_is_refused_where_there_is_none(tmp_path, monkeypatch, capsys, no_work):
    line = refused(["model.device=cuda", "logger=none", f"hydra.run.dir={tmp_path / 'run'}"], monkeypatch, capsys)
    assert "model.device='cuda': this machine has no CUDA device" in line
