# `make demo` and `make test` each do the whole set-up on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.reverie-installed

# Quiet, offline-safe defaults for every command run from here.
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export PREFECT_SERVER_ANALYTICS_ENABLED := false

.PHONY: setup demo check test docs server chromium postgres clean

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

# The whole suite runs on SQLite (the default), in two processes, tests that share a
# module's server kept on one (tests/legs.py); then on a real
# PostgreSQL, also in two processes, the tests that reach the store (tests/legs.py),
# tracing the store's code: the leg fails naming any repository function no test ran.
TEST_POSTGRES ?= postgresql+psycopg2://reverie:reverie@127.0.0.1:5432/postgres
TEST_WORKERS ?= 2

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
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup
	REVERIE_TEST_POSTGRES=$(TEST_POSTGRES) REVERIE_TEST_STORE_COVERAGE=1 $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup

# The README's tables of settings and config knobs, and BENCHMARKS.md, are generated from
# the code and from the benches' committed JSON; tests/test_docs.py fails when they drift.
docs: $(STAMP)
	$(BIN)/python -m reverie.deployments.docs
	$(BIN)/python -m reverie.benchmarks.report

clean:
	rm -rf $(VENV) .reverie
