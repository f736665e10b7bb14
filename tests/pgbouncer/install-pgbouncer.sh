#!/bin/sh
# Debian's PgBouncer (1.18 on bookworm) for the pooler tests (tests/test_pgbouncer.py),
# installed when missing. Never fails the build: where it cannot be installed (not root, no
# apt-get, no package mirror) those tests skip and say why.
set -u
if command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ]; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "install-pgbouncer: pgbouncer missing and this is not root with apt-get; the pooler tests will skip" >&2
    exit 0
fi
echo "install-pgbouncer: installing Debian's pgbouncer" >&2
if ! { apt-get -o DPkg::Lock::Timeout=300 update -qq \
       && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
            --no-install-recommends pgbouncer >/dev/null; }; then
    echo "install-pgbouncer: apt-get failed; the pooler tests will skip" >&2
fi
# The package starts a system service on install; the tests run their own.
if command -v service >/dev/null 2>&1; then
    service pgbouncer stop >/dev/null 2>&1 || true
fi
exit 0
