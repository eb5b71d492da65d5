# dpsql: `make demo` runs the main job on the example data; `make test` runs lint, types and tests.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo demo-spark test test-long lint types pytest psql java chromium bench clean

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

# The console's browser tests (dpsql web) drive Debian's Chromium through its WebDriver.
chromium:
	@{ command -v chromium && command -v chromedriver; } >/dev/null 2>&1 || { \
		if command -v apt-get >/dev/null 2>&1; then \
			SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
			$$SUDO apt-get update -qq && \
			$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; \
		else echo "chromium is missing: install chromium and its driver" >&2; exit 1; fi; }

# One pytest run over two worker processes, one per core, balanced by pytest-xdist; every Spark
# test goes to one worker (one local Spark, whose JVM takes seconds to start). Each test has a
# quarter of an hour (pyproject.toml), the run 40 minutes, after which it is interrupted as by
# Ctrl-C, so that it still prints its failures and summary. The 25 slowest tests are listed.
PYTEST := timeout --signal=INT -k 60 2400 $(BIN)/pytest
PYTEST_ARGS := -n 2 --dist loadgroup --durations=25 -p no:cacheprovider
pytest: $(STAMP) examples/data/visits.parquet psql java chromium
	$(PYTEST) $(PYTEST_ARGS)

# The same suite under the long profile (hypothesis and the hand-rolled fuzzers, about ten
# times the examples): for a release, not for every change.
test-long: $(STAMP) examples/data/visits.parquet psql java chromium
	DPSQL_FUZZ=long $(PYTEST) $(PYTEST_ARGS) --timeout 3600

test: lint types pytest

bench: $(STAMP)
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) examples/data .pytest_cache .mypy_cache .ruff_cache
