# The two commands (see README): `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: run test rehearse lint bench stop-db clean browser pgbouncer postgres

$(VENV)/.deps: requirements/base.txt requirements/dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements/dev.txt
	touch $@

## Install, start the database (embedded unless DATABASE_URL is set), migrate, and run
## the worker and the web process (admin at http://127.0.0.1:8000/admin/).
run: $(VENV)/.deps
	$(PY) -m vpay.devstack

## The whole test suite: lint, types (mypy over jobs/, charges/, webhooks/), migrations in sync, the system checks (live mode's
## `check --deploy` is tests/test_system_checks.py), every test but the heavy `rehearse`
## ones (pyproject.toml deselects them; a fast case of each rehearsal still runs here).
## TEST_WORKERS: pytest-xdist workers for the suite (docs/testing.md); 0 runs it in one process.
TEST_WORKERS ?= 0
test: $(VENV)/.deps browser pgbouncer postgres
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(PY) manage.py makemigrations --check --dry-run
	$(PY) manage.py check --fail-level WARNING
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup

## The heavy failure rehearsals only: every test marked `rehearse` (docs/rehearsals.md).
rehearse: $(VENV)/.deps postgres
	$(PY) -m pytest -m rehearse

## Debian's chromium + chromium-driver for the admin's browser test, when missing (never fails).
browser:
	@sh tests/browser/install-chromium.sh

## Debian's pgbouncer for the pooler tests (tests/test_pgbouncer.py), when missing (never fails).
pgbouncer:
	@sh tests/pgbouncer/install-pgbouncer.sh

## Debian's PostgreSQL server binaries for the outage rehearsals' own cluster, when missing (never fails).
postgres:
	@sh tests/install-postgresql.sh

bench: $(VENV)/.deps
	bench/run.sh

stop-db:
	$(PY) -m vpay.embedded_db stop

clean: stop-db
	rm -rf .pgdata $(VENV)
