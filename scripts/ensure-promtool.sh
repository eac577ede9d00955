#!/bin/sh
# The alert test (tests/deploy/test_alerts.py) checks and evaluates
# deploy/prometheus/chunkmaster-alerts.yaml with promtool, which Debian ships in its prometheus
# package (/usr/bin/promtool). Installed without its recommends; the package's own server is not
# started by the tests (on a machine without an init system it is not started at all).
set -eu
command -v promtool >/dev/null 2>&1 && exit 0
if command -v apt-get >/dev/null 2>&1; then
    echo "installing Debian's prometheus for promtool (the alert test)" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
else
    echo "missing promtool and no apt-get to install it (Debian's prometheus package ships it)" >&2
    exit 1
fi
command -v promtool >/dev/null 2>&1 || { echo "promtool is still missing after installing prometheus" >&2; exit 1; }
