"""Logs written to an exactly.testing.MockCluster by real producers, in the layouts the
consumer's tests read (plain records, transactions committed, aborted or left open), and
consumers of the cluster on a virtual clock."""
from __future__ import annotations

from typing import Any

from exactly import Consumer, Producer
from exactly.testing import MockCluster, MockTime

from sdk_producer.clocked import on_clock


def consumer_clock() -> MockTime:
    """The consumers' clock: virtual, driven by the test's thread, and running on with real
    time; the cluster answers at once, so a wait nothing ended within 2 ms waits out its
    timeout, and a sleep (of retry.backoff.ms) pauses 0.2 ms of real time."""
    return MockTime(grace_s=0.002, poll_s=0.0002, runs=True)


def make_consumer(cluster: MockCluster, clock: MockTime, **conf: Any) -> Consumer:
    """A Consumer of `cluster` on `clock`, with `conf` given as keyword arguments
    (`group_id` for group.id): no fetch waits, no automatic commits and no heartbeat in
    the test's time unless asked for."""
    base = {"bootstrap.servers": cluster.bootstrap_servers, "fetch.max.wait.ms": 0,
            "heartbeat.interval.ms": 600000, "enable.auto.commit": False, "retry.backoff.ms": 1,
            "retry.backoff.max.ms": 5}
    base.update({k.replace("_", "."): v for k, v in conf.items()})
    return on_clock(Consumer, clock)(base, transport=cluster)


class Logs:
    """Writes records to `cluster`: plain ones with an idempotent producer, and
    transactional ones with a producer per transactional.id; `close()` closes them."""

    def __init__(self, cluster: MockCluster):
        self.cluster = cluster
        self._plain: Producer | None = None
        self._txn: dict[str, Producer] = {}

    def _conf(self, **more: Any) -> dict:
        return {"bootstrap.servers": self.cluster.bootstrap_servers, "linger.ms": 0, **more}

    def plain(self, topic: str, partition: int, *values: bytes, timestamps: list[int] | None = None) -> list[int]:
        """Write `values` (one batch each) to the partition; returns their offsets."""
        if self._plain is None:
            self._plain = Producer(self._conf(), transport=self.cluster)
        out = []
        for i, value in enumerate(values):
            ts = None if timestamps is None else timestamps[i]
            out.append(self._plain.send(topic, value, partition=partition, timestamp_ms=ts).result(5).offset)
        return out

    def begin(self, transactional_id: str) -> Producer:
        """The producer of `transactional_id` (initialized once) in a new transaction."""
        p = self._txn.get(transactional_id)
        if p is None:
            p = self._txn[transactional_id] = Producer(self._conf(**{"transactional.id": transactional_id}),
                                                       transport=self.cluster)
            p.init_transactions(5)
        p.begin_transaction()
        return p

    def in_txn(self, transactional_id: str, topic: str, partition: int, *values: bytes) -> list[int]:
        """Write `values` in the open transaction of `transactional_id` (begun by `begin`)."""
        p = self._txn[transactional_id]
        return [p.send(topic, v, partition=partition).result(5).offset for v in values]

    def end(self, transactional_id: str, committed: bool) -> None:
        p = self._txn[transactional_id]
        p.commit_transaction(5) if committed else p.abort_transaction(5)

    def transactions(self, topic: str = "t", partition: int = 0) -> None:
        """plain-0 (0) | aborted-0, aborted-1 of transaction A (1-2) | committed-0 of
        transaction B (3) | A's ABORT marker (4) | B's COMMIT marker (5) | plain-1 (6)."""
        self.plain(topic, partition, b"plain-0")
        self.begin("txn-a")
        self.in_txn("txn-a", topic, partition, b"aborted-0", b"aborted-1")
        self.begin("txn-b")
        self.in_txn("txn-b", topic, partition, b"committed-0")
        self.end("txn-a", committed=False)
        self.end("txn-b", committed=True)
        self.plain(topic, partition, b"plain-1")

    def close(self) -> None:
        for p in [self._plain, *self._txn.values()]:
            if p is not None:
                p.close(5)
