#!/bin/sh
# tests/deploy/test_kubernetes.py renders every overlay of deploy/kubernetes/ with
# `kubectl kustomize` (no cluster is needed or reached): Debian's kubernetes-client when there is
# no kubectl. Its kubectl (1.20) has kustomize 2.0.3 inside, so the overlays use only what that
# version knows (bases, patchesStrategicMerge, images, configMapGenerator literals), which newer
# versions still read. Nothing else on the machine is changed.
set -eu
command -v kubectl >/dev/null 2>&1 && exit 0
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "installing Debian's kubernetes-client (kubectl) for the Kubernetes test" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        kubernetes-client >/dev/null
else
    echo "no kubectl, and no apt-get as root to install Debian's kubernetes-client" >&2
    exit 1
fi
command -v kubectl >/dev/null 2>&1 && exit 0
echo "kubernetes-client is installed but there is still no kubectl on PATH" >&2
exit 1
