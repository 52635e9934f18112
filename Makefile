# The whole set-up on a fresh Debian machine: `make test` or `make demo`.
# The interpreter the venv is built on: the distribution's CPython (/usr/bin/python3) when it
# is 3.11 or newer, else the first python3 on PATH. Debian's interpreter is linked statically
# and built with its packaging's optimisations: on this machine kind it ran a pure-Python loop
# 1.8x as fast as pyenv's CPython 3.11 (a shared libpython, no --enable-optimizations), and
# hastore's nodes spent 15-25% less CPU a message (docs/sync-performance.md, stop 25).
# `make PYTHON=...` picks another.
SYSTEM_PYTHON_FITS := $(shell /usr/bin/python3 -c 'import sys; print(sys.version_info >= (3, 11) or "")' 2>/dev/null)
PYTHON ?= $(if $(SYSTEM_PYTHON_FITS),/usr/bin/python3,python3)
# the interpreter's real path: a venv built on another one is rebuilt
PYTHON_REAL := $(shell $(PYTHON) -c 'import os, sys; print(os.path.realpath(sys.executable))' 2>/dev/null)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed$(subst /,-,$(PYTHON_REAL))
VENV_BASE = $(BIN)/python -c 'import os, sys; print(os.path.realpath(sys._base_executable))'
# System packages the tests and the demo run for real: ZooKeeper (with its Java runtime).
ZOOKEEPER_JAR := /usr/share/java/zookeeper.jar

.PHONY: test demo bench clean system-packages

$(STAMP): pyproject.toml
	@$(PYTHON) -c "import ensurepip" 2>/dev/null || (apt-get update && apt-get install -y python3-venv)
	@test ! -x $(BIN)/python || [ "$$($(VENV_BASE))" = "$(PYTHON_REAL)" ] || \
		(echo "$(VENV) was built on another interpreter: rebuilding it on $(PYTHON_REAL)"; rm -rf $(VENV))
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

system-packages:
	@test -f $(ZOOKEEPER_JAR) && command -v java >/dev/null || \
		(apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends zookeeper)
	@# docker-compose checks compose/ (`docker-compose config`, tests/compose); no Docker engine needed
	@command -v docker-compose >/dev/null || \
		(apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends docker-compose)
	@# redis-server: the peer of `hastore bench replicate --peer redis` (the bench starts its own, by pid)
	@command -v redis-server >/dev/null || \
		(apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends redis-server)

test: $(STAMP) system-packages
	$(BIN)/pytest -q

demo: $(STAMP) system-packages
	$(BIN)/hastore demo

bench: $(STAMP)
	$(BIN)/hastore bench store --json

clean:
	rm -rf $(VENV) build *.egg-info
