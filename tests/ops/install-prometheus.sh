#!/bin/sh
# Debian's prometheus package, for its promtool, which checks and unit-tests the alert rules
# (tests/test_prometheus_rules.py runs this when promtool is missing). Never fails: where it
# cannot be installed (not root, no apt-get, no package mirror) the rule tests skip and say why.
set -u
if command -v promtool >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "install-prometheus: promtool missing and this is not root with apt-get; the rule checks will skip" >&2
    exit 0
fi
echo "install-prometheus: installing Debian's prometheus (for promtool)" >&2
# Only promtool is used; the package's server is never started by the tests.
if ! { apt-get -o DPkg::Lock::Timeout=300 update -qq \
       && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
            --no-install-recommends prometheus >/dev/null; }; then
    echo "install-prometheus: apt-get failed; the rule checks will skip" >&2
fi
exit 0
