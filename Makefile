# Exactly: every target installs what it needs first (scripts/setup.sh).
PY := .venv/bin/python
RUN_DIR ?= .run

.PHONY: setup dev demo spark-demo test unit unit-waits compat soak fuzz upgrade-test image proto bench docs down clean

setup:
	@bash scripts/setup.sh

# Only what a dev cluster and the SDK need (README.md, "Quick start"): ZooKeeper, Java, .venv
# with the services; make setup (every other target) adds the test tools and the rest.
dev:
	@bash scripts/setup.sh dev

# make demo DEMO_ARGS="--replication-factor 3 --txn-coordinators 2 --group-coordinators 2"
demo: setup
	$(PY) -m demo.purchases --dir $(RUN_DIR)/demo $(DEMO_ARGS)

spark-demo: setup
	$(PY) -m demo.spark_purchases --dir $(RUN_DIR)/spark-demo

# Test files run in TEST_WORKERS processes (pytest-xdist), each file's tests in one of them, so a
# file's module-scoped cluster starts once; each worker has its own ZooKeeper server.
TEST_WORKERS ?= 3
test: setup
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --durations=25 tests

unit: setup
	$(PY) -m pytest -q -p no:cacheprovider tests/unit

# The unit tests again, failing when one waited on real time (tests/real_waits.py; one process,
# so the wrappers see every wait).
unit-waits: setup
	$(PY) -m pytest -q -p no:cacheprovider -p tests.real_waits tests/unit

# The compatibility suite at full size (docs/kafka-clients.md, "Compatibility"): KafkaJS 2.2.4 copying 5,000 ids
# through two SIGKILLs, faust-streaming, FastStream, kafka-python, aiokafka, kcat, Quix Streams
# against a dev cluster; `make test` runs the same tests at a short size.
compat: setup
	EXACTLY_COMPAT_FULL=1 $(PY) -m pytest -q -s -p no:cacheprovider --timeout 3600 tests/compat

# Long runs kept out of `make test` (which runs the same tests at a smaller size):
# compaction of the internal topics after 50,000 transactions and 50,000 offset commits;
# 100,000 idempotent InitProducerId calls against producer-id bindings (make test runs 10,000);
# 20,000 raw connections that never start TLS against a partition leader (make test: 4,000);
# 1,000 connections without credentials (100 MB size prefixes, 40 MB user names, silence after
# TLS) against a leader's Kafka port, its memory measured (make test: 300);
# the transactional copy under clock faults with 20,000 records (make test: 3,000);
# the copier under ZooKeeper faults with 20,000 records, ZooKeeper down 30 s and every process's
# session expired in turn (make test: 1,800 records, 10 s, two processes);
# the copier system test through EIO on a leader's log directory with 20,000 records (make
# test: 6,000), beside the other disk-fault tests, whose crash test of transactions aborted at
# the log end runs 20 crash cycles (make test: 2); an idle stream kept 240 s on the default
# keepalive settings without a GOAWAY (make test: 30 s with the keepalive scaled down to 3 s).
soak: setup
	EXACTLY_COMPACTION_TXNS=50000 $(PY) -m pytest -q -s -p no:cacheprovider --timeout 3600 tests/integration/test_compaction.py
	EXACTLY_PID_SOAK_CALLS=100000 $(PY) -m pytest -q -s -p no:cacheprovider --timeout 3600 \
	  tests/integration/test_producer_id_bindings.py
	EXACTLY_CONNECTION_FLOOD=20000 $(PY) -m pytest -q -s -p no:cacheprovider --timeout 900 tests/integration/test_connections.py
	EXACTLY_PREAUTH_FLOOD=1000 $(PY) -m pytest -q -s -p no:cacheprovider --timeout 900 \
	  tests/integration/test_unauthenticated.py::test_a_client_without_credentials_costs_a_few_kilobytes_per_connection
	EXACTLY_ATTACK_P50=1 $(PY) -m pytest -q -s -p no:cacheprovider --timeout 900 \
	  tests/integration/test_unauthenticated.py::test_under_attack_a_client_produces_and_logs_in_as_before \
	  tests/integration/test_quota_limits.py::test_quotas_hold_whatever_the_client_does
	EXACTLY_CLOCK_RECORDS=20000 $(PY) -m pytest -q -s -p no:cacheprovider --timeout 1800 tests/system/test_clock_faults_system.py
	EXACTLY_ZK_FAULT_SOAK=1 $(PY) -m pytest -q -s -p no:cacheprovider --timeout 1800 tests/system/test_zookeeper_faults.py
	EXACTLY_DISK_SOAK=1 $(PY) -m pytest -q -s -p no:cacheprovider --timeout 1800 tests/integration/test_disk_faults.py \
	  "tests/system/test_transactions_system.py::test_copy_is_exactly_once_through_failures[disk]"
	EXACTLY_KEEPALIVE_IDLE_S=240 $(PY) -m pytest -q -s -p no:cacheprovider --timeout 900 tests/integration/test_keepalive.py

# The rolling upgrade from the previous release in all four orders x security (make test runs
# two of them and the downgrade; docs/operating/upgrades.md).
upgrade-test: setup
	EXACTLY_UPGRADE_FULL=1 $(PY) -m pytest -q -s -p no:cacheprovider --timeout 3600 tests/system/test_rolling_upgrade.py

# Hostile input: 2,000 generated requests per RPC against a real cluster (make test runs 60);
# the figures go to $(RUN_DIR)/fuzz-report.json (docs/security.md, "Hostile input").
FUZZ_REQUESTS ?= 2000
fuzz: setup
	mkdir -p $(RUN_DIR)
	EXACTLY_FUZZ_REQUESTS=$(FUZZ_REQUESTS) EXACTLY_FUZZ_REPORT=$(abspath $(RUN_DIR))/fuzz-report.json \
		$(PY) -m pytest -q -s -p no:cacheprovider --timeout 7200 \
		--basetemp=$(abspath $(RUN_DIR))/fuzz-cluster tests/integration/test_fuzz.py

# The services' image with podman, tagged exactly:<version of pyproject.toml>, from a Debian base
# made here with debootstrap (scripts/build_image.sh: IMAGE_REPOSITORY=registry.example.com/exactly,
# IMAGE_BASE=python:3.11-slim to pull that base instead). make test builds it too and runs the
# Helm chart's round trip from it (tests/deploy/test_image.py).
image:
	@bash scripts/build_image.sh

proto: setup
	PYTHON=$(PY) bash scripts/gen_protos.sh

# Every figure of the benchmarks page (docs/benchmarks.md) in one run (bench/suite.py); the results go to
# $(RUN_DIR)/bench/results.json. make bench BENCH_ARGS="--quick" | "--profile DIR" | sizes (--help).
bench: setup
	@command -v redis-benchmark >/dev/null 2>&1 || { echo "bench: installing redis-server and redis-tools with apt-get"; \
	  export DEBIAN_FRONTEND=noninteractive; apt-get update -q && apt-get install -y -q --no-install-recommends redis-server redis-tools; }
	$(PY) -m pip install -q -r bench/requirements.txt
	$(PY) -m bench --dir $(RUN_DIR)/bench --out $(RUN_DIR)/bench/results.json $(BENCH_ARGS)

# The documentation site (mkdocs.yml, docs/) into site/; make test builds it too (tests/docs).
docs: setup
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

down:
	-$(PY) -m exactly_tools.devcluster down --dir $(RUN_DIR)/demo

clean: down
	rm -rf $(RUN_DIR)
