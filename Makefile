# FreeToken: `make serve` runs the server on the embedded tiny model; `make test` runs the tests.
# Both create .venv/ and install pinned dependencies on first use (CPU torch 2.13.0).
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
PYTHON ?= python3
ARGS   ?=
PYTEST_ARGS ?=

.PHONY: install serve test test-fast clients clean

# Rebuilt when the dependencies or the C++ kernel sources change (the editable install compiles csrc/).
CSRC_SOURCES := $(wildcard csrc/*.py csrc/src/*.cpp csrc/src/*.h csrc/bindings/*.cpp csrc/bindings/*.h csrc/include/freetoken/*.h)

$(STAMP): pyproject.toml $(CSRC_SOURCES)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

serve: $(STAMP)
	$(VENV)/bin/freetoken serve $(ARGS)

# Installs the real agent clients (npm/PyPI) into the cache dir, then runs every test.
test: $(STAMP) clients
	$(VENV)/bin/pytest $(PYTEST_ARGS)

# Everything except the real-client acceptance tests.
test-fast: $(STAMP)
	$(VENV)/bin/pytest -m "not clients" $(PYTEST_ARGS)

clients: $(STAMP)
	$(PY) -m tests.clients.install

clean:
	rm -rf $(VENV) build *.egg-info
