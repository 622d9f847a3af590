#!/usr/bin/env bash
# podman as the image's build and tests run it: `scripts/podman.sh COMMAND ARG...`.
# Runs with runc (crun refuses a machine whose cgroups mix v1 and v2: "cgroups in hybrid
# mode not supported") and, for the commands that start containers, resource limits no
# higher than podman's own: by default it asks 1048576 open files and 4194304 processes,
# which a root without CAP_SYS_RESOURCE (a sandboxed machine) may not set.
set -euo pipefail
command=$1
shift
limits=()
case "$command" in
  build|run|create)
    nofile=$(ulimit -Hn)
    [ "$nofile" = unlimited ] && nofile=1048576
    limits=(--ulimit "nofile=$nofile:$nofile" --ulimit "nproc=4096:4096") ;;
esac
exec podman --runtime runc "$command" "${limits[@]}" "$@"
