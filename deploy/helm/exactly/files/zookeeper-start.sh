#!/bin/bash
# Starts one ZooKeeper server of the chart's ensemble:
#
#   zookeeper-start.sh COMMAND...
#
# sets ZOO_MY_ID (the StatefulSet ordinal + 1, from the pod name), writes the server's
# secret files into ZK_SECRETS_DIR (default /tmp/zookeeper-secrets) with umask 077, and
# runs COMMAND (the image's `/docker-entrypoint.sh zkServer.sh start-foreground`):
#
# - ZK_TLS_DIR set (the pod's own directory of the TLS volume: ca.crt, <pod>.crt,
#   <pod>.key): keystore.pem, the pod's private key followed by its certificate, which
#   zoo.cfg's ssl.keyStore.location names (ZooKeeper's PEM keystore is one file holding
#   both). The key must be unencrypted PKCS#8 ("BEGIN PRIVATE KEY"), which ZooKeeper reads.
# - ZK_QUORUM_PASSWORD_FILE set (a mounted Secret): jaas.conf with the QuorumServer and
#   QuorumLearner sections of ZooKeeper's DigestLoginModule for user ZK_QUORUM_USER (quorum
#   SASL, zoo.cfg's quorum.auth.*), named in JVMFLAGS as java.security.auth.login.config.
#   The password never appears on a command line.
#
# umask 077 also keeps ZooKeeper's snapshots and transaction logs private to its user.
set -euo pipefail

if [ "$#" -lt 1 ]; then
    echo "usage: zookeeper-start.sh COMMAND..." >&2
    exit 2
fi
umask 077
pod="${POD_NAME:-$HOSTNAME}"
ordinal="${pod##*-}"
export ZOO_MY_ID="$((ordinal + 1))"
secrets="${ZK_SECRETS_DIR:-/tmp/zookeeper-secrets}"
mkdir -p "$secrets"

if [ -n "${ZK_TLS_DIR:-}" ]; then
    key="$ZK_TLS_DIR/$pod.key"
    if ! grep -q -- "-----BEGIN PRIVATE KEY-----" "$key"; then
        echo "zookeeper-start.sh: $key: ZooKeeper reads an unencrypted PKCS#8 key (BEGIN PRIVATE KEY)" >&2
        exit 1
    fi
    cat "$key" "$ZK_TLS_DIR/$pod.crt" > "$secrets/keystore.pem"
fi

if [ -n "${ZK_QUORUM_PASSWORD_FILE:-}" ]; then
    user="${ZK_QUORUM_USER:-zkquorum}"
    password="$(cat "$ZK_QUORUM_PASSWORD_FILE")"  # without trailing newlines
    if ! [[ "$user" =~ ^[A-Za-z0-9_.-]+$ ]]; then
        echo "zookeeper-start.sh: the quorum user name may hold letters, digits, '_', '.' and '-' only" >&2
        exit 1
    fi
    case "$password" in
        "" | *'"'* | *'\'* | *$'\n'*)
            echo "zookeeper-start.sh: the quorum password must be one non-empty line without '\"' or '\\'" >&2
            exit 1 ;;
    esac
    cat > "$secrets/jaas.conf" <<EOF
QuorumServer {
    org.apache.zookeeper.server.auth.DigestLoginModule required
    user_$user="$password";
};
QuorumLearner {
    org.apache.zookeeper.server.auth.DigestLoginModule required
    username="$user"
    password="$password";
};
EOF
    export JVMFLAGS="${JVMFLAGS:-} -Djava.security.auth.login.config=$secrets/jaas.conf"
fi

exec "$@"
