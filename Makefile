# sdv-fanout: the two set-up commands are `make run` and `make test`; both install what they need.
SHELL := /bin/bash
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell sha1sum pyproject.toml | cut -c1-12)
PYTEST_ARGS ?=

.PHONY: install native run test test-unit test-fast bench bench-quick fuzz java mosquitto peers nodemqtt chromium valgrind clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@$(PY) -c 'import sys; assert sys.version_info >= (3, 11), "sdv-fanout needs Python >= 3.11, found " + sys.version' 
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -e ".[test,bench,native]" 2>&1 | grep -v "is ignored" || true
	$(BIN)/python -c "import ray, lmdb, pyspark, paho.mqtt, amqtt, structlog" 
	rm -f $(VENV)/.installed-*
	touch $@

# Java 17 for PySpark (Debian package); skipped when a JRE >= 17 is already on PATH.
java:
	@if ! java -version 2>&1 | grep -qE 'version "(1[7-9]|2[0-9])'; then \
		echo "installing Java 17 for PySpark"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless) >/dev/null; \
	fi

# Mosquitto, the peer the benchmarks compare against, and its clients (mosquitto_pub/sub: the
# third-party TLS client of tests/security) (Debian packages, installed together).
mosquitto:
	@(command -v mosquitto >/dev/null || test -x /usr/sbin/mosquitto) && command -v mosquitto_sub >/dev/null || \
		((apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mosquitto mosquitto-clients) >/dev/null)

# Redis (Streams) and NATS (JetStream), the peers of benchmarks/topics_bench.py's durable topics (Debian packages;
# redis-tools brings redis-benchmark, the compiled client that drives Redis in its append runs).
peers:
	@(command -v redis-server >/dev/null || test -x /usr/bin/redis-server) && \
		(command -v redis-benchmark >/dev/null || test -x /usr/bin/redis-benchmark) && \
		(command -v nats-server >/dev/null || test -x /usr/sbin/nats-server) || \
		((apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools nats-server) >/dev/null)

# MQTT.js (Debian node-mqtt, run by nodejs with NODE_PATH=/usr/share/nodejs): a third-party MQTT 5 client
# of tests/integration/test_mqtt5_clients.py (Debian packages, installed together).
nodemqtt:
	@command -v node >/dev/null && test -d /usr/share/nodejs/mqtt || \
		((apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs node-mqtt) >/dev/null)

# The compiled MQTT load generator of the benchmarks (benchmarks/cfleet/*.c, libc only) -> build/cfleet.
.PHONY: cfleet
CFLEET_CC ?= gcc
CFLEET_CFLAGS ?= -O2 -std=gnu11 -Wall -Wextra
cfleet: build/cfleet
build/cfleet: $(wildcard benchmarks/cfleet/*.c benchmarks/cfleet/*.h)
	@mkdir -p build
	$(CFLEET_CC) $(CFLEET_CFLAGS) -o $@ $(filter %.c,$^) -lm

# Headless Chromium and its WebDriver for the console's browser test (Debian packages).
chromium:
	@test -x /usr/bin/chromium && test -x /usr/bin/chromedriver || \
		((apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver) >/dev/null)

# valgrind for `python -m benchmarks.instructions` (instructions per event under callgrind: A/B runs that do not
# move with the machine's load) (Debian package).
valgrind:
	@command -v valgrind >/dev/null || \
		((apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind) >/dev/null)

# The hot-path modules of fanout.mqtt, fanout.node, fanout.dispatcher and storage compiled with mypyc (fanout/native.py);
# a no-op when they match their sources. A failed build (no C compiler) leaves the Python sources running,
# which are always correct.
# The build's own output says when it failed; the filter drops setuptools' compiler lines.
native: install
	@$(BIN)/python -m scripts.build_native 2>&1 | { grep -vE '^(gcc|x86_64-linux-gnu-gcc|creating|copying|running|building) |_BetaConfiguration|warnings.warn' || true; }

run: install native
	$(BIN)/python -m scripts.demo

# FANOUT_EXPECT_NATIVE: tests/unit/test_native.py then fails if the hot path is not running compiled.
test: install native java mosquitto peers nodemqtt chromium
	FANOUT_EXPECT_NATIVE=1 $(BIN)/pytest -q -p no:cacheprovider $(PYTEST_ARGS) tests

test-unit: install native
	FANOUT_EXPECT_NATIVE=1 $(BIN)/pytest -q -p no:cacheprovider tests/unit

bench: install native java mosquitto peers cfleet
	$(BIN)/python -m benchmarks.run

bench-quick: install native java mosquitto peers
	$(BIN)/python -m benchmarks.run --quick

fuzz: install native
	$(BIN)/python -m scripts.fuzz_codec --iterations 1000000 --workers 2

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis var fanout/_compiled fanout/_compiled.new fanout/mqtt/_compiled
