#!/bin/sh
# A base image's root file system from Debian's packages, for machines that cannot pull one:
# bookworm's minimal variant with python3 (3.11), its venv module and CA certificates, as a tar
# for `podman import`. Documentation, manual pages and translations are left out.
#   sh scripts/make-base-image.sh OUT.tar
set -eu
out=${1:?usage: make-base-image.sh OUT.tar}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
security=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
# --mode=root: this runs as root (CI, the image test); unshare mode needs user namespaces.
mmdebstrap --quiet --variant=minbase --mode=root --format=tar \
    --include=python3,python3-venv,ca-certificates \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    bookworm "$out" \
    "deb $mirror bookworm main" \
    "deb $mirror bookworm-updates main" \
    "deb $security bookworm-security main"
