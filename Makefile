# Everything runs from the project's own virtual environment in .venv/.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo

.PHONY: install install-redis build test lint demo bench docs pipeline cluster-up cluster-down clean

install: $(STAMP) install-redis

$(STAMP): pyproject.toml setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[all,dev,docs]'
	touch $(STAMP)

# Debian's redis-server, which the tests of aiopurgatory.redis start themselves (they
# fail, saying how to install it, when it is missing): installed when missing and the
# machine allows (root, or passwordless sudo, with apt-get), else the command is printed.
install-redis:
	@if command -v redis-server >/dev/null 2>&1 || test -x /usr/bin/redis-server; then :; \
	elif command -v apt-get >/dev/null 2>&1 && { [ "$$(id -u)" = 0 ] || sudo -n true 2>/dev/null; }; then \
		sudo_=""; [ "$$(id -u)" = 0 ] || sudo_="sudo -n"; \
		echo "installing redis-server (Debian package) for the Redis tests"; \
		$$sudo_ apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$sudo_ apt-get install -y -qq redis-server >/dev/null; \
	else \
		echo "redis-server is missing and cannot be installed here: run" \
			"'sudo apt-get install -y redis-server' (the Redis tests fail without it)" >&2; \
	fi

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

# The demo needs the package and rich only (the extra `demo`): installed with the
# pure-Python core (the same results; compiling the core takes minutes), in about
# half a minute rather than the minutes of `install`, whose full set (a venv that
# `install` filled and that is up to date) it takes as it is. `make test` and the
# other targets still install everything.
$(DEMO_STAMP): pyproject.toml setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	if [ $(STAMP) -nt pyproject.toml ] && [ $(STAMP) -nt setup.py ]; then :; else \
		AIOPURGATORY_NO_EXTENSIONS=1 $(PY) -m pip install --quiet -e '.[demo]'; fi
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
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
