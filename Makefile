# One-command set-up: every target installs what it needs (idempotently), then runs.
PYTHON ?= python3
PIP := $(PYTHON) -m pip
TORCH_CPU := torch==2.13.0
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install test lint demo help

help:
	@echo "make demo   install, then run the offline CPU demo (configs/debug/tiny.yaml)"
	@echo "make test   install, then run ruff and the whole test suite"

# Keep an installed torch (CUDA or CPU); install the CPU wheel only where none exists.
install:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PIP) install -q $(TORCH_CPU)
	@$(PIP) install -q -e ".[dev]"

lint: install
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .

test: lint
	$(PYTHON) -m pytest -q

demo: install
	@echo "demo not available yet"
