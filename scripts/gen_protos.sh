#!/usr/bin/env bash
# Regenerates the protobuf/gRPC modules (package exactly.v1, Python package exactly_wire.v1) from protos/.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
mkdir -p clients/exactly_wire/v1
"$PY" -m grpc_tools.protoc -Iprotos --python_out=clients --pyi_out=clients \
  --grpc_python_out=clients protos/exactly_wire/v1/*.proto
test -f clients/exactly_wire/v1/__init__.py || touch clients/exactly_wire/v1/__init__.py
