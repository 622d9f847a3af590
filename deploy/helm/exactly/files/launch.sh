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
#
# When EXACTLY_SECRET_SETTINGS_DIR is set, each file there (a mounted Secret) is one
# setting: the file name is the key, its content the value (e.g. zookeeper.digest.password).
# They go into a properties file only this user can read, $TMPDIR/exactly-secret.properties,
# passed as --config, so that no secret appears on a command line.
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

if [ -n "${EXACTLY_SECRET_SETTINGS_DIR:-}" ]; then
    secret_config="${TMPDIR:-/tmp}/exactly-secret.properties"
    (umask 077 && : > "$secret_config")
    for path in "$EXACTLY_SECRET_SETTINGS_DIR"/*; do
        [ -f "$path" ] || continue
        value="$(cat "$path")"  # without trailing newlines
        case "$value" in
            *"
"*)
                echo "launch.sh: ${path##*/}: a setting's value must be one line" >&2
                exit 1 ;;
        esac
        # Java properties escapes: backslashes, and a leading blank (otherwise dropped).
        value="$(printf '%s' "$value" | sed -e 's/\\/\\\\/g' -e 's/^\([[:space:]]\)/\\\1/')"
        printf '%s=%s\n' "${path##*/}" "$value" >> "$secret_config"
    done
    set -- "$@" --config "$secret_config"
fi

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
