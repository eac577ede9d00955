# The two entry points: `make demo` and `make test`. Both start from nothing. `make test-fast`:
# the pure and in-process tests only (no master or trainer processes, etcd, S3, containers).
VENV    ?= .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed

.PHONY: demo test test-fast lint bench peers fuzz soak soak-hostile soak-loader clean proto image test-cluster dist

$(STAMP): pyproject.toml scripts/bootstrap.sh
	sh scripts/bootstrap.sh $(VENV)
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m chunkmaster.demo

test: $(STAMP)
	sh scripts/ensure-etcd.sh
	sh scripts/ensure-kubectl.sh
	sh scripts/ensure-chromium.sh
	$(PY) -m ruff check src tests bench
	$(PY) -m ruff format --check src tests bench
	$(PY) -m mypy
	$(PY) -m pytest $(PYTEST_ARGS)

# Tests that start processes are marked `slow` by tests/conftest.py; these are the others.
test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) bench/recordio_bench.py
	$(PY) bench/dispatch_bench.py
	$(PY) bench/stream_bench.py
	$(PY) bench/failover_bench.py
	$(PY) bench/session_bench.py
	$(PY) bench/progress_bench.py
	$(PY) bench/formats_bench.py
	$(PY) bench/formats_more_bench.py
	$(PY) bench/objstore_bench.py
	$(PY) bench/shuffle_bench.py
	$(PY) bench/mixture_bench.py

# Side by side with DLRover and tf.data service; each peer's virtualenv is made on first use.
peers: $(STAMP)
	$(PY) bench/peers/run.py

# Ten minutes of kills, etcd freezes, restarts and a full disk under 64 trainers (needs root
# for etcd's tmpfs; without it the disk does not fill).
soak: $(STAMP)
	sh scripts/ensure-etcd.sh
	$(PY) bench/soak.py

# Issue 19's schedule: master SIGKILLs, a full store disk, a frozen trainer and a poison chunk
# under three committing trainers, then a connection flood (needs root for the tmpfs).
soak-hostile: $(STAMP)
	$(PY) bench/hostile_soak.py

# Issue 27's Loader soak: a ranked Loader trainer that breaks out of its loop before every
# checkpoint, SIGKILLed and restarted under the same restore key, the master SIGKILLed, stray
# ranks beside it; every record of every pass trained on once in the model it ends with.
soak-loader: $(STAMP)
	$(PY) bench/loader_soak.py

fuzz: $(STAMP)
	$(PY) bench/fuzz_rpc.py --examples 3000

lint: $(STAMP)
	$(PY) -m ruff check src tests bench
	$(PY) -m ruff format --check src tests bench
	$(PY) -m mypy

proto: $(STAMP)
	$(PY) -m grpc_tools.protoc -Isrc --python_out=src --pyi_out=src --grpc_python_out=src src/chunkmaster/rpc/master.proto

clean:
	rm -rf $(VENV) build dist src/chunkmaster.egg-info .pytest_cache .mypy_cache .ruff_cache

# The sdist and the wheel in dist/, checked by `twine check` (scripts/dist.sh; docs/install.md).
dist: $(STAMP)
	PY=$(PY) sh scripts/dist.sh dist

# The container image IMAGE:TAG, chunkmaster:dev by default; `make image
# IMAGE=registry.example.com/chunkmaster TAG=0.1.0` tags what the Kubernetes overlays name (their
# `images:` entry), with OCI labels for the version and the git revision (Containerfile;
# scripts/build-image.sh says how; where podman's defaults fail, as on CI's machines:
# CONTAINERS_CONF=tests/deploy/podman/containers.conf).
IMAGE ?= chunkmaster
TAG   ?= dev
image: $(STAMP)
	sh scripts/ensure-podman.sh
	PY=$(PY) IMAGE=$(IMAGE) TAG=$(TAG) sh scripts/build-image.sh

# The deployment tests that need more than Python: the image built and run in a podman pod,
# the sbatch script under a real Slurm, the DDP example against a TLS master (each installs
# what it needs: scripts/ensure-*.sh), the wheel installed in a fresh virtualenv.
test-cluster: $(STAMP)
	sh scripts/ensure-podman.sh
	sh scripts/ensure-slurm.sh
	CHUNKMASTER_CLUSTER_TESTS=1 $(PY) -m pytest -m cluster tests/deploy $(PYTEST_ARGS)
