#!/bin/sh
# The image test builds a Debian root file system with mmdebstrap, imports it into podman and
# runs containers with runc in a pod: Debian's mmdebstrap, podman, runc, catatonit and netavark.
# Nothing else is changed on the machine: the test points podman at its own containers.conf and
# storage.
set -eu
need=""
command -v mmdebstrap >/dev/null 2>&1 || need="$need mmdebstrap"
command -v podman >/dev/null 2>&1 || need="$need podman"
command -v runc >/dev/null 2>&1 || need="$need runc"
command -v catatonit >/dev/null 2>&1 || need="$need catatonit"
# netavark: the network backend tests/deploy/podman/containers.conf names. podman looks for it
# in its helper directories, not on PATH; without it every podman command fails ("could not
# find netavark"). Debian's podman does not pull it in: its containers-common takes the first
# container-network-stack, the CNI plugins, and recommends netavark only.
has_netavark() {
    for dir in /usr/local/libexec/podman /usr/local/lib/podman /usr/libexec/podman /usr/lib/podman; do
        if [ -x "$dir/netavark" ]; then return 0; fi
    done
    return 1
}
has_netavark || need="$need netavark"
[ -n "$need" ] || exit 0
if command -v apt-get >/dev/null 2>&1; then
    echo "installing Debian's$need for the image test" >&2
    apt-get update -qq
    # catatonit: the pause process of a pod's infra container (the pod's shared namespaces).
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $need >/dev/null
else
    echo "missing$need and no apt-get to install them" >&2
    exit 1
fi
has_netavark && exit 0
echo "netavark is still not in podman's helper directories (/usr/lib/podman, ...): install" \
    "Debian's netavark, or set network_backend in tests/deploy/podman/containers.conf" >&2
exit 1
