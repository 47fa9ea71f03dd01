# `make demo` and `make test` each do the whole set-up on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.reverie-installed

# Quiet, offline-safe defaults for every command run from here.
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export PREFECT_SERVER_ANALYTICS_ENABLED := false

.PHONY: setup demo check test test-sqlite test-postgres docs server chromium postgres clean

setup: $(STAMP)

# torch goes first and pinned: that release is a CPU build; anything that pulls
# torch unpinned would download a multi-GB CUDA build instead.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/reverie demo

# The local stack: Prefect server + work pool + deployments + worker, UI on :4200.
# It serves the configured store, made first if there is none (init says so): serve
# itself never creates one, so that a mistyped REVERIE_DATABASE_URL fails, naming it.
server: $(STAMP)
	$(BIN)/reverie init
	$(BIN)/reverie serve

# The UI check drives Debian's chromium headless (a test tool's own browser download
# cannot work here); install it when missing.
CHROMIUM := $(shell command -v chromium 2>/dev/null)
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

chromium:
ifeq ($(CHROMIUM),)
	$(SUDO) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium
endif

# The whole suite runs on SQLite, in two processes, tests that share a module's server
# kept on one (tests/legs.py), the longest work handed out first; on a real PostgreSQL,
# also in two processes, the tests that reach the store (tests/legs.py), noting the
# calls of the store's code: that leg fails naming any repository function no test called.
# `make test` runs the two legs side by side: much of the suite waits on Prefect
# servers, workers and automations rather than computing, so four processes on two
# cores finish sooner than two legs in turn. Side by side, the legs share the tests that
# reach no store (REVERIE_TEST_SHARED): each runs once, on the leg that comes to it
# first, so the legs end together. The SQLite leg prints as it goes; the
# PostgreSQL leg's output waits in $(TEST_LOGS)/postgres.log and is printed after it,
# whole. Either leg failing fails `make test`. `make test-sqlite` or
# `make test-postgres` runs one leg. In `make test` the SQLite leg's Prefect stacks also
# keep Prefect's own database on the PostgreSQL server (as the README advises under
# load): its SQLite stayed locked for minutes there and lost a triggered run.
TEST_POSTGRES ?= postgresql+psycopg2://reverie:reverie@127.0.0.1:5432/postgres
TEST_WORKERS ?= 2
TEST_LOGS := .reverie/test-logs
# Each leg's every test time goes to a JUnit file beside the logs: where the suite's time
# goes, beyond the slowest few it prints.
PYTEST := $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup
SQLITE_LEG := $(PYTEST) --junitxml=$(TEST_LOGS)/sqlite.xml
POSTGRES_LEG := REVERIE_TEST_POSTGRES=$(TEST_POSTGRES) REVERIE_TEST_STORE_COVERAGE=1 \
	$(PYTEST) --junitxml=$(TEST_LOGS)/postgres.xml

postgres:
	./.ci/postgres

# ruff, the layer contracts (import-linter, in pyproject) and mypy, cheapest first: a
# violation fails here in seconds, before the suite starts. mypy runs where `reverie` is a
# link to this root (the root is the package; see [tool.mypy] in pyproject).
TYPECHECK := $(VENV)/typecheck

check: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	mkdir -p $(TYPECHECK) && ln -sfn $(CURDIR) $(TYPECHECK)/reverie
	cd $(TYPECHECK) && $(CURDIR)/$(BIN)/mypy --config-file $(CURDIR)/pyproject.toml -p reverie

test: check chromium postgres
	rm -rf $(TEST_LOGS)/shared && mkdir -p $(TEST_LOGS)/shared
	@start=$$(date +%s); export REVERIE_TEST_SHARED=$(CURDIR)/$(TEST_LOGS)/shared; \
	$(POSTGRES_LEG) > $(TEST_LOGS)/postgres.log 2>&1 & postgres_leg=$$!; \
	trap 'kill $$postgres_leg 2>/dev/null' INT TERM; \
	REVERIE_TEST_PREFECT_POSTGRES=$(TEST_POSTGRES) $(SQLITE_LEG); sqlite=$$?; \
	sqlite_end=$$(date +%s); \
	wait $$postgres_leg; postgres=$$?; \
	echo "=== PostgreSQL leg, run beside the SQLite leg ($(TEST_LOGS)/postgres.log) ==="; \
	cat $(TEST_LOGS)/postgres.log; \
	echo "SQLite leg: exit $$sqlite, $$((sqlite_end - start)) s; PostgreSQL leg: exit $$postgres;" \
	     "both: $$(($$(date +%s) - start)) s"; \
	[ $$sqlite -eq 0 ] && [ $$postgres -eq 0 ]

test-sqlite: check chromium
	$(SQLITE_LEG)

test-postgres: check postgres
	$(POSTGRES_LEG)

# The README's tables of commands, settings and config knobs, and BENCHMARKS.md, are generated from
# the code and from the benches' committed JSON, all by one command (`--check` changes nothing and
# fails on drift, as tests/test_docs.py and tests/test_benchmarks_report.py do).
docs: $(STAMP)
	$(BIN)/python -m reverie.deployments.docs

clean:
	rm -rf $(VENV) .reverie
