#!/usr/bin/env bash
# Installs everything Exactly needs on a fresh Debian machine with Python 3.11:
# ZooKeeper, a Java runtime, Prometheus, nftables and kcat (apt; the metrics tests run a
# real Prometheus server, the network-partition tests cut services off with nft, the
# Kafka protocol tests use kcat, the benchmark's smoke test a Redis server, exactly.postgres
# a PostgreSQL server, the clock-fault tests libfaketime from faketime, the storage-failure
# tests FUSE 3, the image test podman and debootstrap), then a
# virtualenv with the package and its development tools.
#
# `scripts/setup.sh dev` (make dev) installs only what a dev cluster and the SDK need:
# ZooKeeper and a Java runtime, and .venv with the services and the gRPC code generator.
# Safe to run again: steps already done are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-full}
need_apt=()
[ -f /usr/share/java/zookeeper.jar ] || need_apt+=(zookeeper)
command -v java >/dev/null 2>&1 || need_apt+=(default-jre-headless)
if [ "$mode" = full ]; then
[ -x /usr/bin/prometheus ] || need_apt+=(prometheus)
command -v nft >/dev/null 2>&1 || need_apt+=(nftables)
command -v kcat >/dev/null 2>&1 || need_apt+=(kcat)
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
# FUSE 3 (fusermount3, libfuse3) for the disk-fault filesystem of the storage-failure tests
command -v fusermount3 >/dev/null 2>&1 || need_apt+=(fuse3)
# PostgreSQL server for exactly.postgres's tests, exactly-dev up --postgres and the demo
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || need_apt+=(postgresql)
# libfaketime, preloaded into services by the clock-fault tests (tests/clockfault.py)
[ -f /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] || need_apt+=(faketime)
# podman with runc, and debootstrap for the image's Debian base (scripts/build_image.sh; the
# image test of tests/deploy builds it and runs the services from it)
command -v podman >/dev/null 2>&1 || need_apt+=(podman)
command -v runc >/dev/null 2>&1 || need_apt+=(runc)
command -v debootstrap >/dev/null 2>&1 || need_apt+=(debootstrap)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]} with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${need_apt[@]}"
fi

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.installed
# The distribution was called `exactly` before it became `exactly-log` (the PyPI name
# `exactly` is another project's): an editable install of the old name goes first.
drop_old_name() {
  if .venv/bin/pip show -q exactly >/dev/null 2>&1; then .venv/bin/pip uninstall -y -q exactly; fi
}
if [ "$mode" = dev ]; then
  # the services and the SDK, and the gRPC code generator for the step below
  if [ ! -f "$stamp" ] && { [ ! -f "$stamp-dev" ] || [ pyproject.toml -nt "$stamp-dev" ]; }; then
    echo "setup: installing the services and the SDK"
    drop_old_name
    .venv/bin/pip install -q -e '.[server,proto]'
    touch "$stamp-dev"
  fi
elif [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "setup: installing Python packages"
  .venv/bin/pip install -q --upgrade pip
  drop_old_name
  .venv/bin/pip install -q -e '.[dev]'
  touch "$stamp"
fi

# The gRPC modules are generated from protos/ (never committed): regenerate when missing
# or older than any .proto.
gen=clients/exactly_wire/v1/exactly_pb2.py
if [ ! -f "$gen" ] || [ -n "$(find protos -name '*.proto' -newer "$gen" -print -quit)" ]; then
  echo "setup: generating gRPC code from protos/"
  PYTHON=.venv/bin/python bash scripts/gen_protos.sh
fi

# Byte-compile the tree once: every service, CLI and SDK process imports it, and where
# PYTHONDONTWRITEBYTECODE is set Python would compile each module again in each process
# (a partition leader's imports: 1.5 s of CPU against 1.2 s from the caches). compileall
# writes the caches regardless of that variable and skips files whose cache is current.
.venv/bin/python -m compileall -q -j 0 services clients tools bench demo scripts tests > /dev/null

[ "$mode" = dev ] && exit 0

# The compatibility suite's frameworks (tests/compat, make compat), each in its own
# virtualenv under .compat/: their pins may clash with the project's and with each other.
compat_venv() {  # NAME STAMP-KEY PIP-ARGS...
  local dir=.compat/$1 key=$2
  shift 2
  if [ ! -f "$dir/.installed" ] || [ "$(cat "$dir/.installed")" != "$key" ]; then
    echo "setup: installing $* into $dir"
    [ -x "$dir/bin/python" ] || "$PYTHON" -m venv "$dir"
    "$dir/bin/pip" install -q --upgrade pip
    "$dir/bin/pip" install -q "$@"
    echo "$key" > "$dir/.installed"
  fi
}
# Quix Streams pins its own confluent-kafka (librdkafka 2.12): tests/compat/test_quix.py;
# confluent-kafka 2.12.1 alone, for the Kafka-port tests that run that librdkafka in a
# subprocess (.venv has the newest confluent-kafka).
compat_venv quix "quixstreams==3.28.1" quixstreams==3.28.1
compat_venv confluent-2.12 "confluent-kafka==2.12.1" confluent-kafka==2.12.1
# the versions the compatibility table names (docs/kafka-clients.md, "Compatibility")
compat_venv faust "faust-streaming==0.15.3" faust-streaming==0.15.3
compat_venv faststream "faststream[kafka,confluent]==0.7.8" "faststream[kafka,confluent]==0.7.8"
