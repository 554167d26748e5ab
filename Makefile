# gpuwarden: every set-up step lives here so that `make run` and `make test`
# work on a fresh machine. See README.md.

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# Where the control-plane binaries are cached, keyed by version.
export GPUWARDEN_CACHE ?= $(HOME)/.cache/gpuwarden

.PHONY: venv controlplane tools lint test run bench bench-latency constraints image clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $@

# etcd, kube-apiserver and kube-controller-manager for the test control plane.
controlplane:
	bash tests/controlplane/build.sh

# Test tools from Debian's packages (promtool for the alert-rule tests).
tools:
	@command -v promtool >/dev/null || { \
	  echo "installing promtool (Debian package prometheus)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }

lint: venv
	$(VENV)/bin/ruff check gpuwarden agent scheduler demo tests benchmarks
	$(VENV)/bin/ruff format --check gpuwarden agent scheduler demo tests benchmarks
	$(VENV)/bin/mypy

test: venv controlplane tools lint
	$(VENV)/bin/pytest

# The whole system on this machine (gpuwarden demo): builds the control plane
# first if it is missing, about 11 minutes the first time on two cores.
run: venv controlplane
	$(VENV)/bin/gpuwarden demo

bench: venv
	$(PY) benchmarks/agent_poll.py
	$(PY) benchmarks/scheduler_cycle.py

# Fault-to-condition latency through a real API server (about five minutes).
bench-latency: venv controlplane
	$(PY) benchmarks/agent_latency.py

# Refresh the pinned versions after changing dependencies in pyproject.toml.
constraints:
	rm -rf .constraints-venv && $(PYTHON) -m venv .constraints-venv
	.constraints-venv/bin/pip install --quiet '.[dev]'
	{ echo '# Exact versions for reproducible installs: make venv installs with -c constraints.txt.'; \
	  echo '# Regenerate with `make constraints` after changing pyproject.toml.'; \
	  .constraints-venv/bin/pip freeze | grep -vi '^gpuwarden'; } > constraints.txt
	rm -rf .constraints-venv

image:
	docker build -t gpuwarden:dev .

clean:
	rm -rf $(VENV) build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache
