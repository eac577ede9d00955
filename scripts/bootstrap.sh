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
# torch's CPU build (2.13.0+cpu, where the package index or a wheel folder has it: a 1.6 GB
# virtualenv); else torch 2.13.0 from PyPI, which brings CUDA's libraries (5.3 GB). numpy:
# torch warns at every import without it (the torch extra).
if ! "$VENV/bin/python" -m pip install -q -e ".[test,torch]" "torch==2.13.0+cpu"; then
    echo "no torch 2.13.0+cpu here: installing torch 2.13.0 (with CUDA's libraries)" >&2
    "$VENV/bin/python" -m pip install -q -e ".[test,torch]" "torch==2.13.0"
fi
