#!/bin/sh
# Starts one Exactly service with its settings from properties files:
#
#   launch.sh ROLE FILE.properties... -- ARG...
#
# runs `python -m services.ROLE ARG... --set key=value ...`, one --set per line of the
# properties files in order (blank lines and lines starting with # or ! are skipped; a
# key set again later wins). When EXACTLY_WAIT_FOR_HOST is set, it first waits up to
# EXACTLY_WAIT_FOR_HOST_SECONDS (default 120) until that name resolves: the service binds
# the address of its advertised pod DNS name, which appears shortly after the pod starts.
set -eu

if [ "$#" -lt 1 ]; then
    echo "usage: launch.sh ROLE FILE.properties... -- ARG..." >&2
    exit 2
fi
role="$1"
shift

files=""
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do
    files="$files $1"
    shift
done
if [ "$#" -gt 0 ]; then
    shift
fi

for file in $files; do
    while IFS= read -r line || [ -n "$line" ]; do
        case "$line" in
            "" | "#"* | "!"*) continue ;;
        esac
        set -- "$@" --set "$line"
    done < "$file"
done

if [ -n "${EXACTLY_WAIT_FOR_HOST:-}" ]; then
    waited=0
    limit="${EXACTLY_WAIT_FOR_HOST_SECONDS:-120}"
    until getent hosts "$EXACTLY_WAIT_FOR_HOST" > /dev/null 2>&1; do
        if [ "$waited" -ge "$limit" ]; then
            echo "launch.sh: $EXACTLY_WAIT_FOR_HOST does not resolve after ${limit}s" >&2
            exit 1
        fi
        sleep 1
        waited=$((waited + 1))
    done
fi

exec python -m "services.$role" "$@"
