# Everything runs from the project's own virtual environment in .venv/.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
STAMP := $(VENV)/.installed

.PHONY: install test lint demo bench docs pipeline clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[all,dev,docs]'
	touch $(STAMP)

test: install
	$(PY) -m pytest -q

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

demo: install
	$(PY) -m examples.acks_all --scenario follower-crash

bench: install
	$(BIN)/aiopurgatory bench all

docs: install
	$(BIN)/sphinx-build -E -W --keep-going -b html docs docs/_build/html

pipeline: install
	$(PY) -m aiopurgatory.pipeline.demo

clean:
	rm -rf $(VENV) docs/_build .pytest_cache .mypy_cache .ruff_cache
