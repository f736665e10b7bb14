"""A real PgBouncer (Debian's 1.18) in transaction mode in front of the test database.

It runs deploy/pgbouncer/pgbouncer.ini, the file the compose stack ships, with only where
it listens, how clients authenticate (``any``: the test server trusts ``root``), the
``[databases]`` line and the pool's size overridden. ``make test`` installs the package
(tests/pgbouncer/install-pgbouncer.sh); where it is missing the tests skip and say why.
"""

from __future__ import annotations

import configparser
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHIPPED_INI = ROOT / "deploy" / "pgbouncer" / "pgbouncer.ini"
# What the test changes in the shipped file, and nothing else.
OVERRIDDEN = {"listen_addr", "listen_port", "auth_type", "auth_file", "unix_socket_dir", "default_pool_size"}


def pgbouncer_binary() -> str | None:
    return shutil.which("pgbouncer") or next((p for p in ("/usr/sbin/pgbouncer",) if os.access(p, os.X_OK)), None)


def shipped_config() -> configparser.ConfigParser:
    config = configparser.ConfigParser(interpolation=None, delimiters=("=",), comment_prefixes=(";", "#"))
    config.optionxform = str  # keys as written
    config.read(SHIPPED_INI)
    return config


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgBouncer:
    """A running pgbouncer; ``url(direct_url)`` is the same database through it."""

    def __init__(self, server_host: str, server_port: int, server_user: str, *, pool_size: int) -> None:
        binary = pgbouncer_binary()
        if binary is None:
            pytest.skip("pgbouncer is not installed (make test installs Debian's package where apt-get works)")
        self.port = free_port()
        # pgbouncer refuses to run as root: it drops to nobody, who must read the files.
        self.dir = Path(tempfile.mkdtemp(prefix="vpay-pgbouncer-"))
        self.dir.chmod(0o755)
        config = shipped_config()
        config["databases"] = {"*": f"host={server_host} port={server_port} user={server_user}"}
        overrides = {
            "listen_addr": "127.0.0.1",
            "listen_port": str(self.port),
            "auth_type": "any",
            "auth_file": "",
            "unix_socket_dir": "",
            "default_pool_size": str(pool_size),
        }
        assert set(overrides) == OVERRIDDEN
        config["pgbouncer"].update(overrides)
        ini = self.dir / "pgbouncer.ini"
        with ini.open("w") as f:
            config.write(f)
        ini.chmod(0o644)
        self.log_path = self.dir / "pgbouncer.log"
        self._log = self.log_path.open("wb")
        # A server on a Unix socket (the embedded development database) is reached through
        # its folder, which only the server's own user may enter: pgbouncer runs as that user.
        run_as = pwd.getpwuid(os.stat(server_host).st_uid).pw_name if server_host.startswith("/") else "nobody"
        command = [binary, *(["-u", run_as] if os.getuid() == 0 else []), str(ini)]
        self.proc = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 15
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"pgbouncer did not start:\n{self.output()}") from None
                time.sleep(0.05)

    def url(self, direct_url: str) -> str:
        """``direct_url`` with its host and port replaced by this pgbouncer's."""
        parts = urlsplit(direct_url)
        auth = parts.netloc.rpartition("@")[0]
        # A socket folder in the query (?host=/path) would win over the netloc: drop it.
        query = urlencode([(k, v) for k, v in parse_qsl(parts.query) if k != "host"])
        netloc = f"{auth}@127.0.0.1:{self.port}" if auth else f"127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc, query=query))

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
