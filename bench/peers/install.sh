#!/bin/sh
# Creates each peer's own virtualenv under bench/peers/.envs/ (git-ignored), on demand.
# Usage: sh bench/peers/install.sh [dlrover] [tfdata]   (no argument: both)
# Never part of `make test`: tensorflow-cpu alone is several hundred MB.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
envs="$here/.envs"
python=${PEERS_PYTHON:-python3.11}
mkdir -p "$envs"

make_env() {  # name, pip requirement...
    name=$1; shift
    env="$envs/$name"
    if [ -f "$env/.installed" ]; then
        echo "peers: $name env ready at $env"
        return
    fi
    rm -rf "$env"
    "$python" -m venv "$env"
    "$env/bin/python" -m pip install --quiet --upgrade pip
    "$env/bin/python" -m pip install --quiet "$@"
    "$env/bin/python" -m pip freeze > "$env/.installed"
    echo "peers: $name env ready at $env"
}

targets=${*:-dlrover tfdata}
for target in $targets; do
    case $target in
        dlrover) make_env dlrover 'dlrover[k8s]==0.6.1' 'protobuf>=4.25,<5' ;;
        tfdata) make_env tfdata 'tensorflow-cpu==2.21.*' ;;
        *) echo "peers: unknown peer '$target' (known: dlrover tfdata)" >&2; exit 2 ;;
    esac
done
