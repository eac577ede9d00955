#!/bin/sh
# Creates each peer's own virtualenv, on demand, under $PEERS_ENVS (default
# ~/.cache/chunkmaster/peers: outside the repo, shared by its work trees).
# Usage: sh bench/peers/install.sh [dlrover] [tfdata] [torchdata] [litdata] [streaming]
#        (no argument: all)
# Never part of `make test`: tensorflow-cpu alone is several hundred MB, each torch peer ~1.5 GB.
set -eu
envs=${PEERS_ENVS:-${XDG_CACHE_HOME:-$HOME/.cache}/chunkmaster/peers}
repo=$(cd "$(dirname "$0")/../.." && pwd)
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

# The loader peers run on torch's CPU build, 2.13.0+cpu, where the package index or a wheel
# folder (pip's find-links) has it; else torch 2.13.0 from PyPI, which brings CUDA's libraries.
# MosaicML Streaming imports torchvision (`import streaming` imports streaming.vision, and
# transformers, which its StreamingDataLoader imports, loads torchvision when present):
# torchvision 0.28.0 is the one that pins torch==2.13.0, and PyPI's build of it links against
# torch's CUDA libraries (libtorch_cuda.so), so under the CPU build it fails at import
# ("operator torchvision::nms does not exist"). Streaming gets PyPI's torch 2.13.0 with CUDA's
# libraries ("===": exactly 2.13.0, not the +cpu wheel that "==" would also take).
make_torch_env() {  # name, pip requirement...
    name=$1; shift
    if ! make_env "$name" "torch==2.13.0+cpu" "$@"; then
        echo "peers: no torch 2.13.0+cpu here: torch 2.13.0 (with CUDA's libraries)" >&2
        make_env "$name" "torch==2.13.0" "$@"
    fi
}

targets=${*:-dlrover tfdata torchdata litdata streaming}
for target in $targets; do
    case $target in
        dlrover) make_env dlrover 'dlrover[k8s]==0.6.1' 'protobuf>=4.25,<5' ;;
        tfdata) make_env tfdata 'tensorflow-cpu==2.21.*' ;;
        # torchdata reads the RecordIO source through the baseline's map-style dataset, so its
        # env has chunkmaster (for its dependencies: a run puts the work tree's src first).
        torchdata) make_torch_env torchdata 'torchdata==0.11.0' numpy "$repo" ;;
        litdata) make_torch_env litdata 'litdata==0.2.76' ;;
        streaming) make_env streaming 'torch===2.13.0' 'torchvision==0.28.0' \
                       'mosaicml-streaming==0.13.0' ;;
        *) echo "peers: unknown peer '$target' (known: dlrover tfdata torchdata litdata" \
               "streaming)" >&2; exit 2 ;;
    esac
done
