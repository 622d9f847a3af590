"""Transactional round trip against a running Exactly cluster (the chart's `helm test`).

Creates a topic of 3 partitions, aborts one transaction and commits another (each sends
the same number of records to every partition), then reads the topic back with a
read_committed consumer: it must see every committed record exactly once and none of the
aborted ones. Exits 0 on success, 1 with a reason otherwise.

Settings come from the environment:
  EXACTLY_BOOTSTRAP_SERVERS  "host:port[,host:port]" (required)
  EXACTLY_TEST_RECORDS       records per transaction (default 30)
  EXACTLY_TEST_TIMEOUT_S     seconds for the whole round trip (default 120)
  EXACTLY_SECURITY_PROTOCOL, EXACTLY_SSL_CA_LOCATION, EXACTLY_SSL_CERTIFICATE_LOCATION,
  EXACTLY_SSL_KEY_LOCATION   the SDK's security.protocol and ssl.* keys (a secured
                             cluster: TLS with a client certificate), when set
"""
from __future__ import annotations

import os
import sys
import time
import uuid

from exactly import AdminClient, Consumer, NewTopic, Producer

PARTITIONS = 3
SECURITY_KEYS = ("security.protocol", "ssl.ca.location", "ssl.certificate.location", "ssl.key.location")


def security_config(environ: dict[str, str]) -> dict[str, str]:
    """The SDK security keys given as EXACTLY_<KEY> (dots as underscores, upper case)."""
    out = {}
    for key in SECURITY_KEYS:
        value = environ.get("EXACTLY_" + key.replace(".", "_").upper())
        if value:
            out[key] = value
    return out


def round_trip(bootstrap: str, records: int, timeout_s: float,
               security: dict[str, str] | None = None) -> str | None:
    """Run the round trip; returns None on success, else what went wrong."""
    deadline = time.monotonic() + timeout_s
    run = uuid.uuid4().hex[:12]
    topic = f"helm-test-{run}"
    conf = {"bootstrap.servers": bootstrap, **(security or {})}

    admin = AdminClient(conf)
    try:
        admin.create_topics([NewTopic(topic, PARTITIONS, replication_factor=1)])
    finally:
        admin.close()
    print(f"created topic {topic} ({PARTITIONS} partitions)", flush=True)

    producer = Producer({**conf, "transactional.id": f"helm-test-{run}"})
    try:
        producer.init_transactions(timeout=timeout_s)

        producer.begin_transaction()
        for i in range(records):
            producer.send(topic, f"aborted-{i}".encode(), key=f"k{i}".encode(), partition=i % PARTITIONS)
        producer.flush(timeout=timeout_s)
        producer.abort_transaction(timeout=timeout_s)
        print(f"aborted a transaction of {records} records", flush=True)

        producer.begin_transaction()
        futures = [producer.send(topic, f"committed-{i}".encode(), key=f"k{i}".encode(), partition=i % PARTITIONS)
                   for i in range(records)]
        producer.commit_transaction(timeout=timeout_s)
        for f in futures:
            f.result(timeout=max(1.0, deadline - time.monotonic()))
        print(f"committed a transaction of {records} records", flush=True)
    finally:
        producer.close(timeout=10)

    expected = {f"committed-{i}".encode() for i in range(records)}
    seen: list[bytes] = []
    consumer = Consumer({**conf, "group.id": f"helm-test-{run}", "isolation.level": "read_committed",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe([topic])
        while len(seen) < records and time.monotonic() < deadline:
            seen.extend(r.value for r in consumer.poll(timeout=1.0))
        # Anything arriving after the expected count is a duplicate or an aborted record.
        end = min(deadline, time.monotonic() + 2.0)
        while time.monotonic() < end:
            seen.extend(r.value for r in consumer.poll(timeout=0.5))
    finally:
        consumer.close()

    aborted = [v for v in seen if v.startswith(b"aborted-")]
    if aborted:
        return f"read_committed consumer saw {len(aborted)} aborted records, e.g. {aborted[0]!r}"
    if len(seen) != len(set(seen)):
        return f"read_committed consumer saw duplicates: {len(seen)} records, {len(set(seen))} distinct"
    missing = expected - set(seen)
    if missing:
        return f"read_committed consumer missed {len(missing)} of {records} committed records"
    unexpected = set(seen) - expected
    if unexpected:
        return f"read_committed consumer saw unexpected records, e.g. {sorted(unexpected)[0]!r}"
    print(f"read {len(seen)} committed records back, none aborted, no duplicates", flush=True)
    return None


def main() -> int:
    bootstrap = os.environ.get("EXACTLY_BOOTSTRAP_SERVERS", "")
    if not bootstrap:
        print("EXACTLY_BOOTSTRAP_SERVERS is not set", file=sys.stderr)
        return 2
    records = int(os.environ.get("EXACTLY_TEST_RECORDS", "30"))
    timeout_s = float(os.environ.get("EXACTLY_TEST_TIMEOUT_S", "120"))
    problem = round_trip(bootstrap, records, timeout_s, security_config(dict(os.environ)))
    if problem:
        print(f"FAILED: {problem}", file=sys.stderr)
        return 1
    print("OK: transactional round trip", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
