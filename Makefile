# Resilient Training Operator — developer entry points. `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# make test's pytest workers (pytest-xdist): the shared-cluster tests on one, the rest beside
PYTEST_JOBS ?= 2
# the goodput soak's features in `make bench`, e.g. --no-in-place --fast-every 0 (default: all on)
GOODPUT_ARGS ?=
E2E := $(BIN)/python -m e2e.cluster
NODES ?= 8

.PHONY: help install lint fmt test test-unit test-integration test-e2e bench drill crds demo demo-down clean \
	cluster-build cluster-up cluster-down cluster-status e2e-kind chart-crds chart-test images \
	node-packages release

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  \033[1m%-18s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml trainer-shim/pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e './trainer-shim[s3,torch]' -e '.[dev]'
	@touch $@

install: $(STAMP) ## create .venv and install everything (both packages, all extras, test tools, torch)

lint: install ## ruff (lint + format check), mypy --strict, import-linter layer contracts
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/rtj crds --check

fmt: install ## apply ruff formatting and safe fixes
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

test: install cluster-build node-packages ## every test level (unit, property, crash, S3, torch drill, cluster); skips fail
	$(BIN)/pytest -n $(PYTEST_JOBS) --dist loadgroup --durations=40 $(PYTEST_ARGS)

test-unit: install cluster-build ## unit and property tests only (chart tests need helm/promtool)
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

test-integration: install cluster-build node-packages ## real files, crashes, loopback S3, torchrun, the local cluster
	$(BIN)/pytest tests/integration $(PYTEST_ARGS)

test-e2e: install cluster-build ## the end-to-end fault drills (e2e/scenarios), the pod runner and the demo story
	$(BIN)/pytest e2e tests/integration/cluster/test_pod_runner.py $(PYTEST_ARGS)

bench: install ## benchmarks, reported as ratios against a side-by-side baseline
	$(BIN)/python -m bench.checkpoint_protocol --markdown bench/results/checkpoint-protocol.md
	$(BIN)/python -m bench.torch_state --markdown bench/results/torch-state.md
	$(BIN)/python -m bench.fast_tier --markdown bench/results/fast-tier.md
	$(BIN)/python -m bench.operator_control
	$(BIN)/python -m bench.operator_scale
	$(BIN)/python -m bench.progress_overhead
	$(BIN)/python -m bench.boundary_cost --json bench/results/boundary-cost.json
	$(BIN)/python -m bench.trainer_cpu --markdown bench/results/trainer-cpu.md --json bench/results/trainer-cpu.json
	$(BIN)/python -m bench.agent_cpu --json bench/results/agent-cpu.json
	$(BIN)/python -m bench.sdc_overhead --json bench/results/sdc-overhead.json
	$(BIN)/python -m bench.write_limit --markdown bench/results/write-limit.md
	$(BIN)/python -m bench.preflight_cost --markdown bench/results/preflight-cost.md
	$(BIN)/python -m bench.hang_detection --markdown bench/results/hang-detection.md
	$(BIN)/python -m bench.poll_round --markdown bench/results/poll-round.md
	$(BIN)/python -m bench.node_loss --markdown bench/results/node-loss.md
	$(BIN)/python -m bench.in_place --markdown bench/results/in-place.md
	$(BIN)/python -m bench.in_place_scale --markdown bench/results/in-place-scale-latest.md
	$(BIN)/python -m bench.goodput_model --markdown bench/results/goodput-model.md
	$(BIN)/python -m bench.goodput --steps 6000 --mtbf 60 $(GOODPUT_ARGS)
	$(BIN)/python -m bench.goodput_baseline --steps 6000 --mtbf 60 --against bench/results/goodput.json
	$(BIN)/python -m bench.goodput_baseline --steps 6000 --mtbf 60 --launcher nvrx --against bench/results/goodput.json
	$(BIN)/python -m bench.goodput_baseline --steps 6000 --mtbf 60 --launcher torchft --against bench/results/goodput.json
	$(BIN)/python -m bench.operator_scale_jobs --markdown bench/results/operator-scale-jobs.md
	$(BIN)/python -m bench.elastic_scarce --markdown bench/results/elastic-scarce.md

drill: install ## exact-resume drill: torchrun jobs (2 ranks, gloo, CPU) killed and resumed
	$(BIN)/python drills/torch_drill.py $(DRILL_ARGS)

cluster-build: install ## build the cluster's programs, kubectl, helm, promtool, kubelet from Go modules (cached in ~/.cache/rtj/bin)
	$(E2E) build --tools --node

node-packages: ## containerd, runc and CNI plugins from Debian for the real node (apt-get as root; once)
	@bash e2e/cluster/node-packages.sh

cluster-up: cluster-build ## start the local cluster (NODES simulated 8-GPU nodes); prints the kubeconfig path
	$(E2E) up --nodes $(NODES)

cluster-down: install ## stop it; fails if a process or a listening port is left behind
	$(E2E) down

cluster-status: install ## processes, ports and node readiness (exit 3 when not running)
	$(E2E) status

e2e-kind: install ## the cluster scenarios against kind (needs a running Docker daemon)
	$(BIN)/python -m e2e.kind all

crds: install ## regenerate crds/ from the pydantic models (never edit crds/ by hand)
	$(BIN)/rtj crds --write
	$(MAKE) --no-print-directory chart-crds

chart-crds: ## copy the generated CRD into the Helm chart (a test compares them byte for byte)
	cp crds/resilienttrainingjobs.yaml charts/resilient-training-operator/crds/

chart-test: install cluster-build node-packages ## helm lint/template, schema, promtool rules, install + RBAC in the harness
	$(BIN)/pytest tests/unit/chart tests/integration/chart $(PYTEST_ARGS)

images: ## rtj-operator + rtj-resolver OCI archives, SBOMs in dist/images (no daemon, no registry; Python >= 3.11)
	$(PYTHON) -m images build $(IMAGES_ARGS)

release: install ## images, chart package, wheels + sdists, hash-pinned requirements, SHA256SUMS in dist/release (nothing published; docs/release.md)
	$(BIN)/python -m release build

demo: install ## the whole story with real training and a GPU fault; summary + demo-output/loss.svg (docs/demo.md)
	$(BIN)/python -m e2e.demo up

demo-down: install ## stop everything `make demo` left running (fails if a process is left)
	$(BIN)/python -m e2e.demo down

clean: ## remove the virtualenv and caches
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis .import_linter_cache
