#!/bin/sh
# `make dist`: chunkmaster's sdist and wheel in OUT (default dist/; a relative OUT is the
# checkout's), checked by twine.
#
# `python -m build` makes the sdist from the checkout, then the wheel from that sdist (not
# from the checkout): a wheel that builds proves the sdist holds what a build needs. Both are
# built in an isolated environment with the build-system requirements of pyproject.toml. Older
# chunkmaster files in OUT are removed first, so `twine upload OUT/*` uploads these two only.
# `twine check --strict` fails on any warning about the metadata (the README as PyPI would
# render it, the content type).
#
# Variables: PY (the Python with `build` and `twine`, the test extra: default .venv/bin/python).
set -eu
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${1:-dist}
mkdir -p "$OUT"
rm -f "$OUT"/chunkmaster-*
"$PY" -m build --outdir "$OUT" .
"$PY" -m twine check --strict "$OUT"/chunkmaster-*
