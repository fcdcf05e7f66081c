"""Every bad input ends `memdefrag` with exit status 2 and one line naming the key and the value,
before any job runs or any model weights load (table-driven, through the real command in-process)."""

import json
import os
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM

from methods.sources import without_weights
from tests.conftest import refusal, refused, save_tiny_checkpoint

NQA_MISSING = "task.dataset=nqa"
CASES = [
    (["method=nonsense"], "Could not find 'method/nonsense'; method is one of ape, ape_sharp, cacheblend, epic,"),
    (["hydra/launcher=nonsense"], "hydra/launcher is one of basic, local, slurm, submitit_local, submitit_slurm"),
    (["task.grups=1"], "task.grups is not an option of Retention, which takes dataset, data_dir, groups, updates,"),
    (["thread=1"], "thread is not an option of Run, which takes model, method, task,"),
    (["~task"], "task: missing, a run needs a value"),
    (["hydra.run.dir="], "hydra.run.dir=: names no folder; give the folder the run writes into"),
    (["hydra/launcher=slurm"], "hydra/launcher=slurm launches a sweep's jobs: add -m (--multirun)"),
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
    (["memory_on=gpu"], "memory_on: Invalid value 'gpu', expected one of [model, host]"),
    (["compression=llmlingua2", "compression.model=/tmp"], "compression.model='/tmp' is a folder without config.json"),
    (["compression=llmlingua", "compression.model=/tmp"], "compression.model='/tmp' is a folder without config.json"),
    # found by tests/test_properties.py (each was a traceback)
    (["compression._target_=0"], "compression._target_='0' names no class this harness can import"),
    (["method._target_=abc"], "method._target_='abc' names no class this harness can import"),
    (["formation=joint"], "formation: Invalid value 'joint', expected one of [shared_sink, reference, own_bos, shared_prefix]"),
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
    (["method.kk=1"], "method.kk is not an option of MemDefrag, which takes k, tracer_layer,"),
    (["task.grups=3"], "task.grups is not an option of Retention, which takes dataset,"),
    (["model.nme=x"], "model.nme is not an option of Model, which takes name, source,"),
    (["foo=1"], "foo is not an option of Run, which takes model, method,"),
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
     "allowed the integers 0..29"),
    (["method.tracer_layer=-1"], "method.tracer_layer=-1 is out of range"),
    (["model.tracer_layer=30"], "method.tracer_layer=30 is out of range: this model has 30 decoder layers, allowed "
     "the integers 0..29 (method.tracer_layer is ${model.tracer_layer}: set model.tracer_layer)"),   # the key set
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
    (["forgetting=random_layerwise", "method=epic"], "method=epic recomputes memory tokens from their ids, which must "
     "be the same at every layer"),
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
    (["hydra.run.dir=/etc/hostname/run"], "output folder /etc/hostname/run: cannot be written (/etc/hostname is "
                                           "not a folder)"),
    (["task=longbench", "task.subsets=[nosuch]"], "task.subsets=['nosuch'] must name some of ['fictional_passages'"),
    (["task=longbench", "task.dataset=longbench", "task.subsets=[musique]", "task.data_dir=/nowhere"],
     "task.subsets: no data for 'musique' in /nowhere/longbench"),
    (["task=longbench", "task.dataset=longbench"], "task.subsets: no data for '2wikimqa'"),
    (["task=longbench", "task.dataset=hotpotqa"], "task.dataset: Invalid value 'hotpotqa', expected one of "
     "[synthetic, longbench]"),
    (["task=longbench", "task.chunk_tokens=0"], "task.chunk_tokens=0 must be an integer >= 1"),
    (["task=longbench", "task.groups=0"], "task.groups=0 must be an integer >= 1, or null"),
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
    (["method=mplus_defrag", "backend=hidden_prefix"], "error: method mplus needs a checkpoint of model_type "
     "'memoryllm'"),
    (["method=memoryllm", "method.defragment=maybe"], "method.defragment: Value 'maybe'"),
    (["compression=none", "compression.rate=0.5"],
     "compression.rate is not an option of Compression, which takes none (besides _target_ and label)"),
    # devices, device maps and every model a run names, checked before weights (whether or not the hub answers)
    (["model.device=meta"], "model.device='meta' is not a device this harness runs on: use auto, cpu, cuda"),
    (["model.device=mps"], "model.device='mps' is not a device this harness runs on"),
    (["model.device=xla"], "model.device='xla' is not a device this harness runs on"),
    (["model.device_map=bogus"], "model.device_map='bogus' is not allowed: use null, one of ['auto', 'balanced'"),
    (["model.device_map=meta"], "model.device_map='meta' is not allowed"),
    (["model.device_map=disk"], "model.device_map='disk' is not allowed"),
    (["model.gguf_file=other.gguf"], "model.gguf_file='other.gguf': model.source='smollm2' names its GGUF file "
                                     "already"),
    (["model.source=/etc/hostname"], "model.source='/etc/hostname' cannot be loaded: it is a file, not a model folder"),
    (["model.source=relative/missing"], "model.source='relative/missing' cannot be loaded: it is neither a folder here "
     "nor in the Hugging Face cache, and the hub cannot be reached"),
    (["task=longbench", "task.bertscore_model=nosuch"], "task.bertscore_model='nosuch' is neither a folder here"),
    (["task=longbench", "task.bertscore_model=/nonexistent"], "task.bertscore_model='/nonexistent' is neither"),
    (["task=longbench", "task.bertscore_layers=99"], "task.bertscore_layers=99 must be >= 1 and <= 6 (the layers of "
     "minilm)"),
    (["task=longbench", "task.bertscore_layers=-1"], "task.bertscore_layers=-1 must be >= 1"),
    (["task=longbench", "task.bertscore_rescale=true"], "task.bertscore_rescale=true needs bert-score's English "
     "baseline for task.bertscore_model='minilm', and it ships none"),
    (["task=longbench", "task.prompt=chat", "model=gemma3_270m"], "task.prompt=chat: prompt='chat' needs a tokenizer "
     "with a chat template"),
    (["compression=llmlingua2", "compression.model=/nonexistent"], "compression.model='/nonexistent' is neither a "
     "folder here nor in the Hugging Face cache"),
    (["compression=llmlingua", "compression.model=/nonexistent"], "compression.model='/nonexistent' is neither"),
    (["compression=llmlingua2", "compression.rate=0"], "compression.rate=0.0 must lie in (0, 1]"),
    (["compression=llmlingua2", "compression.rate=1.01"], "compression.rate=1.01 must lie in (0, 1]"),
    (["compression=llmlingua", "compression.rate=2"], "compression.rate=2.0 must lie in (0, 1]"),
    (["compression=self_information", "compression.rate=-0.1"], "compression.rate=-0.1 must lie in (0, 1]"),
    (["compression=llmlingua", "compression.segment_tokens=-5"], "compression.segment_tokens=-5 must be a whole"),
    # layers, positions and shards, against the model and the task
    (["task=probe", "task.layers=[99]"], "task.layers=[99] must be layer indices in 0..29 (this model has 30 "
     "decoder layers)"),
    (["task=probe", "task.layers=[]"], "task.layers=[] must be layer indices in 0..29"),
    (["task=probe", "task.layers=[-1]"], "task.layers=[-1] must be layer indices in 0..29"),
    (["task=probe", "task.layers=[a]"], "task.layers=['a'] must be 'all', 'band' or a list of layer indices"),
    (["task=probe", "task.layers=[1.5]"], "task.layers=[1.5] must be 'all', 'band' or a list"),
    (["task=probe", "task.layers=true"], "task.layers=True must be 'all', 'band' or a list"),
    (["model=gemma3_270m", "method.tracer_layer=18"], "method.tracer_layer=18 is out of range: this model has 18 "
     "decoder layers, allowed the integers 0..17"),
    (["method=memdefrag_top2", "method.tracer_layer=-5"], "method.tracer_layer=-5 is out of range"),
    (["max_new_tokens=100000"], "max_new_tokens=100000 must be smaller than the model's 8192 positions"),
    (["prompt=plain", "max_new_tokens=8192"], "max_new_tokens=8192 must be smaller than the model's 8192 positions"),
    (["forgetting=informativeness", "model.memory_capacity=12800"], "model.memory_capacity=12800: a full memory's "
     "read (sink 1 + 12800 + prompt 30 + answer budget 32 - 1) takes 12862 positions, 4670 past model smollm2's "
     "trained window of 8192: set model.memory_capacity<=8130, or allow_beyond_window=true to study reads beyond it"),
    (["forgetting=random", "prompt=plain", "max_new_tokens=400", "model.memory_capacity=7800"],
     "model.memory_capacity=7800: a full memory's read (sink 1 + 7800 + prompt 3 + answer budget 400 - 1) takes 8203 "
     "positions, 11 past model smollm2's trained window of 8192: set model.memory_capacity<=7789"),
    (["model=gemma3_270m", "forgetting=random", "model.memory_capacity=32768"], "model.memory_capacity=32768: a full "
     "memory's read (sink 1 + 32768 + prompt 3 + answer budget 32 - 1) takes 32803 positions, 35 past model "
     "gemma3_270m's trained window of 32768"),
    (["allow_beyond_window=maybe"], "allow_beyond_window: Value 'maybe' is not a valid bool"),
    (["task.groups=2", "shard=3/4"], "shard=3/4 selects none of the 2 groups: split them into at most 2 shards"),
    (["shard=0/0"], "shard='0/0' must be 'i/n' with 0 <= i < n"),
    (["shard=1/1"], "shard='1/1' must be 'i/n'"),
    (["shard=-1/2"], "shard='-1/2' must be 'i/n'"),
    # more values out of range
    (["method.k=1.5"], "method.k=1.5 is not allowed: use an integer >= 1 or 'all'"),
    (["method.k=true"], "method.k=True is not allowed"),
    (["formation=reference", "method.k=-2"], "method.k=-2 is not allowed"),
    (["method=memdefrag", "method.query_mode=both"], "method.query_mode: Invalid value 'both'"),
    # the selection axis (method=select)
    (["method=select", "method.ranker=tfidf"], "method.ranker: Invalid value 'tfidf', expected one of [density, bm25, "
     "dense, oracle, recency, random]"),
    (["method=select", "method.reading=both"], "method.reading: Invalid value 'both', expected one of [latent, text]"),
    (["method=select", "method.size=some"], "method.size: Invalid value 'some'"),
    (["method=select", "method.arrangement=spiral"], "method.arrangement: Invalid value 'spiral'"),
    (["method=select", "method.size=adaptive", "method.k_max=0"], "method.k_max=0 must be an integer >= 1"),
    (["method=select", "method.k_max=-1"], "method.k_max=-1 must be an integer >= 1"),
    (["method=select", "method.size=adaptive", "method.tau=1"], "method.tau=1.0 must be a finite number > 1"),
    (["method=select", "method.tau=0.5"], "method.tau=0.5 must be a finite number > 1"),
    (["method=select", "method.tau=x"], "method.tau: Value 'x'"),
    (["method=select", "method.k=0"], "method.k=0 must be an integer >= 1"),
    (["method=select", "method.arrangement=rotate", "method.window=0"], "method.window=0 must be an integer >= 1"),
    (["method=select", "method.ranker=oracle", "task=probe"], "task Probe marks none"),
    (["method=epic", "method.k=-1"], "method.k=-1 must be an integer >= 0"),
    (["method=epic", "method.k=1.5"], "method.k: Value '1.5'"),
    (["method=epic", "method.select=0"], "method.select=0 must be an integer >= 1"),
    (["method=epic_top2", "model.tracer_layer=40"], "method.tracer_layer=40 is out of range"),
    (["method=cacheblend", "method.ratio=1.5"], "method.ratio=1.5 must be a finite number in [0, 1] (the share of memory "
     "tokens recomputed after the check layer)"),
    (["method=cacheblend", "method.ratio=-0.1"], "method.ratio=-0.1 must be a finite number in [0, 1]"),
    (["method=cacheblend", "method.check_layer=30"], "method.check_layer=30 is not a layer of this model: it has 30 "
     "(0..29)"),
    (["method=cacheblend", "method.check_layer=-1"], "method.check_layer=-1 must be an integer >= 0"),
    (["method=cacheblend", "backend=hidden_prefix"], "backend=hidden_prefix: method=cacheblend reads its memory "
     "with backend=fast"),
    (["method=ape", "method.temperature=0"], "method.temperature=0.0 must be a finite number > 0"),
    (["method=ape", "method.scale=-1"], "method.scale=-1.0 must be a finite number > 0"),
    (["method=ape", "method.temperature=inf"], "method.temperature=inf: every number of a run must be finite"),
    (["method=ape", "method.scale=nan"], "method.scale=nan: every number of a run must be finite"),
    (["method=select", "method.size=adaptive", "method.tau=inf"], "method.tau=inf: every number of a run must be finite"),
    (["method=cacheblend", "method.ratio=-inf"], "method.ratio=-inf: every number of a run must be finite"),
    (["compression=self_information", "compression.rate=nan"], "compression.rate=nan: every number of a run must be finite"),
    (["method=ape", "backend=hidden_prefix"], "backend=hidden_prefix: method=ape reads its memory with backend=fast"),
    (["method=select", "method.ranker=density", "method.tracer_layer=30"], "method.tracer_layer=30 is out of range"),
    (["method=select", "method.ranker=dense", "method.embedder=/nowhere/model"],
     "method.embedder='/nowhere/model' is neither a folder here"),
    (["task.updates=-3"], "task.groups=20 and task.updates=-3 must both be >= 1"),
    (["task.groups=-1"], "task.groups=-1 and task.updates=20 must both be >= 1"),
    (["task.eval_steps=[1,99]"], "task.eval_steps=[1, 99] must lie in 1..task.updates=20"),
    (["task.max_context_tokens=0"], "offers 0 targets within 0 tokens"),
    (["task=probe", "task.fragments=0"], "task.fragments=0 must be >= 2"),
    (["task=probe", "task.positions=[21]"], "task.positions=[21] must lie in 1..task.fragments=20"),
    (["task=probe", "task.groups=0"], "task.groups=0 and task.updates=20 must both be >= 1"),
    (["task=distortion", "task.groups=0"], "task.groups=0 and task.updates=20 must both be >= 1"),
    (["task=distortion", "task.updates=0"], "task.groups=20 and task.updates=0 must both be >= 1"),
    (["task=distortion", "task.eval_steps=[0]"],
     "task.eval_steps is not an option of Distortion, which takes dataset,"),
    (["task=longbench", "task.max_tokens=0"], "task.max_tokens=0 must be an integer >= 1"),
    (["task=longbench", "task.overflow=truncate", "task.max_tokens=-1"],
     "task.max_tokens=-1 must be an integer >= 1"),
    (["task=longbench", "task.chunk_tokens=-1"], "task.chunk_tokens=-1 must be an integer >= 1"),
    (["task=longbench", "task.groups=-2"], "task.groups=-2 must be an integer >= 1, or null"),
    (["task=longbench", "task.subsets=[]"], "task.subsets=[] must name some of ['fictional_passages'"),
    (["task=longbench", "task.max_new_tokens=0"], "task.max_new_tokens=0 must be an integer >= 1, or null"),
    (["forgetting=random", "forgetting.capacity=-5"], "forgetting.capacity=-5 must be a positive integer"),
    (["forgetting=informativeness", "model.memory_capacity=-1"], "forgetting.capacity=-1 must be a positive integer"),
    (["threads=1.5"], "threads: Value '1.5'"),
    (["seed=1.5"], "seed: Value '1.5'"),
    (["model.dtype=fp16"], "model.dtype: Invalid value 'fp16', expected one of [float32, bfloat16, float16]"),
    (["model.prompt=other"], "model.prompt: Invalid value 'other', expected one of [chat, plain]"),
    (["logger=wandb", "logger.mode=disabledx"], "logger.mode: Invalid value 'disabledx'"),
    (["experiment=main", "method.k=0"], "method.k is not an option of Method, which takes none"),
    (["model=gemma3_270m", "task.layers=[1]"], "task.layers is not an option of Retention, which takes dataset,"),
    (["backend=hidden_prefix", "method=memoryllm_defrag"], "method memoryllm needs a checkpoint of model_type "
     "'memoryllm', got 'llama'"),
    (["task.dataset=squad", "task.data_dir=/etc/hostname"], "task.data_dir='/etc/hostname' has no folder squad/"),
    # a sweep: every job is checked before the first one starts
    (["-m", "method=vanilla,memdefrag", "model.tracer_layer=40"], "method.tracer_layer=40 is out of range: this "
     "model has 30 decoder layers, allowed the integers 0..29 (method.tracer_layer is ${model.tracer_layer}: set "
     "model.tracer_layer) (job method=memdefrag model.tracer_layer=40"),
    (["-m", "method.k=1,0"], "method.k=0 is not allowed"),
    (["-m", "method=vanilla,text", "method.label=mine"], "method.label='mine' names 2 method classes in this sweep "
     "(methods.baselines.TextMemory, methods.baselines.Vanilla), whose runs the tables would pool: give each its own "
     "label"),
    (["-m", "method=vanilla,nosuch"], "Could not find 'method/nosuch'"),
    (["experiment=main", "task.groups=ten"], "task.groups: Value 'ten'"),
    (["-m", "shard=0/2,1/2", "task.groups=1"], "shard=1/2 selects none of the 1 groups: split them into at most 1 "
     "shards (job shard=1/2"),
    (["-m", "method.k=1,x"], "method.k='x' is not allowed: use an integer >= 1 or 'all' (job method.k=x"),
    (["-m", "task.groups=1,0"], "task.groups=0 and task.updates=20 must both be >= 1 (job task.groups=0"),
    (["-m", "backend=fast,slow"], "backend: Invalid value 'slow'"),
    # a newcomer's plugins, each breaking its kind's contract in one way (tests/test_plugins.py)
    (["method=vanilla", "method._target_=tests.test_plugins.RecencyWindow"], "error: method RecencyWindow.plan(memory, "
     "prompt_ids, backend) cannot take the harness's call plan(memory, prompt_ids, backend, question)"),
    (["method=vanilla", "method._target_=tests.test_plugins.Budgeted"], "error: method.budget=0 must be >= 1"),
    (["method=vanilla", "method._target_=tests.test_plugins.GemmaOnly"], "error: method: it runs on gemma2 "
     "checkpoints only"),
    (["compression._target_=tests.test_plugins.Offline"], "error: compression: its service cannot be reached offline"),
    (["task._target_=tests.test_plugins.ShortWindow"], "error: task: this task needs a window of 1,000,000 positions"),
    (["task._target_=tests.test_plugins.Unnumbered"], "error: task: its group Group has index=None"),
    (["task._target_=tests.test_plugins.NoData"], "error: task: the passkey file is empty"),
    (["task._target_=tests.test_plugins.TextsOfAStep"], "error: task: its group Group needs `texts()`"),
    # counts the data cannot supply, and a memory the task stores that cannot fit the window (issue 55)
    (["task.updates=1000000000"], "task.groups=20 and task.updates=1000000000 need 20 and 999999999"),
    (["task=distortion", "task.updates=1000000000"], "task.updates=1000000000 need 20 and 999999999"),
    (["task=probe", "task.fragments=1000000000"], "task.groups=50 and task.fragments=1000000000 need 50 and 999999999"),
    (["task=probe"], "task Probe: group 39 stores 20 fragments of 10115 tokens in all, none forgotten: a full memory's "
     "read (sink 1 + 10115 + prompt 30 + answer budget 32 - 1) takes 10177 positions, 1985 past model smollm2's "
     "trained window of 8192: store fewer or shorter fragments"),
    # a window too short for one fragment beside the answer: no capacity is offered as a way out (it would be refused)
    (["max_new_tokens=8100"], "past model smollm2's trained window of 8192: no capacity fits, as a fragment of this "
     "task takes up to 137 tokens and the window leaves 62 for the memory: store shorter fragments, ask for a shorter "
     "answer (max_new_tokens), or use a model with a longer window, or allow_beyond_window=true"),
    # a boolean takes true or false, not a number OmegaConf would read as true
    (["task.shuffle=2"], "task.shuffle=2: task.shuffle is a boolean option, it takes true or false"),
    (["resume=2"], "resume=2: resume is a boolean option"),
    (["model.trust_remote_code=2"], "model.trust_remote_code=2: model.trust_remote_code is a boolean option"),
    (["task=locomo", "task.trace_layers=2"], "task.trace_layers=2: task.trace_layers is a boolean option"),
    (["-m", "task.shuffle=true,0"], "task.shuffle=0: task.shuffle is a boolean option"),
    (["--cfg", "job", "resume=2"], "resume=2: resume is a boolean option"),     # printed, it would read true
    # flags of Hydra's that run a config other than the one every job is checked against
    (["-m", "seed=0,1", "-cn", "config"], "-cn: memdefrag runs conf/config.yaml, every job checked before the "
     "first starts; choose what runs by overrides, or by experiment=<name> (conf/experiment/)"),
    (["--config-dir=/tmp", "method=none"], "--config-dir=/tmp: memdefrag runs conf/config.yaml"),
    (["-m", "model.device=cpu,meta"], "model.device='meta' is not a device this harness runs on: use auto, cpu, "
     "cuda or cuda:<index> (job model.device=meta"),
    (["-m", "method=vanilla,text", "hydra.sweep.subdir=${method.name}"], "hydra.sweep: Interpolation key "
     "'method.name' not found"),
    (["-m", "method=vanilla,text", "hydra.sweep.subdir=same"], "writes it too; name the sweep's folders by what "
     "tells its jobs apart (hydra.sweep.subdir, e.g. with ${hydra.job.num}) (job method=text"),
]


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


NQA_ITEM = {"context": "The Orin river floods every spring.", "question": "When does the Orin flood?",
            "answer": "every spring"}
DATA_CASES = {   # a data file with one fault -> what the one line says
    "empty answer": ([{**NQA_ITEM, "answer": ""}], ["a distractor"], "item 0 'answer' is empty"),
    "blank question": ([{**NQA_ITEM, "question": "  "}], ["a distractor"], "item 0 'question' is empty"),
    "empty context": ([{**NQA_ITEM, "context": ""}], ["a distractor"], "item 0 'context' is empty"),
    "empty distractor": ([NQA_ITEM], ["a distractor", "\n"], "entry 1 is empty: every distractor context must be"),
    "answer not a string": ([{**NQA_ITEM, "answer": 3}], ["a distractor"], "item 0 'answer' is int, not a string"),
    "distractor not a string": ([NQA_ITEM], [{"text": "x"}], "entry 0 is dict, not a string"),
    "no items": ([], ["a distractor"], "must hold a non-empty JSON list"),
    "a lone surrogate in a question": ([{**NQA_ITEM, "question": "where\ud800?"}], ["a distractor"],
                                       "item 0 'question' is no valid text (a lone surrogate '\\ud800' at character "
                                       "5)"),
    "a lone surrogate in a distractor": ([NQA_ITEM], ["a \udfff distractor"], "entry 0 is no valid text"),
    "a JSON nested past the parser": ("[" * 100_000, ["a distractor"], "val_data.json: its JSON nests deeper"),
}


@pytest.mark.parametrize("case", sorted(DATA_CASES))
def test_a_data_file_with_a_bad_value_is_refused_naming_the_file_and_item(case, tmp_path, monkeypatch, capsys,
                                                                          no_work):
    targets, unrelated, message = DATA_CASES[case]
    folder = tmp_path / "data" / "nqa"
    folder.mkdir(parents=True)
    (folder / "val_data.json").write_text(targets if isinstance(targets, str) else json.dumps(targets))
    (folder / "unrelated_contexts_from_train.json").write_text(json.dumps(unrelated))
    line = refused(["task.dataset=nqa", f"task.data_dir={tmp_path / 'data'}", "logger=none",
                    f"hydra.run.dir={tmp_path / 'run'}"], monkeypatch, capsys)
    assert str(folder) in line and message in line and no_work == []


ENV_CASES = {   # environment variable -> (its value: a path under tmp or as given, file content, message)
    "MEMDEFRAG_TRACERS missing": ("MEMDEFRAG_TRACERS", "{tmp}/tracer.yaml", None,
                                  "MEMDEFRAG_TRACERS='{tmp}/tracer.yaml': no such file"),
    "MEMDEFRAG_TRACERS malformed": ("MEMDEFRAG_TRACERS", "{tmp}/tracers.yaml", "smollm2: [tracer_layer: 3",
                                    "MEMDEFRAG_TRACERS='{tmp}/tracers.yaml': not readable YAML"),
    "MEMDEFRAG_TRACERS not a table": ("MEMDEFRAG_TRACERS", "{tmp}/tracers.yaml", "- 18\n- mean\n",
                                      "MEMDEFRAG_TRACERS='{tmp}/tracers.yaml': must map model names"),
    "MEMDEFRAG_CACHE a file": ("MEMDEFRAG_CACHE", "{tmp}/cache", "not a folder",
                               "MEMDEFRAG_CACHE='{tmp}/cache' cannot be used as the cache"),
    "MEMDEFRAG_DATA missing": ("MEMDEFRAG_DATA", "{tmp}/nowhere", None, "task.data_dir='{tmp}/nowhere' has no folder "
                                                                          "nqa/"),
}


@pytest.mark.parametrize("case", sorted(ENV_CASES))
def test_a_bad_environment_variable_is_named_in_one_line(case, tmp_path, monkeypatch, capsys, no_work):
    name, value, content, message = (part.replace("{tmp}", str(tmp_path)) if isinstance(part, str) else part
                                     for part in ENV_CASES[case])
    if content is not None:
        Path(value).write_text(content)
    monkeypatch.setenv(name, value)
    line = refused(["task.dataset=nqa", "logger=none", f"hydra.run.dir={tmp_path / 'run'}"]
                   if name == "MEMDEFRAG_DATA" else ["logger=none", f"hydra.run.dir={tmp_path / 'run'}"],
                   monkeypatch, capsys)
    assert message in line and no_work == []


COMMAND_CASES = {   # the other commands: argv -> what the one line says ({tmp}: a fresh folder)
    "report of a folder without runs": (["memdefrag", "report", "{tmp}"], "holds no run with an answer (a folder with "
                                                                          "config.yaml and a record in predictions."
                                                                          "jsonl): nothing to report"),
    "report of no folder": (["memdefrag", "report", "{tmp}/nowhere"], "no such folder"),
    "report of two folders": (["memdefrag", "report", "{tmp}", "{tmp}"], "unrecognized arguments"),
    "report of an empty path": (["memdefrag", "report", ""], "an empty argument: give a value"),
    "compare of a blank path": (["memdefrag", "compare", "{tmp}", "  "], "an empty argument: give a value"),
    "bench into an empty --out": (["memdefrag-bench", "--out", ""], "an empty argument for --out: give a value"),
    "bench saving into --save-random=": (["memdefrag-bench", "--shape", "tiny", "--save-random="],
                                         "an empty argument for --save-random"),
    "merge of a folder without shards": (["memdefrag", "merge", "{tmp}"], "holds no sharded runs"),
    "merge of no folder": (["memdefrag", "merge", "{tmp}/nowhere"], "no such folder"),
    "a misspelt subcommand": (["memdefrag", "reprot", "results"], "'reprot' is neither a subcommand (report, "
                                                                  "plugins, compare, migrate, collect, merge, cache, "
                                                                  "tracer-sweep) nor an override (KEY=VALUE"),
    "merge without a folder": (["memdefrag", "merge"], "the following arguments are required: folders"),
    "tracer-sweep of a layer by name": (["memdefrag", "tracer-sweep", "task.layers=[a]"],
                                        "task.layers=['a'] must be 'all', 'band' or a list"),
    "tracer-sweep past the last layer": (["memdefrag", "tracer-sweep", "task.layers=[99]"],
                                         "task.layers=[99] must be layer indices in 0..29"),
    "tracer-sweep of no layer": (["memdefrag", "tracer-sweep", "task.layers=[]"], "task.layers=[] must be layer"),
    "tracer-sweep of a negative layer": (["memdefrag", "tracer-sweep", "task.layers=[-1]"],
                                         "task.layers=[-1] must be layer indices"),
    "tracer-sweep by an unknown criterion": (["memdefrag", "tracer-sweep", "task.select_by=top9"],
                                             "task.select_by='top9' must be one of ['mean_rank', 'top1', "),
    "bench of more groups than the data holds": (["memdefrag-bench", "--data-dir", "{tmp}/nowhere", "--sizes", "5"],
                                                 "has no folder nqa/"),
    "bench of a huge memory": (["memdefrag-bench", "--dataset", "synthetic", "--sizes", "100000"],
                               "--sizes 100000 need"),
    "bench of an unknown dataset": (["memdefrag-bench", "--dataset", "foo"], "--dataset 'foo' is not one of"),
    "bench of a data folder without the set": (["memdefrag-bench", "--data-dir", "{tmp}/nowhere"],
                                               "--data-dir '{tmp}/nowhere' has no folder nqa/"),
    "bench into a missing folder": (["memdefrag-bench", "--out", "{tmp}/no/dir/x.md"], "--out {tmp}/no/dir/x.md: "
                                                                                       "cannot be written"),
    "bench into a folder": (["memdefrag-bench", "--out", "{tmp}"], "--out {tmp}: is a folder"),
    "bench on no threads": (["memdefrag-bench", "--threads", "0"], "--threads 0: must be >= 1"),
    "bench on the meta device": (["memdefrag-bench", "--device", "meta"], "--device='meta' is not a device this "
                                                                          "harness runs on"),
    "bench of an unknown shape": (["memdefrag-bench", "--shape", "nosuch"], "argument --shape: invalid choice"),
    "bench of sizes by name": (["memdefrag-bench", "--sizes", "x"], "argument --sizes: invalid int value: 'x'"),
    "bench of an unknown method": (["memdefrag-bench", "--methods", "nosuch"], "argument --methods: invalid choice"),
    "bench of a random model without a shape": (["memdefrag-bench", "--save-random", "{tmp}/x"],
                                                "--save-random needs --shape"),
    "bench with a tokenizer folder holding none": (["memdefrag-bench", "--shape", "tiny", "--tokenizer", "{tmp}"],
                                                   "--tokenizer {tmp}: no tokenizer can be loaded from it"),
    "bench with a tokenizer that is no folder": (["memdefrag-bench", "--shape", "tiny", "--tokenizer",
                                                  "{tmp}/nowhere"], "--tokenizer {tmp}/nowhere: not a folder"),
    "bench with a tokenizer for the embedded model": (["memdefrag-bench", "--tokenizer", "{tmp}"],
                                                      "--tokenizer {tmp}: needs --shape"),
    "bench saving under a file": (["memdefrag-bench", "--shape", "tiny", "--save-random", "{tmp}/f/sub"],
                                  "--save-random {tmp}/f/sub: cannot be written ({tmp}/f is not a folder)"),
    "bench saving into a read-only folder": (["memdefrag-bench", "--shape", "tiny", "--save-random", "{tmp}/ro/rnd"],
                                             "--save-random {tmp}/ro/rnd: cannot be written ({tmp}/ro is a folder "
                                             "this user may not write)"),
    "bench saving over a folder": (["memdefrag-bench", "--shape", "tiny", "--save-random", "{tmp}/ro"],
                                   "--save-random {tmp}/ro: exists already"),
    "bench saving over a link": (["memdefrag-bench", "--shape", "tiny", "--save-random", "{tmp}/link"],
                                 "--save-random {tmp}/link: exists already"),
    "compare writing its JSON into a read-only folder": (["memdefrag", "compare", "{tmp}/runs", "{tmp}/runs",
                                                          "--json", "{tmp}/ro/d.json"],
                                                         "--json {tmp}/ro/d.json: cannot be written"),
    "compare writing Markdown over a folder": (["memdefrag", "compare", "{tmp}/runs", "{tmp}/runs", "--markdown",
                                                "{tmp}/ro"], "--markdown {tmp}/ro: is a folder"),
    "migrate a folder holding no run": (["memdefrag", "migrate", "{tmp}/ro"],
                                        "{tmp}/ro holds no run folder (a folder with predictions.jsonl): nothing to "
                                        "migrate"),
    "collect into a read-only folder": (["memdefrag", "collect", "{tmp}/runs", "study", "--into", "{tmp}/ro"],
                                        "--into {tmp}/ro: cannot be written"),
    "collect into a file": (["memdefrag", "collect", "{tmp}/runs", "study", "--into", "{tmp}/f"],
                            "--into {tmp}/f: cannot be written ({tmp}/f is not a folder)"),
    "collect a study climbing out": (["memdefrag", "collect", "{tmp}/runs", "../../escaped", "--into", "{tmp}/res"],
                                     "study ../../escaped: must stay inside {tmp}/res"),
    "collect a study at an absolute path": (["memdefrag", "collect", "{tmp}/runs", "/abs/study", "--into",
                                             "{tmp}/res"], "study /abs/study: must stay inside {tmp}/res"),
}


@pytest.mark.parametrize("case", sorted(COMMAND_CASES))
def test_the_other_commands_refuse_bad_input_in_one_line_before_any_work(case, tmp_path, monkeypatch, capsys,
                                                                         no_work):
    from harness.measurement import benchmark

    argv, message = ([a.replace("{tmp}", str(tmp_path)) for a in COMMAND_CASES[case][0]],
                     COMMAND_CASES[case][1].replace("{tmp}", str(tmp_path)))
    if "read-only" in case and os.geteuid() == 0:
        pytest.skip("root may write a read-only folder")
    (tmp_path / "f").write_text("a file")
    (tmp_path / "ro").mkdir(mode=0o555)
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    if "{tmp}/runs" in COMMAND_CASES[case][0]:                 # a run for compare and collect to read
        run = tmp_path / "runs" / "vanilla"
        run.mkdir(parents=True)
        (run / "config.yaml").write_text("method: {label: vanilla}\nmodel: {name: tiny}\n"
                                         "task: {_target_: evals.retention.Retention, dataset: synthetic}\n")
        (run / "predictions.jsonl").write_text('{"group": 0, "step": 1, "correct": true}\n')
    before = sorted(p for p in tmp_path.rglob("*"))
    monkeypatch.setattr(benchmark, "build", lambda *a: pytest.fail("the benchmark loaded a model"))
    lines = refusal(argv, monkeypatch, capsys).strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    assert no_work == [] and sorted(p for p in tmp_path.rglob("*")) == before  # nothing written


def test_there_are_at_least_150_cases():
    assert len(CASES) + len(DATA_CASES) + len(ENV_CASES) + len(COMMAND_CASES) >= 150


@pytest.mark.parametrize("sweep", [False, True])
def test_resuming_into_a_folder_of_another_run_is_refused_before_weights_load(tmp_path, monkeypatch, capsys, sweep):
    """Refused before Hydra writes the folder's .hydra/ (which says what command made the results), a sweep's
    job before any job runs."""
    from tests.test_config import composed
    folder = tmp_path / ("vanilla_unbounded_synthetic" if sweep else "run")
    folder.mkdir()
    (folder / "config.yaml").write_text(OmegaConf.to_yaml(composed("task.groups=3", "logger=none", "method=vanilla"),
                                                          resolve=True))
    (folder / "groups.jsonl").write_text('{"group": 0, "seconds": 1.0}\n')
    (folder / ".hydra").mkdir()
    (folder / ".hydra" / "overrides.yaml").write_text("- task.groups=3\n")
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("weights loaded"))
    given = (["-m", "method=none,vanilla", f"hydra.sweep.dir={tmp_path}"] if sweep     # the second job's folder
             else ["method=vanilla", f"hydra.run.dir={folder}"])
    line = refused(["task.groups=4", "logger=none", *given], monkeypatch, capsys)
    assert f"{folder} holds a run with other settings (task.groups)" in line
    assert (folder / ".hydra" / "overrides.yaml").read_text() == "- task.groups=3\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [folder.name]                 # no job ran


def test_a_checkpoint_that_ships_code_is_refused_unless_trusted(tmp_path, monkeypatch, capsys, no_work):
    folder = tmp_path / "remote"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "memdefrag_custom", "auto_map": {"AutoConfig": '
                                        '"configuration_custom.CustomConfig"}}')
    (folder / "configuration_custom.py").write_text("raise SystemExit('the checkpoint code ran')\n")
    line = refused(["model=hf", f"model.source={folder}", "method=vanilla", "logger=none",
                    f"hydra.run.dir={tmp_path / 'run'}"], monkeypatch, capsys)
    assert f"model.source='{folder}' runs code of its own: set model.trust_remote_code=true" in line


@pytest.mark.parametrize("damage, said", [("cut", "model.safetensors, {cut:,} bytes where its header's tensors take"),
                                          ("garbage", "model.safetensors, which cannot be read as a safetensors file"),
                                          ("shard", "model.safetensors.index.json, which names shards the folder "
                                                    "lacks: model-00002-of-00002.safetensors"),
                                          ("dangling", "model.safetensors, which cannot be read as a safetensors "
                                                       "file")])
def test_a_checkpoint_with_a_damaged_weights_file_is_refused_before_weights_load(damage, said, tmp_path, monkeypatch,
                                                                                capsys, no_work):
    folder = Path(save_tiny_checkpoint(tmp_path / "ckpt"))
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    if damage == "shard":              # an index naming a second shard the copy left out
        index = {"weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors",
                                "model.norm.weight": "model.safetensors"}}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    elif damage == "dangling":         # a snapshot copied without the blob its link points at
        weights.unlink()
        weights.symlink_to(tmp_path / "blobs" / "gone")
    else:
        weights.write_bytes(data[: len(data) // 2] if damage == "cut" else b"not safetensors at all")
    capsys.readouterr()                                            # the save's progress bars
    line = refused(["model=hf", f"model.source={folder}", "logger=none", f"hydra.run.dir={tmp_path / 'run'}"],
                   monkeypatch, capsys)
    assert f"model.source='{folder}' cannot be loaded: it holds {said.format(cut=len(data) // 2)}" in line


def test_a_checkpoint_with_safetensors_beside_another_format_s_partial_index_is_not_refused(tmp_path):
    """A download of a repo shipping both formats, taken as safetensors only, keeps the .bin index naming
    shards it left out: transformers reads the safetensors, so the folder is whole."""
    folder = Path(save_tiny_checkpoint(tmp_path / "ckpt"))
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": {"a": "pytorch_model-1.bin"}}))
    assert without_weights(str(folder)) is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_a_cuda_device_is_refused_where_there_is_none(tmp_path, monkeypatch, capsys, no_work):
    line = refused(["model.device=cuda", "logger=none", f"hydra.run.dir={tmp_path / 'run'}"], monkeypatch, capsys)
    assert "model.device='cuda': this machine has no CUDA device" in line


def test_a_full_disk_is_one_line_before_hydra_writes(tmp_path, monkeypatch, capsys, no_work):
    import shutil as shutil_module
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil_module, "disk_usage", lambda path: usage(10, 10, 0))
    line = refused(["logger=none", f"hydra.run.dir={tmp_path / 'run'}"], monkeypatch, capsys)
    assert f"output folder {tmp_path / 'run'}: cannot be written ({tmp_path} has 0 bytes free): make room" in line
    assert no_work == [] and not (tmp_path / "run").exists()


@pytest.mark.parametrize("argv, message", [
    (["--model", "hf"], "--model hf: MissingMandatoryValue while resolving interpolation: Missing mandatory "
                        "value: model.source (--model names a file in conf/model/; --model hf takes its weights "
                        "from --source)"),
    (["--model", "nosuch"], "--model nosuch: In 'config': Could not find 'model/nosuch'"),
    (["--model", "hf", "--source", "{tmp}/nowhere"], "model.source='{tmp}/nowhere' cannot be loaded: it is neither"),
])
def test_the_self_check_command_refuses_bad_input_in_one_line_before_weights_load(argv, message, tmp_path,
                                                                                  monkeypatch, capsys):
    """`python -m harness.models.selfcheck`, its __main__ run as is (runpy): a model file it lacks or a source it
    cannot load ends in one line, exit status 2."""
    import runpy
    import sys

    monkeypatch.setattr(sys, "argv", ["selfcheck", *(a.replace("{tmp}", str(tmp_path)) for a in argv)])
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("weights loaded"))
    with pytest.raises(SystemExit) as exit_:
        runpy.run_module("harness.models.selfcheck", run_name="__main__", alter_sys=True)
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(lines) == 1 and message.replace("{tmp}", str(tmp_path)) in lines[0], lines
