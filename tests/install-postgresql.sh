#!/bin/sh
# Debian's PostgreSQL server binaries (initdb, pg_ctl) for the outage rehearsals, which run
# a cluster of their own (tests/owned_postgres.py), installed when missing. Never fails the
# build: where they cannot be installed (not root, no apt-get, no package mirror) those
# tests skip and say why.
set -u
if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "install-postgresql: initdb missing and this is not root with apt-get; the outage rehearsals will skip" >&2
    exit 0
fi
echo "install-postgresql: installing Debian's postgresql (server binaries only are used)" >&2
if ! { apt-get -o DPkg::Lock::Timeout=300 update -qq \
       && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
            --no-install-recommends postgresql >/dev/null; }; then
    echo "install-postgresql: apt-get failed; the outage rehearsals will skip" >&2
fi
exit 0
