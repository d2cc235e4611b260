# One-command set-up: `make run` starts the proxy, `make test` runs every test.
# Both create the virtualenv and install what is missing on a fresh Debian machine.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEBIAN_PACKAGES := gnupg git redis-server ca-certificates chromium chromium-driver
BENCH_PACKAGES  := wrk nginx-light curl
ARGS   ?=

.PHONY: install system-deps debian-packages run test test-unit test-e2e lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): setup.cfg setup.py | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# Debian packages the tests use for real (gpg, git, redis-server, chromium and its driver for the page test);
# installed only when missing.
system-deps:
	@$(MAKE) --no-print-directory debian-packages PACKAGES="$(DEBIAN_PACKAGES)"
	@command -v terraform >/dev/null || echo "WARNING: terraform is not on PATH: the end-to-end tests will be SKIPPED" >&2

debian-packages:
	@missing=""; \
	for p in $(PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then echo "need root to install:$$missing" >&2; exit 1; fi; \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

run: install
	$(BIN)/registry-proxy serve $(ARGS)

test: system-deps lint
	$(BIN)/python -m pytest $(ARGS)

test-unit: install
	$(BIN)/python -m pytest tests/unit $(ARGS)

test-e2e: system-deps install
	$(BIN)/python -m pytest -m e2e $(ARGS)

# ruff, then the import contracts of setup.cfg (the layers; pure modules do no I/O).
lint: install
	$(BIN)/ruff check proxy tests bench
	$(BIN)/lint-imports --no-cache --no-logo

bench: system-deps install
	@$(MAKE) --no-print-directory debian-packages PACKAGES="$(BENCH_PACKAGES)"
	$(BIN)/python bench/run.py $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
