# FreeToken: `make serve` runs the server on the embedded tiny model; `make test` runs the tests.
# Both create .venv/ and install pinned dependencies on first use (CPU torch 2.13.0).
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
PYTHON ?= python3
ARGS   ?=
PYTEST_ARGS ?=

.PHONY: install serve test test-fast clients browser clean

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

# Installs the real agent clients (npm/PyPI) into the cache dir and chromium, then runs every test.
test: $(STAMP) clients browser
	$(VENV)/bin/pytest $(PYTEST_ARGS)

# Everything except the real-client acceptance tests.
test-fast: $(STAMP) browser
	$(VENV)/bin/pytest -m "not clients" $(PYTEST_ARGS)

clients: $(STAMP)
	$(PY) -m tests.clients.install

# Debian's chromium + chromedriver for the /ui browser test (tests/server/test_ui_browser.py, which
# is skipped without them); apt-get runs only when one is missing, through sudo when not root.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif command -v apt-get >/dev/null; then \
		$(SUDO) apt-get install -y chromium chromium-driver \
		|| { $(SUDO) apt-get update && $(SUDO) apt-get install -y chromium chromium-driver; } \
		|| echo "make browser: apt-get could not install chromium chromium-driver; the /ui browser test will be skipped"; \
	else \
		echo "make browser: no apt-get here; install chromium and chromedriver yourself, else the /ui browser test is skipped"; \
	fi

clean:
	rm -rf $(VENV) build *.egg-info
