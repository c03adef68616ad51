# pepsi-dispatch developer entry points. `make help` lists them.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Migrate $$dsn to head; alembic's chatter is shown only when it fails.
MIGRATE := out=$$(PEPSI_DSN="$$dsn" $(VENV)/bin/alembic upgrade head 2>&1) || { echo "$$out" >&2; exit 1; };
PG_MAJOR ?= $(shell ls /usr/lib/postgresql 2>/dev/null | sort -n | tail -n 1)

# Phony targets.
.PHONY: migration schema-dump help db-deps system-deps install db demo demo-stop test test-sql test-python test-unit lint bench stop-db clean man chaos failover endurance

help:
	@echo "make install   .venv with pepsi-dispatch (editable) and test extras"
	@echo "make db        a database: \$$PEPSI_DSN, or an embedded cluster under .pepsi/, migrated"
	@echo "make demo      run the sample pipeline end to end and print a summary"
	@echo "make test      pg_prove tests/sql + pytest tests/python"
	@echo "make test-unit the unit tests only (tests/python/unit: no database, seconds)"
	@echo "make bench     throughput/latency benchmark"
	@echo "make lint      ruff, and the package's layers (import-linter)"
	@echo "make chaos     randomized fault soak, both modes (CHAOS_SECONDS=300 per mode, CHAOS_SEED, CHAOS_FAULTS)"
	@echo "make failover  primary + synchronous hot standby; promote under load (tests/chaos/failover.py)"
	@echo "make endurance steady half-capacity load, bounds on RSS/fds/latency/sizes (ENDURANCE_MINUTES=30; not in make test)"
	@echo "make migration NAME=what  freeze the live sql/ files that changed into a new migration"
	@echo "make schema-dump  rewrite migrations/head_schema.sql (pg_dump of head; a test compares)"
	@echo "make man       man/*.1, man/*.5 from --help and docs/CONFIG.md (the wheel installs them)"
	@echo "make demo-stop stop the embedded PostgreSQL that make demo/db leave running"

# System packages, installed when missing and running as root on Debian, otherwise
# named in one clear error. The demo and `make db` need only the PostgreSQL server
# (db-deps); the tests also need pgTAP and pg_prove, headless Chromium with its
# driver for the dashboard's browser test, and PgBouncer for the pooler test (system-deps).
INSTALL_MISSING = if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing system packages:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else \
	    echo "error: missing system packages:$$missing (install them with: sudo apt-get install$$missing)" >&2; exit 2; \
	  fi; \
	fi

db-deps:
	@missing=""; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing postgresql"; \
	$(INSTALL_MISSING)

system-deps: db-deps
	@missing=""; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v chromedriver >/dev/null 2>&1 || missing="$$missing chromium-driver"; \
	command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || missing="$$missing pgbouncer"; \
	command -v pg_prove >/dev/null 2>&1 || missing="$$missing libtap-parser-sourcehandler-pgtap-perl"; \
	ls /usr/share/postgresql/*/extension/pgtap.control >/dev/null 2>&1 || missing="$$missing postgresql-$${PG_MAJOR:-15}-pgtap"; \
	$(INSTALL_MISSING)

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; install Python 3.11+" >&2; exit 2; }
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test]'
	@touch $@

install: $(STAMP)

# Prints the DSN it used as its last line.
db: install db-deps
	@dsn="$${PEPSI_DSN:-$$($(PY) -m pepsi_dispatch.devtools.embedded start .pepsi)}"; \
	$(MIGRATE) \
	echo "$$dsn"

stop-db:
	@$(PY) -m pepsi_dispatch.devtools.embedded stop .pepsi

demo-stop: stop-db

demo: install db-deps
	@dsn="$${PEPSI_DSN:-$$($(PY) -m pepsi_dispatch.devtools.embedded start .pepsi --dbname pepsi_demo)}"; \
	$(MIGRATE) \
	PEPSI_DSN="$$dsn" $(PY) -m pepsi_dispatch.devtools.demo; \
	if [ -z "$${PEPSI_DSN:-}" ]; then echo "The embedded PostgreSQL under .pepsi/ is still running; stop it with: make demo-stop"; fi

test: test-sql test-python

# pgTAP: a fresh database migrated to head, pgtap installed, every file under tests/sql.
test-sql: install system-deps
	@$(PY) scripts/run_pgtap.py

# Every pytest test: tests/python/unit, integration and acceptance, in TEST_JOBS
# processes (pytest-xdist; each file's tests stay in one process, and each process
# starts its own throwaway cluster). With PEPSI_TEST_DSN (one shared cluster, whose
# roles both processes would create at once) or TEST_JOBS=0: one process.
TEST_JOBS ?= 2
test-python: install system-deps
	$(VENV)/bin/pytest -n $(if $(PEPSI_TEST_DSN),0,$(TEST_JOBS)) --dist loadfile tests/python

# No database, no system packages: tests/python/unit alone.
test-unit: install
	$(VENV)/bin/pytest tests/python/unit

# A changed live file in sql/ becomes a frozen revision in migrations/sql/ and a new
# migration in migrations/versions/ (see CONTRIBUTING.md).
migration: install
	@[ -n "$${NAME:-}" ] || { echo "error: give the migration a name: make migration NAME=what_it_does" >&2; exit 2; }
	$(PY) scripts/new_migration.py "$$NAME"

# The committed pg_dump of head, rewritten from a scratch database ($$PEPSI_DSN's cluster or a throwaway one).
schema-dump: install db-deps
	$(PY) -m pepsi_dispatch.devtools.schemadump

lint: install
	$(VENV)/bin/ruff check pepsi_dispatch tests migrations scripts examples
	$(VENV)/bin/ruff format --check pepsi_dispatch tests migrations scripts examples
	$(VENV)/bin/lint-imports

# The randomized fault soak (tests/chaos/driver.py): prints its seed first; CHAOS_SEED replays.
chaos: install system-deps
	$(PY) tests/chaos/driver.py

failover: install system-deps
	$(PY) tests/chaos/failover.py

# The endurance run (tests/endurance/run.py): ENDURANCE_MINUTES (30; 120: the long mode), ENDURANCE_WARMUP (5; 15 from 60 min),
# ENDURANCE_WINDOW (60 s), ENDURANCE_SAMPLE (60 s), ENDURANCE_RATE (default: half capacity).
endurance: install system-deps
	$(PY) tests/endurance/run.py

bench: install db-deps
	@dsn="$${PEPSI_DSN:-$$($(PY) -m pepsi_dispatch.devtools.embedded start .pepsi --dbname pepsi_bench)}"; \
	$(MIGRATE) \
	PEPSI_DSN="$$dsn" $(PY) -m pepsi_dispatch.devtools.bench $(BENCH_ARGS)

# Man pages: generated from the click commands and docs/CONFIG.md; committed, so
# that the wheel can install them (a test checks they are current).
man: install
	$(PY) -m pepsi_dispatch.devtools.manpages man docs/CONFIG.md

clean: stop-db
	rm -rf .pepsi $(VENV) *.egg-info
