#!/bin/sh
# Debian's Chromium and ChromeDriver for the admin's real-browser test
# (tests/test_admin_browser.py), installed when missing. Never fails the build: where they
# cannot be installed (not root, no apt-get, no package mirror) the test skips and says why.
set -u
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "install-chromium: chromium/chromedriver missing and this is not root with apt-get; the browser test will skip" >&2
    exit 0
fi
echo "install-chromium: installing Debian's chromium and chromium-driver" >&2
if ! { apt-get -o DPkg::Lock::Timeout=300 update -qq \
       && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
            --no-install-recommends chromium chromium-driver >/dev/null; }; then
    echo "install-chromium: apt-get failed; the browser test will skip" >&2
fi
exit 0
