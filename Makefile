# The two commands: `make run` (portal on embedded defaults) and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test lint typecheck pytest venv bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

## Set up and run the portal on its embedded defaults (SQLite + bundled redis-server).
## The one place DEBUG is the default: everything else needs SECRET_KEY (portal/settings/safety.py).
run: $(STAMP)
	DJANGO_SETTINGS_MODULE=portal.settings.dev $(PY) manage.py runstack

## Set up and pass the tests: lint, types, then pytest.
test: $(STAMP) lint typecheck pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

pytest: $(STAMP)
	$(VENV)/bin/pytest $(PYTEST_ARGS)

bench: $(STAMP)
	for b in bench/*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) var .mypy_cache .ruff_cache
