# Everything runs from the project's own virtual environment in .venv/.

# Python may write its bytecode caches here, whatever the caller's environment says:
# with PYTHONDONTWRITEBYTECODE set (as on this project's CI machines) and packages
# installed by uv (which writes no .pyc), every process (each xdist worker, every
# server and CLI a test starts) compiled every module it imported, and pytest
# rewrote every test module, pass after pass. The caches are ignored by git.
unexport PYTHONDONTWRITEBYTECODE
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo

.PHONY: install install-redis install-postgres build test test-fast test-spark-3.11 test-arq check-pythons lint demo bench docs pipeline cluster-up cluster-down clean
# Pattern targets, always run when asked for: test-3.X, test-compiled-3.X,
# test-pure-3.X, dist-3.X, step-*.
.SECONDEXPANSION:
# None is a file to delete after use (make would take dist-3.X for one).
.SECONDARY:

# Everything, with the compiled core built in place (see build).
install: $(STAMP) install-redis install-postgres
	$(BUILD_EXT) $(PY) setup.py --quiet build_ext --inplace -j 2

# The packages are installed by uv (pip-installed into .venv first, so that the
# project's own files bring it): it resolves and downloads in parallel and installs
# in seconds where pip took minutes (docs/testing.md). The editable install itself is
# pure Python (AIOPURGATORY_NO_EXTENSIONS=1); the compiled core is built once after
# it, in place, both cores' modules at once (build_ext -j).
UV := $(BIN)/uv
$(UV):
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet uv

$(STAMP): pyproject.toml setup.py | $(UV)
	AIOPURGATORY_NO_EXTENSIONS=1 $(UV) pip install --quiet --python $(PY) -e '.[all,dev,docs]'
	touch $(STAMP)

# Every Python's build of the compiled core writes the same generated C files
# (aiopurgatory/*.c, Cython's output) before compiling them: one build at a time
# (flock on setup.py), so that passes of two Pythons running at once never compile
# a half-written file.
BUILD_EXT := flock setup.py

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

# Debian's postgresql (the server binaries in /usr/lib/postgresql/<version>/bin), which
# the tests of aiopurgatory.postgres run themselves (initdb in a temporary directory,
# as the postgres user when root); installed as redis-server is, else the command is
# printed. Its service is not started (no systemd here): the tests start their own.
install-postgres:
	@if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1; then :; \
	elif command -v apt-get >/dev/null 2>&1 && { [ "$$(id -u)" = 0 ] || sudo -n true 2>/dev/null; }; then \
		sudo_=""; [ "$$(id -u)" = 0 ] || sudo_="sudo -n"; \
		echo "installing postgresql (Debian package) for the PostgreSQL tests"; \
		$$sudo_ apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$sudo_ apt-get install -y -qq postgresql >/dev/null; \
	else \
		echo "PostgreSQL's server is missing and cannot be installed here: run" \
			"'sudo apt-get install -y postgresql' (the PostgreSQL tests fail without it)" >&2; \
	fi

# The compiled core (C extensions from the core's .py and .pxd files), rebuilt in
# place by install when a core module changed; without a C compiler it stays pure
# Python. Kept as the name the test targets and the docs use.
build: install

# The test passes (which tests each pass selects, and why: docs/pythons.md and
# docs/testing.md):
# - 3.11, compiled core: the whole suite (library, examples, broker, docs,
#   packaging), the Spark tests in a pass of their own (test-spark-3.11);
# - every Python in PYTHONS, each in its own venv .venv-X.Y: the library's tests
#   (`--library-only`), the packaging test among them, on the compiled core;
# - every Python, 3.11 too: the tests of what differs between the cores
#   (PURE_TESTS) on the pure-Python core.
# A Python of PYTHONS that is missing stops `make test` with a message saying how to
# get it (.ci/find-python); leave one out explicitly with `make test PYTHONS=`.
# By default `make test` (so CI) tests the oldest and the newest Python supported,
# 3.11 and 3.13: with 3.12 too, CI took 23 minutes on its 2 cores, over its
# 20-minute goal (docs/pythons.md, "What CI tests"). 3.12 runs with `make test-3.12`,
# or with the others: `make test PYTHONS="3.12 3.13"`.
# Each pass runs on XDIST pytest-xdist workers, but the Spark one; XDIST=0 runs in
# one process, PYTEST_ADDOPTS adds options.
PYTHONS ?= 3.13
XDIST ?= 2
# The extras the library's tests need on the other Pythons (no Spark, no examples).
LIB_EXTRAS := uvloop,trio,redis,prometheus,otel,bench,test
# What differs between the cores is the core itself (the wheel, the timer, operations,
# the purgatory, the histograms: the modules with a .pxd): its tests, and the tests
# driving it from a task of the library's own that is not the caller's: the Redis
# triggers' subscriber (single server: what a trigger does to parked operations), the
# exporters reading its histograms, the tracing hooked into it, the ASGI middleware
# withdrawing its operations.
# The Redis topologies (cluster, Sentinel, failover, routing, liveness) and the real
# web servers are the same Python code on either core: compiled passes only.
# So are the pytest plugin's tests (users' test files run by pytest in subprocesses:
# a third of a pure-Python pass's CPU): the plugin hands the virtual-time loop to
# pytest-asyncio, and the loop's behaviour on each core is tests/core's.
PURE_TESTS := tests/core tests/metrics tests/tracing tests/asgi/test_asgi.py \
	tests/redis/test_redis.py tests/redis/test_redis_watermarks.py \
	--ignore=tests/core/test_pytest_plugin.py
PYTEST_COMPILED := AIOPURGATORY_EXPECT=compiled
PYTEST_PURE := AIOPURGATORY_NO_EXTENSIONS=1 AIOPURGATORY_EXPECT=python
# No cache: passes running at once would write .pytest_cache together. The slowest
# tests of each pass end its output: where CI's time goes, in CI's log.
PYTEST_ARGS := -q -n $(XDIST) -p no:cacheprovider --durations=15

# Python X.Y's interpreter and the stamp of its venv: 3.11 is the project's .venv/.
python_of = $(if $(filter 3.11,$(1)),$(PY),.venv-$(1)/bin/python)
venv_of = $(if $(filter 3.11,$(1)),$(STAMP),.venv-$(1)/.installed)
# The pass of a Python's compiled core: 3.11 runs the whole suite but Spark, the others
# the library's tests. AIOPURGATORY_TEST_DIST: the packaging test checks and installs
# the very sdist and wheel the core was taken from (dist-X.Y) instead of building its own.
compiled_selection = $(if $(filter 3.11,$(1)),-m 'not spark',--library-only)
compiled_pass = AIOPURGATORY_TEST_DIST=$(CURDIR)/.dist/$(1) $(PYTEST_COMPILED) \
	$(call python_of,$(1)) -m pytest $(PYTEST_ARGS) $(call compiled_selection,$(1))
pure_pass = $(PYTEST_PURE) $(call python_of,$(1)) -m pytest $(PYTEST_ARGS) --library-only $(PURE_TESTS)
# The Spark tests in one process: they share one Spark session and one local
# cluster (session fixtures), which xdist workers would each start, and Spark's
# local[2] uses both cores itself.
spark_pass = $(PYTEST_COMPILED) $(PY) -m pytest -q -p no:cacheprovider --durations=15 -m spark

# `make test`: every pass, scheduled for a 2-core machine (docs/testing.md). The
# passes of the tests (real servers, real time) run one at a time, in the order of
# CHAIN, at normal priority. Beside them, at idle CPU priority (SCHED_IDLE: the
# kernel runs it only on a core nothing else wants, and a waking test preempts it
# at once), run the Spark pass (JVMs: CPU, no deadline tighter than minutes) and the
# builds of the other Pythons' venvs and compiled cores, which a chain step waits
# for when it comes to it. The passes leave a third of the machine idle while their
# servers and clients wait; that is what the background work uses.
IDLE := $(if $(shell chrt --idle 0 true 2>/dev/null && echo ok),chrt --idle 0,nice -n 19)
# Each Python's pure-Python pass first: it needs no compiled core, so that Python's
# build (3.11's too) goes on in the background meanwhile. The arq pass (its venv
# built in the background meanwhile too) comes before 3.11's compiled pass, whose
# build it gives another minute.
CHAIN := pure-3.11 arq compiled-3.11 $(foreach v,$(PYTHONS),pure-$(v) compiled-$(v))
# Each of a list's targets after the one before it (in `make test`'s schedule only).
after = $(if $(word 2,$(1)),$(eval $(word 2,$(1)): | $(word 1,$(1)))$(call \
	after,$(wordlist 2,$(words $(1)),$(1))))
ifdef SCHEDULE
$(call after,$(addprefix step-,$(CHAIN)))
$(call after,$(addprefix dist-,3.11 $(PYTHONS)))
endif

# CHECKS="docs lint": those targets too, in the background (CI: .ci/run), where they
# take cores the end of the Spark pass leaves idle rather than a minute after it.
CHECKS ?=
test: check-pythons install-redis install-postgres $(UV)
	$(MAKE) --no-print-directory -j 4 --output-sync=target SCHEDULE=1 BG="$(IDLE)" \
		step-spark step-$(lastword $(CHAIN)) $(addprefix step-,$(CHECKS))

# At idle priority a saturated machine can pause the pass for minutes: its tests'
# timeouts (pytest-timeout's, 300 s by default) guard against hangs, so longer here.
step-spark: dist-3.11
	$(IDLE) env $(spark_pass) -o timeout=1800
# After the last build: idle-priority work shares the idle cores, and the builds
# gate the compiled passes. The docs import the package, with 3.11's core in place.
LAST_DIST := dist-$(lastword 3.11 $(PYTHONS))
step-docs: dist-3.11 $(LAST_DIST)
	$(IDLE) $(MAKE) --no-print-directory docs
step-lint: $(LAST_DIST)
	$(IDLE) $(MAKE) --no-print-directory lint
step-compiled-%: dist-%
	$(call compiled_pass,$*)
step-pure-%: $$(call venv_of,$$*)
	$(call pure_pass,$*)

# Before minutes of tests: every Python of PYTHONS is there (or say which not).
check-pythons:
	@for v in $(PYTHONS); do .ci/find-python $$v >/dev/null || exit 1; done

# One Python alone, its passes one after another: `make test-3.13`, `make test-3.11`.
test-3.%: dist-3.%
	$(call compiled_pass,3.$*)
	$(if $(filter 11,$*),$(spark_pass))
	$(call pure_pass,3.$*)

test-compiled-%: dist-%
	$(call compiled_pass,$*)
test-spark-3.11: dist-3.11
	$(spark_pass)
test-pure-%: $$(call venv_of,$$*)
	$(call pure_pass,$*)

# arq 0.28 pins redis-py below 6, the project's venv has redis-py 8 (the redis extra).
# So aiopurgatory.jobs.arq, and aiopurgatory.redis on one server and behind Sentinel
# (what it supports on redis-py 5; a cluster needs 8), are tested under redis-py 5 in
# a venv of their own, .venv-arq (3.11, pure-Python core: `.[arq,...]`); the main
# venv's passes skip tests/jobs/test_arq.py (arq is not importable there).
ARQ_VENV := .venv-arq
ARQ_STAMP := $(ARQ_VENV)/.installed
ARQ_EXTRAS := arq,uvloop,trio,prometheus,otel,test
ARQ_TESTS := tests/jobs/test_arq.py tests/jobs/test_bench_jobs_arq.py tests/jobs/test_tracing_arq.py tests/redis/test_redis_compat.py \
	tests/redis/test_redis.py tests/redis/test_redis_watermarks.py tests/redis/test_redis_sync.py \
	tests/redis/test_redis_sync_outage.py tests/redis/test_redis_transport.py \
	tests/redis/test_redis_reads.py tests/redis/test_redis_link.py tests/redis/test_sentinel.py
arq_pass = $(PYTEST_PURE) $(ARQ_VENV)/bin/python -m pytest $(PYTEST_ARGS) $(ARQ_TESTS)
.PRECIOUS: $(ARQ_STAMP)
$(ARQ_STAMP): pyproject.toml setup.py | $(UV)
	@python=$$(.ci/find-python 3.11) && \
		{ test -x $(ARQ_VENV)/bin/python || $(BG) $(UV) venv --quiet --seed --python "$$python" $(ARQ_VENV); }
	AIOPURGATORY_NO_EXTENSIONS=1 $(BG) $(UV) pip install --quiet --python $(ARQ_VENV)/bin/python \
		-e '.[$(ARQ_EXTRAS)]'
	touch $@

# `make test-arq`: that pass alone; step-arq: in `make test`'s chain (after the rules
# above: a rule's prerequisites are expanded where it is read).
test-arq: install-redis $(ARQ_STAMP)
	$(arq_pass)
step-arq: $(ARQ_STAMP)
	$(arq_pass)

# The edit-and-rerun loop: 3.11, compiled core (built in place), neither slow nor
# packaging tests (with pytest's cache: PYTEST_ADDOPTS=--lf reruns the last failures).
test-fast: build
	$(PYTEST_COMPILED) $(PY) -m pytest -q -n $(XDIST) -m 'not slow and not packaging'

# A Python's compiled core for the test passes comes from the wheel that `python -m
# build` makes of this checkout with that Python: the packaging test checks and
# installs that very sdist and wheel (AIOPURGATORY_TEST_DIST) rather than building
# them again, so the core is compiled once per Python and pass. The wheel's modules
# go into the checkout beside the other Pythons' (each file's name says its Python).
# The build's log: .dist/3.X/build.log. BG: a command prefix, `make test`'s idle
# priority. -g0: no debug information (Python's own flags ask for it), a sixth of
# gcc's time on these files; gcc makes the same code with or without it. Passed in
# CPPFLAGS, which setuptools appends to Python's flags (CFLAGS would replace them,
# -O3 included).
dist-%: $$(call venv_of,$$*)
	rm -rf .dist/$* && mkdir -p .dist/$*
	CPPFLAGS=-g0 $(BG) $(BUILD_EXT) $(call python_of,$*) -m build --outdir .dist/$* . \
		>.dist/$*/build.log 2>&1 || { tail -40 .dist/$*/build.log; exit 1; }
	$(call python_of,$*) -c "$$TAKE_COMPILED" .dist/$*/aiopurgatory-*.whl

# The compiled modules of a wheel (argv[1]) into the checkout's aiopurgatory/, each
# replaced at once (a process importing the package meanwhile never reads half a file).
define TAKE_COMPILED
import os, sys, zipfile
wheel = zipfile.ZipFile(sys.argv[1])
names = [n for n in wheel.namelist() if n.startswith("aiopurgatory/") and n.endswith(".so")]
if not names:
    sys.exit(f"{sys.argv[1]} has no compiled module")
for name in names:
    with open(name + ".part", "wb") as part:
        part.write(wheel.read(name))
    os.replace(name + ".part", name)
endef
export TAKE_COMPILED

# uv from .venv makes these venvs too (--seed: with pip, which the packaging test's
# `python -m build` and venvs use).
.PRECIOUS: .venv-3.%/.installed
.venv-3.%/.installed: pyproject.toml setup.py | $(UV)
	@python=$$(.ci/find-python 3.$*) && echo "CPython 3.$*: $$python" && \
		{ test -x .venv-3.$*/bin/python || $(BG) $(UV) venv --quiet --seed --python "$$python" .venv-3.$*; }
	AIOPURGATORY_NO_EXTENSIONS=1 $(BG) $(UV) pip install --quiet --python .venv-3.$*/bin/python \
		-e '.[$(LIB_EXTRAS)]'
	touch $@

lint: $(STAMP)
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

docs: $(STAMP)
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
	rm -rf $(VENV) .venv-3.* $(ARQ_VENV) .dist docs/_build .pytest_cache .mypy_cache .ruff_cache build
	rm -f aiopurgatory/*.so aiopurgatory/*.c
