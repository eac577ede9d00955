#!/bin/sh
# The Slurm test runs its own munged, slurmctld and slurmd (config in a temporary folder):
# Debian's slurm-wlm and munge. The packages' own services are stopped and left disabled.
set -eu
if command -v slurmctld >/dev/null 2>&1 && command -v slurmd >/dev/null 2>&1 \
    && command -v munged >/dev/null 2>&1 && command -v sbatch >/dev/null 2>&1; then
    exit 0
fi
if command -v apt-get >/dev/null 2>&1; then
    echo "installing Debian's slurm-wlm and munge for the Slurm test" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        slurm-wlm munge >/dev/null
    for svc in slurmctld slurmd munge; do
        if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
            systemctl disable --now "$svc" >/dev/null 2>&1 || true
        elif [ -x "/etc/init.d/$svc" ]; then
            "/etc/init.d/$svc" stop >/dev/null 2>&1 || true
        fi
    done
else
    echo "Slurm not found and no apt-get to install it: install slurm-wlm and munge" >&2
    exit 1
fi
command -v slurmctld >/dev/null && command -v munged >/dev/null
