# sdv-fanout: the two set-up commands are `make run` and `make test`; both install what they need.
SHELL := /bin/bash
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell sha1sum pyproject.toml | cut -c1-12)
PYTEST_ARGS ?=

.PHONY: install run test test-unit test-fast bench bench-quick fuzz java mosquitto chromium clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@$(PY) -c 'import sys; assert sys.version_info >= (3, 11), "sdv-fanout needs Python >= 3.11, found " + sys.version' 
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -e ".[test,bench]" 2>&1 | grep -v "is ignored" || true
	$(BIN)/python -c "import ray, lmdb, pyspark, paho.mqtt, amqtt, structlog" 
	rm -f $(VENV)/.installed-*
	touch $@

# Java 17 for PySpark (Debian package); skipped when a JRE >= 17 is already on PATH.
java:
	@if ! java -version 2>&1 | grep -qE 'version "(1[7-9]|2[0-9])'; then \
		echo "installing Java 17 for PySpark"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless) >/dev/null; \
	fi

# Mosquitto, the peer the benchmarks compare against (Debian package).
mosquitto:
	@command -v mosquitto >/dev/null || test -x /usr/sbin/mosquitto || \
		((apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mosquitto) >/dev/null)

# Headless Chromium and its WebDriver for the console's browser test (Debian packages).
chromium:
	@test -x /usr/bin/chromium && test -x /usr/bin/chromedriver || \
		((apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver) >/dev/null)

run: install
	$(BIN)/python scripts/demo.py

test: install java mosquitto chromium
	$(BIN)/pytest -q -p no:cacheprovider $(PYTEST_ARGS) tests

test-unit: install
	$(BIN)/pytest -q -p no:cacheprovider tests/unit

bench: install java mosquitto
	$(BIN)/python -m benchmarks.run

bench-quick: install java mosquitto
	$(BIN)/python -m benchmarks.run --quick

fuzz: install
	$(BIN)/python scripts/fuzz_codec.py --iterations 1000000 --workers 2

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis var
