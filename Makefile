# One-command set-up: every target installs what it needs (idempotently), then runs.
PYTHON ?= python3
PIP := $(PYTHON) -m pip
TORCH_CPU := torch==2.13.0
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: help install lint test docs demo bench bench-smoke

help:
	@echo "make demo    install, then train the tiny model on CPU, offline (configs/debug/tiny.yaml)"
	@echo "make test    install, then run ruff, the docs build and the whole test suite"
	@echo "make docs    build the documentation site (strict)"
	@echo "make bench   run the benchmark harness (see docs/benchmarks.md)"

# Keep an installed torch (CUDA or CPU); install the CPU wheel only where none exists.
install:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PIP) install -q $(TORCH_CPU)
	@$(PIP) install -q -e ".[dev]"

lint: install
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .

docs: install
	NO_MKDOCS_2_WARNING=1 $(PYTHON) -m mkdocs build --strict --site-dir build/site

# The learning tests run twice: natively, then with torch's portable kernels (ATEN_CPU_CAPABILITY=default) and a fresh
# warm-up cache, as a machine with another CPU would run them (docs/benchmarks.md, "Learning").
test: lint docs
	$(PYTHON) -m pytest -q
	rm -rf build/learning-cache
	ATEN_CPU_CAPABILITY=default LIGHTNING_GRPO_CACHE=build/learning-cache $(PYTHON) -m pytest -q -m learning -p no:cacheprovider

demo: install
	@$(PIP) install -q -e ".[plot]"
	$(PYTHON) -m lightning_grpo demo

bench: install
	@$(PIP) install -q -e ".[bench]"
	$(PYTHON) -m benchmarks.run $(BENCH_ARGS)
