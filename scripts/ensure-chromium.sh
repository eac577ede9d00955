#!/bin/sh
# The dashboard tests render the page in a real headless browser: Debian's chromium.
set -eu
if command -v chromium >/dev/null 2>&1; then exit 0; fi
if command -v apt-get >/dev/null 2>&1; then
    echo "installing Debian's chromium for the dashboard tests" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
else
    echo "chromium not found and no apt-get to install it: install chromium and put it on PATH" >&2
    exit 1
fi
command -v chromium >/dev/null
