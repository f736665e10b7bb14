# The two commands (see README): `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Python writes its bytecode caches (__pycache__/, git-ignored) even where the environment
# asks it not to: without them every process the suite starts (hundreds of workers, web
# processes, scripts) compiles the project's modules again, a sixth of a worker's startup.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: run test test-suite test-django6 test-django6-venv rehearse lint bench stop-db clean browser pgbouncer postgres

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
## ones (pyproject.toml deselects them; a fast case of each rehearsal still runs here), then
## test-django6 (below), whose venv is built while the suite runs.
## TEST_WORKERS: pytest-xdist workers for the suite (docs/testing.md); 0 runs it in one process.
TEST_WORKERS ?= 4
test: $(VENV)/.deps browser pgbouncer postgres
	$(MAKE) --no-print-directory -j2 test-suite test-django6-venv
	$(MAKE) --no-print-directory test-django6

## test without the Django 6 part.
test-suite: $(VENV)/.deps
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(PY) manage.py makemigrations --check --dry-run
	$(PY) manage.py check --fail-level WARNING
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup

## Django 6.0 beside 5.2 LTS (docs/testing.md "Django 6"): a second venv on Python 3.12 with
## requirements/django6.txt over dev.txt, then the system checks, migrations in sync and a
## subset: the system checks' tests, the Tasks backend, one payment end to end with its webhook.
## PYTHON312: the interpreter it is built with (a working python3.12 on PATH, else pyenv's
## newest 3.12: pyenv's shim answers only for its global versions). SKIP_DJANGO6=1 skips it,
## saying so; without that, a missing Python 3.12 fails the run rather than passing it unchecked.
PYTHON312 ?= $(or $(shell python3.12 -c 'import sys; print(sys.executable)' 2>/dev/null),$(lastword $(wildcard $(shell pyenv root 2>/dev/null)/versions/3.12*/bin/python)),python3.12)
VENV6 := .venv-django6
PY6 := $(VENV6)/bin/python
DJANGO6_TESTS := tests/test_system_checks.py tests/test_tasks_backend.py \
	tests/test_charges_worker.py::test_the_merchants_endpoint_receives_the_settlement_webhook_signed

$(VENV6)/.deps: requirements/base.txt requirements/dev.txt requirements/django6.txt
	@$(PYTHON312) -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null || { \
	  echo "test-django6: needs Python 3.12 or newer as PYTHON312 (now '$(PYTHON312)'); set it, or SKIP_DJANGO6=1 to skip the Django 6 checks" >&2; \
	  exit 1; }
	test -x $(PY6) || $(PYTHON312) -m venv $(VENV6)
	$(PY6) -m pip install -q --upgrade pip
	$(PY6) -m pip install -q -r requirements/dev.txt
	$(PY6) -m pip install -q -r requirements/django6.txt
	$(PY6) -m pip uninstall -q -y django-tasks
	touch $@

ifeq ($(SKIP_DJANGO6),1)
test-django6:
	@echo "test-django6: SKIPPED (SKIP_DJANGO6=1): Django 6.0 support was not checked"
test-django6-venv:
else
# make test builds the Django 6 venv while the suite runs (a fresh clone's 20-odd seconds of
# pip, overlapped); pip's output goes to a log, shown when the build fails.
test-django6-venv:
	@mkdir -p $(VENV6)
	@$(MAKE) --no-print-directory $(VENV6)/.deps > $(VENV6)/build.log 2>&1 || { cat $(VENV6)/build.log >&2; exit 1; }
test-django6: $(VENV6)/.deps
	$(PY6) -c 'import django; assert django.VERSION[:2] == (6, 0), django.__version__'
	$(PY6) manage.py check --fail-level WARNING
	$(PY6) manage.py makemigrations --check --dry-run
	$(PY6) -m pytest $(DJANGO6_TESTS)
endif

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
	rm -rf .pgdata $(VENV) $(VENV6)
