# The whole set-up on a fresh Debian machine: `make test` or `make demo`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test demo bench clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c "import ensurepip" 2>/dev/null || (apt-get update && apt-get install -y python3-venv)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

test: $(STAMP)
	$(BIN)/pytest -q

demo: $(STAMP)
	$(BIN)/hastore demo

bench: $(STAMP)
	$(BIN)/hastore bench store --json

clean:
	rm -rf $(VENV) build *.egg-info
