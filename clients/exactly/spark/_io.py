"""Cluster access of the `exactly` Spark data source, over the Exactly SDK: log
offsets (earliest, high watermark, LSO), reading an offset range, reading the
commits topic with transaction markers, and listing / completing the query's
transactions. No pyspark here."""
from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Iterable, Iterator

from exactly import AdminClient, Consumer, NewTopic, Producer, TopicPartition, complete_transaction, errors
from exactly_wire import records as _rec
from exactly._accumulator import partition_for_key
from exactly.admin import PREPARED_STATE
from exactly._client import ClientCore
from exactly.config import AdminSchema
from exactly_wire.config import parse
from exactly_wire.error_codes import ErrorCode
from exactly.types import ConsumerRecord
from exactly_wire.v1 import exactly_pb2 as pb

from ._commit_log import CommitLogState, Decision, TxnRef
from ._options import READ_COMMITTED

log = logging.getLogger(__name__)

TP = tuple[str, int]

_FETCH_BYTES = 1 << 20


def client(bootstrap: str) -> ClientCore:
    return ClientCore(parse(AdminSchema, {"bootstrap.servers": bootstrap}))


def partitions_of(bootstrap: str, topics: Iterable[str]) -> list[TP]:
    """Every (topic, partition) of `topics`, sorted. Raises
    errors.UnknownTopicOrPartitionError for an unknown topic."""
    core = client(bootstrap)
    try:
        return sorted((t, p) for t in topics for p in core.partitions_for(t))
    finally:
        core.close()


def log_offsets(bootstrap: str, tps: Iterable[TP], which: int, isolation: str = READ_COMMITTED) -> dict[TP, int]:
    """ListOffsets for each (topic, partition): `which` EARLIEST (-2, the log start
    offset) or LATEST (-1: the LSO under read_committed, the high watermark under
    read_uncommitted). Retries retriable errors (leader moves) for
    request.timeout.ms; raises the last error after that."""
    wanted = sorted(set(tps))
    if not wanted:
        return {}
    core = client(bootstrap)
    iso = 1 if isolation == READ_COMMITTED else 0
    out: dict[TP, int] = {}

    def _once() -> dict[TP, int]:
        by_leader: dict[str, list[TP]] = collections.defaultdict(list)
        for tp in wanted:
            if tp not in out:
                by_leader[core.leader_for(*tp)].append(tp)
        for leader, group in by_leader.items():
            by_topic: dict[str, list[int]] = collections.defaultdict(list)
            for t, p in group:
                by_topic[t].append(p)
            req = pb.ListOffsetsRequest(isolation_level=iso, topics=[
                pb.ListOffsetsTopic(name=t, partitions=[pb.ListOffsetsPartition(partition=p, timestamp=which)
                                                        for p in ps]) for t, ps in by_topic.items()])
            resp = core.call(core.leader_stub(leader).ListOffsets, req)
            for t in resp.topics:
                for r in t.partitions:
                    errors.check(r.error_code, f"ListOffsets {t.name}-{r.partition}")
                    out[(t.name, r.partition)] = r.offset
        return out

    try:
        return dict(core.retry(_once))
    finally:
        core.close()


def read_range(bootstrap: str, topic: str, partition: int, start: int, end: int, isolation: str,
               poll_timeout_s: float = 120.0) -> Iterator[ConsumerRecord]:
    """The records of `topic`-`partition` with start <= offset < end, in offset
    order, read with `isolation` (read_committed skips aborted transactions and
    markers). With `end` at or below the LSO the result never changes, so a
    micro-batch replays identically. Raises TimeoutError when no progress is made
    for `poll_timeout_s` seconds (e.g. the range was deleted)."""
    if start >= end:
        return
    tp = TopicPartition(topic, partition)
    c = Consumer({"bootstrap.servers": bootstrap, "isolation.level": isolation, "enable.auto.commit": False,
                  "fetch.max.wait.ms": 200, "max.poll.records": 2000})
    try:
        c.assign([tp])
        c.seek(tp, start)
        progress_at = time.monotonic()
        while c.position(tp) < end:
            got = c.poll(timeout=0.5)
            if got:
                progress_at = time.monotonic()
            elif time.monotonic() - progress_at > poll_timeout_s:
                raise TimeoutError(f"reading {topic}-{partition} [{start}, {end}) made no progress for "
                                   f"{poll_timeout_s:.0f} s (at {c.position(tp)})")
            for r in got:
                if r.offset >= end:
                    return
                if r.offset >= start:
                    yield r
    finally:
        c.close()


# ---------------------------------------------------------------- commits topic

def ensure_topic(bootstrap: str, topic: str, replication_factor: int = 1, partitions: int = 1) -> None:
    """Create `topic` unless it exists (a concurrent creation is fine)."""
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        if topic in admin.list_topics():
            return
        try:
            admin.create_topics([NewTopic(topic, partitions, replication_factor)])
        except errors.TopicAlreadyExistsError:
            pass


def commits_partition(bootstrap: str, topic: str, query_id: str) -> int:
    """The partition of the commits topic holding the query's records (the
    Producer's default partitioner on the query id)."""
    core = client(bootstrap)
    try:
        return partition_for_key(query_id.encode(), len(core.partitions_for(topic)))
    finally:
        core.close()


_scan_cache: dict[tuple[str, str, int], CommitLogState] = {}
_scan_lock = threading.Lock()


def scan_commit_log(bootstrap: str, topic: str, partition: int) -> CommitLogState:
    """Read `topic`-`partition` from where the last scan of this process stopped (the
    log start the first time) to its current high watermark, read_uncommitted,
    markers included, into a CommitLogState. Retries retriable errors for
    request.timeout.ms. Not cached across processes: a restarted driver rebuilds
    the state from the log."""
    key = (bootstrap, topic, partition)
    with _scan_lock:
        state = _scan_cache.get(key) or CommitLogState()
        core = client(bootstrap)
        try:
            core.retry(lambda: _scan(core, topic, partition, state), timeout_s=max(core.request_timeout_s, 60.0))
        finally:
            core.close()
        _scan_cache[key] = state
        return state


def _scan(core: ClientCore, topic: str, partition: int, state: CommitLogState) -> None:
    target = None
    max_bytes = _FETCH_BYTES
    while True:
        leader = core.leader_for(topic, partition)
        req = pb.FetchRequest(max_wait_ms=0, min_bytes=0, max_bytes=max_bytes, isolation_level=0, topics=[
            pb.FetchTopic(topic=topic, partitions=[pb.FetchPartition(
                partition=partition, fetch_offset=state.next_offset, partition_max_bytes=max_bytes,
                current_leader_epoch=-1)])])
        resp = core.call(core.leader_stub(leader).Fetch, req)
        errors.check(resp.error_code)
        part = resp.responses[0].partitions[0]
        if part.error_code == ErrorCode.OFFSET_OUT_OF_RANGE and state.next_offset < part.log_start_offset:
            state.next_offset = part.log_start_offset
            continue
        errors.check(part.error_code, f"Fetch {topic}-{partition} at {state.next_offset}")
        if target is None:
            target = part.high_watermark
        if state.next_offset >= target:
            return
        buf = part.records
        progressed = False
        for pos, header in _rec.iter_batches(buf, verify=True):
            if header.last_offset >= state.next_offset:
                state.apply(header, _rec.decode_records(buf, pos, header))
                progressed = True
        if not progressed:
            if max_bytes >= 64 * _FETCH_BYTES:
                raise errors.CorruptMessageError(f"no whole batch at {topic}-{partition}@{state.next_offset}")
            max_bytes *= 2


def write_decision(bootstrap: str, topic: str, partition: int, decision: Decision, timeout_s: float = 60.0) -> None:
    """Append the driver's decision (idempotent producer, acks=all) and wait for it."""
    key, value, headers = decision.encode()
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 0})
    try:
        p.send(topic, value, key=key, partition=partition, headers=headers).result(timeout_s)
    finally:
        p.close()


# The listed states of a transaction still open: ongoing, or sealed by PrepareTxn
# (KIP-939) and waiting for its decision.
_OPEN_STATES = ("Ongoing", PREPARED_STATE)


def ongoing_transactions(bootstrap: str, prefix: str) -> list[TxnRef]:
    """(transactional.id, PID, epoch) of every open transaction, ongoing or prepared
    (KIP-939: listed as PrepareTxn), whose transactional.id starts with `prefix`, from
    every live transaction coordinator."""
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        tids = sorted({t.transactional_id for t in admin.list_transactions(states=list(_OPEN_STATES))
                       if t.transactional_id.startswith(prefix)})
        return [txn for tid in tids if (txn := _ongoing(admin, tid)) is not None]


def ongoing_transaction(bootstrap: str, transactional_id: str) -> TxnRef | None:
    """(transactional.id, PID, epoch) of the id's open transaction (ongoing or
    prepared), or None."""
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        return _ongoing(admin, transactional_id)


def _ongoing(admin: AdminClient, tid: str) -> TxnRef | None:
    try:
        d = admin.describe_transactions([tid])[tid]
    except errors.TransactionalIdNotFoundError:
        return None
    return (tid, d.producer_id, d.producer_epoch) if d.state in _OPEN_STATES else None


def complete(bootstrap: str, txn: TxnRef, commit: bool, timeout_s: float = 60.0) -> None:
    """EndTxn of a prepared (or ongoing) transaction with its PID and epoch. An
    abort of a transaction already fenced (newer epoch) is a no-op."""
    try:
        complete_transaction(txn, {"bootstrap.servers": bootstrap}, commit=commit, timeout=timeout_s)
    except errors.ProducerFencedError:
        if commit:
            raise
        log.info("transaction %s was already aborted (fenced by a newer epoch)", txn)
