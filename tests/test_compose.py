"""docker-compose.yml, read as Compose would (``docker compose config`` is not available
here): valid YAML, N workers through PgBouncer as docs/deploy.md describes, and the same
pgbouncer.ini the pooler tests run (tests/pgbouncer_support.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from tests.pgbouncer_support import OVERRIDDEN, SHIPPED_INI, shipped_config

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def env_of(compose: dict, service: str) -> dict[str, str]:
    return {k: str(v) for k, v in compose["services"][service]["environment"].items()}


def test_the_services_are_the_deploy_guides(compose):
    assert set(compose["services"]) == {"postgres", "pgbouncer", "migrate", "web", "worker", "rail", "receiver"}


def test_workers_scale_and_reach_postgres_through_pgbouncer_with_listen_direct(compose):
    worker = compose["services"]["worker"]
    # `--scale worker=N` needs no fixed name and no fixed host port.
    assert "container_name" not in worker and "ports" not in worker
    assert worker["command"][:3] == ["python", "manage.py", "runworker"]
    env = env_of(compose, "worker")
    pooled, direct = urlsplit(env["DATABASE_URL"]), urlsplit(env["DATABASE_DIRECT_URL"])
    assert (pooled.hostname, pooled.port) == ("pgbouncer", int(shipped_config()["pgbouncer"]["listen_port"]))
    assert (direct.hostname, direct.port) == ("postgres", 5432)
    assert pooled.path == direct.path and pooled.username == direct.username
    assert env["VPAY_DB_POOLER"] == "transaction"
    assert env_of(compose, "web")["DATABASE_URL"] == env["DATABASE_URL"]


def test_pgbouncer_is_built_from_the_tested_config(compose):
    service = compose["services"]["pgbouncer"]
    context = ROOT / service["build"]
    assert context == SHIPPED_INI.parent
    dockerfile = (context / "Dockerfile").read_text()
    assert "bookworm" in dockerfile and "install -y --no-install-recommends pgbouncer" in dockerfile  # Debian's 1.18
    assert "COPY pgbouncer.ini userlist.txt /etc/pgbouncer/" in dockerfile
    config = shipped_config()
    assert config["pgbouncer"]["pool_mode"] == "transaction"
    assert config["databases"]["*"].split() == ["host=postgres", "port=5432"]
    assert "ignore_startup_parameters" not in config["pgbouncer"]  # a missing VPAY_DB_POOLER fails loudly
    # The pooler tests run every other key of this file as shipped.
    assert "pool_mode" not in OVERRIDDEN and "query_wait_timeout" not in OVERRIDDEN
    postgres = compose["services"]["postgres"]["environment"]
    userlist = (context / "userlist.txt").read_text().split()
    assert userlist == [f'"{postgres["POSTGRES_USER"]}"', f'"{postgres["POSTGRES_PASSWORD"]}"']


def test_migrations_and_the_role_timeouts_run_before_web_and_workers(compose):
    services = compose["services"]
    command = " ".join(services["migrate"]["command"])
    assert 'DATABASE_URL="$$DATABASE_DIRECT_URL" VPAY_DB_POOLER=none python manage.py migrate' in command
    assert command.endswith("python manage.py dbroletimeouts --apply")
    for name in ("web", "worker"):
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert services["worker"]["stop_grace_period"] == "40s"


def test_every_compose_setting_is_documented_and_accepted(compose):
    env = env_of(compose, "worker")
    documented = (ROOT / ".env.example").read_text()
    for name in env:
        assert f"{name}=" in documented, f"{name} is not in .env.example"
    # Settings load with exactly this environment (no database is reached by --print-config).
    compose_env = {
        k: v.replace("${DJANGO_SECRET_KEY:-dev-only-change-me}", "dev-only-change-me") for k, v in env.items()
    }
    result = subprocess.run(
        [sys.executable, "manage.py", "runworker", "--print-config", "--format", "json"],
        cwd=ROOT,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **compose_env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-2000:]
