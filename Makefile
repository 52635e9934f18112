# The whole set-up on a fresh Debian machine: `make test` or `make demo`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# System packages the tests and the demo run for real: ZooKeeper (with its Java runtime).
ZOOKEEPER_JAR := /usr/share/java/zookeeper.jar

.PHONY: test demo bench clean system-packages

$(STAMP): pyproject.toml
	@$(PYTHON) -c "import ensurepip" 2>/dev/null || (apt-get update && apt-get install -y python3-venv)
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
