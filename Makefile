# Everything runs from the project's own virtual environment in .venv/.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
STAMP := $(VENV)/.installed

.PHONY: install build test lint demo bench docs pipeline cluster-up cluster-down clean

install: $(STAMP)

$(STAMP): pyproject.toml setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[all,dev,docs]'
	touch $(STAMP)

# The compiled core (C extensions from the core's .py and .pxd files), rebuilt in
# place when a core module changed; without a C compiler it stays pure Python.
build: install
	$(PY) setup.py --quiet build_ext --inplace

# The whole suite twice: on the compiled core, then on the pure-Python one.
test: build
	AIOPURGATORY_EXPECT=compiled $(PY) -m pytest -q
	AIOPURGATORY_NO_EXTENSIONS=1 AIOPURGATORY_EXPECT=python $(PY) -m pytest -q

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

# A standalone Spark cluster (a Master, two 1-core Workers) and a Spark Connect
# server on 127.0.0.1, from the installed pyspark; state and logs in .spark-cluster/.
cluster-up: install
	$(PY) -m aiopurgatory.pipeline.cluster up --dir .spark-cluster

cluster-down:
	$(PY) -m aiopurgatory.pipeline.cluster down --dir .spark-cluster

clean:
	rm -rf $(VENV) docs/_build .pytest_cache .mypy_cache .ruff_cache build
	rm -f aiopurgatory/*.so aiopurgatory/*.c
