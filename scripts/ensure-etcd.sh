#!/bin/sh
# The tests start their own etcd servers; they need the binary (Debian's etcd-server).
set -eu
if command -v etcd >/dev/null 2>&1; then exit 0; fi
if command -v apt-get >/dev/null 2>&1; then
    echo "installing Debian's etcd-server for the tests" >&2
    apt-get update -qq
    # The package's postinst may try to start a system etcd; we never use it.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >/dev/null
    if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
        systemctl disable --now etcd >/dev/null 2>&1 || true
    elif [ -x /etc/init.d/etcd ]; then
        /etc/init.d/etcd stop >/dev/null 2>&1 || true
    fi
else
    echo "etcd not found and no apt-get to install it: install etcd 3.4+ and put it on PATH" >&2
    exit 1
fi
command -v etcd >/dev/null
