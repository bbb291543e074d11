# Two commands do all set-up on a fresh machine (Debian, Python 3.11+, Java 17+, Maven):
#   make dev   - install, start the embedded stack and the Dagster UI (Ctrl-C stops everything)
#   make test  - install, then lint, type-check, validate the definitions and run pytest
# Between edits:
#   make check - lint, type-check and the tests that need no JVM (a few minutes)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: dev test check lint typecheck validate pytest pytest-no-jvm java jvm test-jvm clean lock

# pytest-xdist workers: the tests wait on servers (JVM starts, broker, sensor and MirrorMaker 2
# ticks) as much as they compute, so three workers keep two cores busy (docs/architecture.md
# "How the tests run"). Four were faster (pytest 20.6-23.5 min with the suite's JVMs on C1, the
# cores 95-100 % busy) but too busy for the tests that judge a cadence: three such failed in one
# of two runs. tests/conftest.py keeps the tests that share a server on one worker. make check
# starts no server: two workers import the project once each (1.8 min, 2.4 on four).
WORKERS ?= 3
CHECK_WORKERS ?= 2

java:
	@command -v java >/dev/null 2>&1 || { echo "Java 17+ is required by Spark and was not found."; \
	  echo "Install it with: sudo apt-get install -y openjdk-17-jre-headless"; exit 1; }
	@v=$$(java -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java.specification.version = //p'); \
	  [ "$${v%%.*}" -ge 17 ] 2>/dev/null || { echo "Java $$v found; Spark needs Java 17+."; \
	  echo "Install it with: sudo apt-get install -y openjdk-17-jre-headless"; exit 1; }
	@command -v mvn >/dev/null 2>&1 || { echo "Maven is required to fetch the Kafka, MirrorMaker 2, REST catalog and Schema Registry jars once."; \
	  echo "Install it with: sudo apt-get install -y maven"; exit 1; }

# The embedded Kafka broker's, MirrorMaker 2's and the tests' Iceberg REST catalog's jars, fetched
# by Maven into ~/.m2 once (resources/jvm/*/pom.xml; resources/jvm.py remembers the class paths).
jvm: java $(STAMP)
	$(BIN)/python -c "from resources.jvm import class_path; class_path('kafka'); class_path('mirror-maker'); class_path('rest-catalog')"

# The tests' Schema Registry (Apicurio Registry, a Quarkus application) built once into the same
# cache (resources/jvm.py quarkus_runner; about 2.5 minutes and 220 MB of jars the first time),
# and the tests' Debezium PostgreSQL connector in Kafka Connect (resources/jvm/debezium/pom.xml):
# only the tests need them, so make dev does not wait for them.
test-jvm: jvm
	$(BIN)/python -c "from resources.jvm import quarkus_runner; quarkus_runner('schema-registry')"
	$(BIN)/python -c "from resources.jvm import class_path; class_path('debezium')"

# Installed from the lock (constraints.txt): a fresh clone gets the versions CI ran.
$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	@touch $(STAMP)

# Rewrite the lock from .venv after changing a range in pyproject.toml (then commit both).
lock: $(STAMP)
	{ sed -n '1,/^# reproducible/p' constraints.txt; \
	  $(BIN)/python -m pip freeze --exclude-editable | grep -v '^kafka-iceberg-platform'; } \
	  > constraints.txt.new && mv constraints.txt.new constraints.txt

# The dbt manifest the Dagster definitions load (dbt/target is git-ignored).
DBT_MANIFEST := dbt/target/manifest.json
DBT_SOURCES := $(shell find dbt -name '*.yml' -not -path 'dbt/target/*' -o -name '*.sql' -not -path 'dbt/target/*')

$(DBT_MANIFEST): $(STAMP) $(DBT_SOURCES)
	cd dbt && DBT_PROFILES_DIR=. ../$(BIN)/dbt parse --quiet

dev: jvm $(DBT_MANIFEST)
	$(BIN)/python scripts/dev.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

validate: $(STAMP) $(DBT_MANIFEST)
	DAGSTER_HOME= $(BIN)/dagster definitions validate -w workspace.yaml
	VIRTUAL_ENV=$(abspath $(VENV)) $(BIN)/dg check defs

pytest: test-jvm $(DBT_MANIFEST)
	$(BIN)/pytest -n $(WORKERS) --dist loadscope --no-loadscope-reorder

# The tests that start no JVM (tests/conftest.py marks the others `jvm`). Any JVM one of them
# starts anyway fails at once on the option below, which names the fix: mark the test.
pytest-no-jvm: $(STAMP) $(DBT_MANIFEST)
	JAVA_TOOL_OPTIONS=-XX:+make_check_runs_no_JVM__mark_the_test_jvm \
	  $(BIN)/pytest -n $(CHECK_WORKERS) --dist loadscope --no-loadscope-reorder -m "not jvm"

test: java lint typecheck validate pytest

check: lint typecheck pytest-no-jvm

clean:
	rm -rf .platform dbt/target dbt/logs
	@# make dev's .env (resources/stack_env.py), left by a make dev killed with SIGKILL; never yours
	@if head -1 .env 2>/dev/null | grep -q '^# Written by make dev'; then rm -f .env; fi
