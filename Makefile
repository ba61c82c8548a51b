# Two commands for a newcomer: `make demo` and `make test`. Both start from nothing but
# Python. torch is pinned exactly: an unpinned torch makes pip download several GB.
PYTHON ?= python3
VENV := .venv
VENV214 := .venv-214
TORCH := torch==2.13.0
TORCH214 := torch==2.14.1
PIP_FLAGS := --quiet --disable-pip-version-check

.PHONY: demo test lint typecheck unit conformance venv venv214 clean

demo: $(VENV)/.stamp
	$(VENV)/bin/torchnext demo

test: $(VENV)/.dev-stamp $(VENV214)/.stamp
	$(MAKE) lint typecheck unit conformance

$(VENV)/.stamp: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install $(PIP_FLAGS) $(TORCH)
	$(VENV)/bin/pip install $(PIP_FLAGS) $(TORCH) -e '.[demo]'
	touch $@

$(VENV)/.dev-stamp: $(VENV)/.stamp pyproject.toml
	$(VENV)/bin/pip install $(PIP_FLAGS) $(TORCH) -e '.[dev,upgrade,gpu,demo]'
	touch $@

$(VENV214)/.stamp: pyproject.toml
	$(PYTHON) -m venv $(VENV214)
	$(VENV214)/bin/pip install $(PIP_FLAGS) $(TORCH214)
	$(VENV214)/bin/pip install $(PIP_FLAGS) $(TORCH214) -e '.[dev,upgrade]'
	touch $@

venv: $(VENV)/.dev-stamp
venv214: $(VENV214)/.stamp

lint: $(VENV)/.dev-stamp
	$(VENV)/bin/ruff check torchnext tests benchmarks examples
	$(VENV)/bin/ruff format --check torchnext tests benchmarks examples

typecheck: $(VENV)/.dev-stamp
	$(VENV)/bin/mypy

unit: $(VENV)/.dev-stamp
	$(VENV)/bin/python -m pytest tests --ignore=tests/conformance -m "not gpu" --durations=15

conformance: $(VENV214)/.stamp $(VENV)/.stamp
	TORCHNEXT_TORCH213_PYTHON=$(abspath $(VENV))/bin/python \
		$(VENV214)/bin/python -m pytest tests/conformance -m conformance

clean:
	rm -rf $(VENV) $(VENV214) .pytest_cache .mypy_cache .ruff_cache
