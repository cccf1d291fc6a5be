# gpumedic's front door. `make help` lists the targets.
# A fresh machine needs only python3 (3.11+): the first target that needs it creates .tools/
# with uv (from PyPI), then .venv/ with every workspace package from the lock file.

.DEFAULT_GOAL := help
SHELL := /bin/bash

PYTHON ?= python3
UV_VERSION := 0.13.9
TOOLS := .tools
UV := $(TOOLS)/bin/uv
VENV := .venv
PY := $(VENV)/bin/python
export UV_PYTHON_DOWNLOADS := never
export UV_PROJECT_ENVIRONMENT := $(VENV)

MANIFESTS := pyproject.toml uv.lock $(wildcard libs/*/pyproject.toml services/*/pyproject.toml)

.PHONY: help install examples debian-packages demo up test test-long test-slow fuzz chaos test-fast bench proto proto-check lock clean images compose-test pods-test

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  make %-12s %s\n", $$1, $$2}'

$(UV):
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/pip install --quiet uv==$(UV_VERSION)

# Bytecode is compiled once here: services restart under supervision (and tests start hundreds of
# processes) where PYTHONDONTWRITEBYTECODE is set, and compiling every import again costs seconds each.
$(VENV)/.installed: $(UV) $(MANIFESTS) services/report-builder/vendor_assets.py
	$(UV) sync --all-packages --frozen --compile-bytecode --python "$$(command -v $(PYTHON))"
	$(PY) -m compileall -q libs services sim src
	$(PY) services/report-builder/vendor_assets.py
	@touch $@

install: $(VENV)/.installed ## create .venv and install every service, lib and test tool

NODE_EXAMPLE := examples/node
$(NODE_EXAMPLE)/node_modules/.installed: $(NODE_EXAMPLE)/package-lock.json
	@command -v npm >/dev/null || { echo "examples/node needs Node.js and npm (Debian: apt-get install nodejs npm)"; exit 1; }
	npm ci --prefix $(NODE_EXAMPLE) --no-audit --no-fund
	@touch $@

examples: $(NODE_EXAMPLE)/node_modules/.installed ## install the Node example consumer's packages (npm ci)

demo: install ## the main job: embedded stack + simulated fleet; one zombie job found, killed over SSH, verified
	$(VENV)/bin/gpumedic demo

up: install ## the embedded stack (nats-server, SQLite, six services) until Ctrl-C
	$(VENV)/bin/gpumedic up

# The suite mostly waits on real servers and subprocesses, so more workers than cores pay off;
# each worker starts its own nats-server, PostgreSQL and sshd on free ports.
TEST_WORKERS ?= 6
# The long runs are each a whole stack busy with work: fewer at once, or they starve each other.
LONG_WORKERS ?= 4

debian-packages: ## install what the tests need from Debian (as root), or say the one command to run
	@tests/debian-packages.sh

test: debian-packages install examples ## every test but the long and slow ones: unit, contract, store on SQLite and PostgreSQL, real sshd, end to end; about 5 minutes
	$(PY) -m pytest -n $(TEST_WORKERS) -m "not long and not slow and not compose and not pods"

test-long: debian-packages install examples ## the whole-stack runs of half a minute or more each: the demo, gpumedic up, a scored scenario, the benchmarks' short mode, the console over the demo in a browser
	$(PY) -m pytest -n $(LONG_WORKERS) -m "long and not slow"

test-slow: install ## the slow whole-stack runs (the worker pool on a demand curve, jobs asked to checkpoint, the NATS cluster, supervision, the chaos slice, a 50-node burst against the breaker), alone so their timing holds
	$(PY) -m pytest -m slow

fuzz: install ## property-based fuzzing of every consumer on a real nats-server, 100 batches per service (make test runs 3)
	GPUMEDIC_FUZZ_EXAMPLES=100 $(PY) -m pytest -n $(TEST_WORKERS) tests/integration/test_fuzz_consumers.py -p no:cacheprovider

ENGINE := deploy/images/engine.sh

images: install ## build every compose image here, with no image registry (a Debian base from Debian's packages, wheels from uv.lock)
	$(ENGINE) ensure
	UV=$(UV) PIP=$(TOOLS)/bin/pip deploy/images/build.sh

compose-test: images ## compose up on a Docker engine with the demo fleet: health checks, one zombie from detection to verified fix, down with nothing left
	$(PY) -m pytest -m compose tests/compose -p no:cacheprovider; status=$$?; $(ENGINE) release; exit $$status

pods-test: install ## enroll on a container shaped like a rented pod (no systemd, non-root user, behind a jump host): heal, upgrade, unenroll
	$(ENGINE) ensure
	$(PY) -m pytest -m pods tests/pods -p no:cacheprovider; status=$$?; $(ENGINE) release; exit $$status

chaos: install ## 1,000 zombie jobs on a 3-server NATS cluster while a service is SIGKILLed every 4 s and a nats-server restarted every 5 s; prints lost, doubled, missing
	$(VENV)/bin/gpumedic chaos --var var/chaos

FAST_TIER := tests/zombie_detector tests/node_sampler tests/remediator tests/autoscaler tests/leader_health tests/report_builder tests/incidents tests/contract

test-fast: install ## every service's tests that start no server (handlers on the in-memory bus, logic, contracts): under a minute on two cores
	$(PY) -m pytest -n auto -m "not servers and not slow" $(FAST_TIER)  # one worker a core: the tier is all CPU

bench: install ## benchmarks; each prints ratios measured side by side in one run
	$(PY) -m benchmarks

proto: install ## regenerate proto/ (schemas, subjects, AsyncAPI, examples) from the event models
	$(VENV)/bin/gpumedic proto

proto-check: install ## fail if proto/ is stale or a change breaks v1 compatibility
	$(VENV)/bin/gpumedic proto --check

lock: $(UV) ## refresh uv.lock after changing a pyproject.toml
	$(UV) lock

clean: ## remove the embedded stack's data (var/); keeps .venv
	rm -rf var
