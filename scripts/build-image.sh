#!/bin/sh
# `make image`: build IMAGE:TAG (default chunkmaster:dev) from the Containerfile with podman.
#
# 1. Wheels for the image's Python (CPython 3.11 on Linux, this machine's architecture): the
#    package built here, its dependencies downloaded as binary wheels (EXTRAS adds extras:
#    EXTRAS=parquet,s3), so the build itself runs without a network.
# 2. The base: BASE (default docker.io/library/python:3.11-slim-bookworm). With BASE=mmdebstrap,
#    or when the default cannot be pulled, a base is made from Debian's packages
#    (scripts/make-base-image.sh) and imported as localhost/chunkmaster-base:bookworm.
# 3. podman build --format docker (the HEALTHCHECK needs it) --network none, with the OCI labels
#    org.opencontainers.image.version (the wheel's version: pyproject's) and
#    org.opencontainers.image.revision (git rev-parse HEAD; "unknown" outside a git checkout).
#
# Variables: IMAGE (default chunkmaster) and TAG (default dev): the image is IMAGE:TAG, which
# is what the Kubernetes overlays name in their `images:` entry (e.g. IMAGE=
# registry.example.com/chunkmaster TAG=0.1.0; a TAG holding a ':' is a whole reference, as
# TAG=chunkmaster:dev was before); PY (the Python that makes the wheels, default
# .venv/bin/python), BASE, EXTRAS; podman's own (CONTAINERS_CONF, CONTAINERS_STORAGE_CONF) pass
# through: on a machine where podman's default runtime fails, point CONTAINERS_CONF at
# tests/deploy/podman/containers.conf (runc, cgroupfs, no default ulimits).
set -eu
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
IMAGE=${IMAGE:-chunkmaster}
TAG=${TAG:-dev}
case "$TAG" in
    *:*) ref=$TAG ;;  # a whole reference
    *) ref=$IMAGE:$TAG ;;
esac
BASE=${BASE:-docker.io/library/python:3.11-slim-bookworm}
EXTRAS=${EXTRAS:-}
LOCAL_BASE=localhost/chunkmaster-base:bookworm
wheels=build/image/wheels
arch=$(uname -m)

rm -rf "$wheels"
mkdir -p "$wheels"
"$PY" -m pip wheel --quiet --no-deps --wheel-dir "$wheels" .
whl=$(ls "$wheels"/chunkmaster-*.whl)
version=$(basename "$whl" | cut -d- -f2)
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
"$PY" -m pip download --quiet --only-binary=:all: --python-version 3.11 --implementation cp \
    --platform "manylinux2014_$arch" --platform "manylinux_2_28_$arch" \
    --platform "manylinux_2_34_$arch" --dest "$wheels" "$whl${EXTRAS:+[$EXTRAS]}"

local_base() {
    if ! podman image exists "$LOCAL_BASE"; then
        tar=build/image/base.tar
        sh scripts/make-base-image.sh "$tar"
        podman import --quiet "$tar" "$LOCAL_BASE" >/dev/null
        rm -f "$tar"
    fi
    BASE=$LOCAL_BASE
}

if [ "$BASE" = mmdebstrap ]; then
    local_base
elif ! podman image exists "$BASE" && ! podman pull --quiet "$BASE" >/dev/null; then
    echo "build-image: cannot pull $BASE: making a base from Debian's packages (mmdebstrap)" >&2
    local_base
fi
podman build --quiet --format docker --network none --file Containerfile \
    --build-arg "BASE=$BASE" --build-arg "EXTRAS=$EXTRAS" \
    --label "org.opencontainers.image.version=$version" \
    --label "org.opencontainers.image.revision=$revision" \
    --label "org.opencontainers.image.title=chunkmaster" \
    --tag "$ref" .
echo "built $ref (version $version, revision $revision) on $BASE"
