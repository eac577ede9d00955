#!/bin/sh
# The alert tests (tests/deploy/test_alerts.py) check and evaluate
# deploy/prometheus/chunkmaster-alerts.yaml with promtool and run the shipped scrape config in a
# real Prometheus: both from Debian's prometheus package (/usr/bin/promtool, /usr/bin/prometheus),
# installed without its recommends. Its own service is never started by the install (a
# policy-rc.d refuses it for the length of the install), so `make test` leaves no Prometheus
# running on a developer's machine; the tests run theirs on ports of their own.
set -eu
command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 && exit 0
if ! command -v apt-get >/dev/null 2>&1 || [ "$(id -u)" != 0 ]; then
    echo "no promtool/prometheus, and no apt-get as root to install Debian's prometheus" >&2
    exit 1
fi
echo "installing Debian's prometheus for promtool (the alert tests)" >&2
policy=/usr/sbin/policy-rc.d
made=""
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && made=1
fi
trap 'if [ -n "$made" ]; then rm -f "$policy"; fi' EXIT
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 && exit 0
echo "prometheus is installed but promtool or prometheus is still not on PATH" >&2
exit 1
