# dpsql: `make demo` runs the main job on the example data; `make test` runs lint, types and tests.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo demo-spark test lint types pytest psql java bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

examples/data/visits.parquet: examples/make_data.py | $(STAMP)
	$(BIN)/python examples/make_data.py

# The durable example's ledger, created once by the owner command (no other command creates a
# ledger: a new ledger is a fresh budget).
examples/data/visits.ledger: | $(STAMP) examples/data/visits.parquet
	$(BIN)/dpsql --policy examples/durable.toml init

demo: $(STAMP) examples/data/visits.parquet examples/data/visits.ledger
	$(BIN)/python examples/demo.py
	@echo "next: $(BIN)/dpsql --policy examples/durable.toml shell   (or explain, run, query, budget)"

# The same queries on Apache Spark, in local mode (a Java runtime is installed when missing).
demo-spark: $(STAMP) examples/data/visits.parquet java
	$(BIN)/python examples/demo.py examples/spark.toml

lint: $(STAMP)
	$(BIN)/ruff check dpsql tests benchmarks examples
	$(BIN)/ruff format --check dpsql tests benchmarks examples

types: $(STAMP)
	$(BIN)/mypy

# The wire-protocol tests drive dpsql serve with the real psql client (Debian postgresql-client).
psql:
	@command -v psql >/dev/null 2>&1 || { \
		if command -v apt-get >/dev/null 2>&1; then \
			SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
			$$SUDO apt-get update -qq && \
			$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql-client; \
		else echo "psql is missing: install the PostgreSQL client" >&2; exit 1; fi; }

# Spark runs on a Java runtime (Debian openjdk-17-jre-headless) for the Spark engine's tests.
java:
	@command -v java >/dev/null 2>&1 || { \
		if command -v apt-get >/dev/null 2>&1; then \
			SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
			$$SUDO apt-get update -qq && \
			$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless; \
		else echo "java is missing: install a Java 17 runtime" >&2; exit 1; fi; }

# Two pytest processes side by side, one per core, each printing its own summary (either
# failing fails): the Spark tests (one local Spark, whose JVM often waits) then the other tests
# of files n-z, beside the other tests of files a-m. Together they run every test once.
# Each test has a quarter of an hour (pyproject.toml); each process has 40 minutes, after which
# it is interrupted as by Ctrl-C, so that it still prints its failures and summary.
FIRST_HALF := $(wildcard tests/test_[a-m]*.py)
SECOND_HALF := $(wildcard tests/test_[n-z]*.py)
PYTEST := timeout --signal=INT -k 60 2400 $(BIN)/pytest
pytest: $(STAMP) examples/data/visits.parquet psql java
	@( $(PYTEST) -q -p no:cacheprovider -m spark; spark=$$?; \
	  $(PYTEST) -q -p no:cacheprovider -m "not spark" $(SECOND_HALF); rest=$$?; \
	  exit $$(( spark || rest )) ) > .pytest-second.log 2>&1 & second=$$!; \
	$(PYTEST) -q -m "not spark" $(FIRST_HALF); first=$$?; \
	wait $$second; status=$$?; echo "== the Spark tests, then files n-z =="; \
	cat .pytest-second.log; exit $$(( first || status ))

test: lint types pytest

bench: $(STAMP)
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) examples/data .pytest_cache .mypy_cache .ruff_cache .pytest-second.log
