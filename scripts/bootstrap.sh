#!/bin/sh
# Create the virtualenv and install chunkmaster with its test extras, from nothing.
set -eu
VENV=${1:-.venv}
if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "chunkmaster needs Python 3.11 or newer as python3" >&2
    exit 1
fi
if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -c 'import ensurepip' 2>/dev/null; then
    # Debian splits venv/ensurepip into its own package.
    if command -v apt-get >/dev/null; then
        apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
    fi
fi
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
# torch 2.13.0 CPU lies on these machines' disk; asking for it exactly avoids a CUDA download.
"$VENV/bin/python" -m pip install -q -e ".[test]" "torch==2.13.0"
