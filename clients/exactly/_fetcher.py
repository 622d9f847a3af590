"""Fetching for the Consumer: Fetch requests per partition leader, batch decoding,
and the read_committed filter of aborted transactions.

The pure parts (`AbortedTransactions`, `parse_fetched`, `FetchedRecords`) live in
`_fetched`, which does no I/O; `Fetcher` sends one Fetch per leader address
as a gRPC future, so fetches to different leaders run in parallel and a fetch
started at the end of one `poll` (prefetch) is picked up by the next.
"""
from __future__ import annotations

import concurrent.futures
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from exactly import errors
from exactly_wire.clock import Clock, monotonic_ms
from exactly._client import METADATA_ERRORS
from exactly._consumer_state import ResetStrategy
from exactly._fetched import AbortedTransactions, parse_fetched
from exactly_wire.error_codes import ErrorCode
from exactly.types import ConsumerRecord, TopicPartition
from exactly_wire.v1 import exactly_pb2 as pb

if TYPE_CHECKING:
    from exactly._client import ClientCore
    from exactly._consumer_state import SubscriptionState

log = logging.getLogger(__name__)

READ_UNCOMMITTED = 0
READ_COMMITTED = 1


def list_offsets_request(queries: dict[TopicPartition, int], isolation_level: int) -> pb.ListOffsetsRequest:
    """A ListOffsetsRequest for `{tp: timestamp}` (ms, or -2 earliest, -1 latest,
    -3 LSO; docs/design.md, "Last stable offset and read_committed")."""
    topics: dict[str, list[pb.ListOffsetsPartition]] = {}
    for tp, ts in sorted(queries.items()):
        topics.setdefault(tp.topic, []).append(pb.ListOffsetsPartition(partition=tp.partition, timestamp=ts))
    return pb.ListOffsetsRequest(isolation_level=isolation_level,
                                 topics=[pb.ListOffsetsTopic(name=t, partitions=ps) for t, ps in topics.items()])


def parse_list_offsets(resp: pb.ListOffsetsResponse, wanted: Iterable[TopicPartition]
                       ) -> tuple[dict[TopicPartition, tuple[int, int]], dict[TopicPartition, errors.ExactlyError]]:
    """({tp: (offset, timestamp)}, {tp: error}) for the `wanted` partitions of a
    ListOffsetsResponse; offset -1 means none (no record at or after a timestamp)."""
    wanted = set(wanted)
    found: dict[TopicPartition, tuple[int, int]] = {}
    failed: dict[TopicPartition, errors.ExactlyError] = {}
    for t in resp.topics:
        for p in t.partitions:
            tp = TopicPartition(t.name, p.partition)
            if tp not in wanted:
                continue
            if p.error_code == ErrorCode.NONE:
                found[tp] = (p.offset, p.timestamp)
            else:
                failed[tp] = errors.for_code(p.error_code, f"ListOffsets {tp.topic}-{tp.partition}")
    return found, failed


@dataclass(slots=True)
class _InFlight:
    address: str
    future: concurrent.futures.Future
    sent: dict[TopicPartition, tuple[int, int]]  # tp -> (fetch offset, partition epoch)


class Fetcher:
    """Sends Fetch requests and turns responses into buffered records.

    At most one Fetch is in flight per leader address, covering every partition
    of that leader that has a position, nothing buffered, and no backoff pending.
    A partition is fetched again only once its buffered records are drained, so
    records stay in offset order. Retriable failures (leader moved or down,
    network errors) back the partition off exponentially and mark metadata
    stale; a refresh is attempted at most once per `backoff_ms`. `clock`: monotonic
    ms (`exactly_wire.clock`), the same clock as the Consumer's.
    """

    def __init__(self, core: "ClientCore", subs: "SubscriptionState", *, isolation_level: int,
                 max_wait_ms: int, min_bytes: int, max_bytes: int, partition_max_bytes: int,
                 check_crcs: bool = True, backoff_ms: float = 100, backoff_max_ms: float = 1000,
                 clock: Clock = monotonic_ms):
        self._core = core
        self._subs = subs
        self.isolation_level = isolation_level
        self._max_wait_ms = max_wait_ms
        self._min_bytes = min_bytes
        self._max_bytes = max_bytes
        self._partition_max_bytes = partition_max_bytes
        self._check_crcs = check_crcs
        self._backoff_ms = backoff_ms
        self._backoff_max_ms = backoff_max_ms
        self._clock = clock
        self._inflight: dict[str, _InFlight] = {}
        self._errors: list[errors.ExactlyError] = []
        # Assigned partitions that cannot be fetched now -> why (no leader known, the last
        # fetch failed); cleared by an answer. What an empty poll() reports (exactly._waiting).
        self.failing: dict[TopicPartition, BaseException] = {}
        self._metadata_stale = False
        self._last_refresh = float("-inf")
        self._rotation = 0
        # Quota throttling (KIP-219): leader -> clock ms before which no Fetch goes to it;
        # the largest throttle_time_ms seen (Kafka's fetch-throttle-time-max).
        self.throttled_until: dict[str, float] = {}
        self.throttle_time_ms_max = 0

    @property
    def read_committed(self) -> bool:
        return self.isolation_level == READ_COMMITTED

    # ------------------------------------------------------------ metadata

    def mark_metadata_stale(self) -> None:
        self._metadata_stale = True

    def maybe_refresh_metadata(self) -> None:
        """Refresh metadata if a failure marked it stale (throttled)."""
        now = self._clock()
        if not self._metadata_stale or now - self._last_refresh < self._backoff_ms:
            return
        self._last_refresh = now
        try:
            # never blocks a poll (docs/sdk.md, "Timeouts: what each one bounds")
            self._core.metadata_nowait(refresh=True)
            self._metadata_stale = False
        except errors.ExactlyError as exc:
            log.debug("metadata refresh failed: %r", exc)

    def leader(self, tp: TopicPartition) -> str | None:
        """Cached leader address of `tp`, None when unknown (marks metadata stale)."""
        try:
            addr = self._core.metadata_nowait().leader(tp.topic, tp.partition)
        except errors.ExactlyError as exc:
            log.debug("metadata unavailable: %r", exc)
            addr = None
        if addr is None:
            self._metadata_stale = True
        return addr

    # ------------------------------------------------------------ ListOffsets

    def list_offsets(self, queries: dict[TopicPartition, int], isolation_level: int,
                     timeout_s: float) -> dict[TopicPartition, tuple[int, int]]:
        """Blocking ListOffsets for `{tp: timestamp}` (see `list_offsets_request`),
        one request per leader, retrying leader moves and network errors (with a
        metadata refresh) for up to `timeout_s` seconds. Returns {tp: (offset,
        timestamp)}. Raises errors.KafkaTimeoutError when some partition has no
        answer in time; a non-retriable error as is (e.g. authorization)."""
        results: dict[TopicPartition, tuple[int, int]] = {}
        pending = {TopicPartition(*tp): ts for tp, ts in queries.items()}

        def _once() -> None:
            by_leader: dict[str, dict[TopicPartition, int]] = {}
            for tp, ts in pending.items():
                by_leader.setdefault(self._core.leader_for(tp.topic, tp.partition), {})[tp] = ts
            retry: errors.ExactlyError | None = None
            for addr, q in by_leader.items():
                resp = self._core.call(self._core.leader_stub(addr).ListOffsets,
                                       list_offsets_request(q, isolation_level))
                found, failed = parse_list_offsets(resp, q)
                for tp, res in found.items():
                    results[tp] = res
                    pending.pop(tp, None)
                for err in failed.values():
                    if not err.retriable and err.code not in METADATA_ERRORS:
                        raise err
                    retry = retry or err
            if pending:
                raise retry or errors.LeaderNotAvailableError(f"ListOffsets: no answer for {sorted(pending)}")

        if pending:
            try:
                self._core.retry(_once, timeout_s)
            except errors.ExactlyError as exc:
                if not exc.retriable:
                    raise
                raise errors.KafkaTimeoutError(f"ListOffsets not answered in {timeout_s:g} s: {exc!r}") from exc
        return results

    # ------------------------------------------------------------ sending

    def in_flight(self) -> list[concurrent.futures.Future]:
        return [f.future for f in self._inflight.values()]

    def send_fetches(self) -> int:
        """Send a Fetch to every leader with fetchable partitions and no Fetch in
        flight. Returns the number of requests sent."""
        self.maybe_refresh_metadata()
        now = self._clock()
        busy = {tp for f in self._inflight.values() for tp in f.sent}
        by_leader: dict[str, list[TopicPartition]] = {}
        for tp in self._subs.fetchable(now):
            if tp in busy:
                continue
            addr = self.leader(tp)
            if addr is None:
                self._subs.assignment[tp].backoff(now, self._backoff_ms, self._backoff_max_ms)
                self.failing.setdefault(tp, errors.LeaderNotAvailableError("no leader known"))
                continue
            if addr not in self._inflight and self.throttled_until.get(addr, 0.0) <= now:
                by_leader.setdefault(addr, []).append(tp)
        for addr, tps in by_leader.items():
            self._send(addr, tps)
        return len(by_leader)

    def _send(self, address: str, tps: list[TopicPartition]) -> None:
        topics: dict[str, list[pb.FetchPartition]] = {}
        sent: dict[TopicPartition, tuple[int, int]] = {}
        for tp in tps:
            st = self._subs.assignment[tp]
            topics.setdefault(tp.topic, []).append(pb.FetchPartition(
                partition=tp.partition, fetch_offset=st.position,
                partition_max_bytes=self._partition_max_bytes, current_leader_epoch=-1))
            sent[tp] = (st.position, st.epoch)
        req = pb.FetchRequest(replica_id="", max_wait_ms=self._max_wait_ms, min_bytes=self._min_bytes,
                              max_bytes=self._max_bytes, isolation_level=self.isolation_level,
                              topics=[pb.FetchTopic(topic=t, partitions=ps) for t, ps in topics.items()])
        try:
            stub = self._core.leader_stub(address)
        except errors.ExactlyError as exc:  # client closed
            log.debug("no stub for %s: %r", address, exc)
            return
        timeout_s = self._max_wait_ms / 1000.0 + self._core.request_timeout_s
        fut = self._core.call_future(stub.Fetch, req, timeout_s)
        self._inflight[address] = _InFlight(address, fut, sent)

    # ------------------------------------------------------------ receiving

    def wait(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for an in-flight Fetch to complete, then handle
        every completed one."""
        futures = self.in_flight()
        if futures and timeout_s > 0:
            self._core.clock.wait_futures(futures, timeout_s, concurrent.futures.FIRST_COMPLETED)
        self.handle_completed()

    def handle_completed(self) -> None:
        for addr, inf in list(self._inflight.items()):
            if inf.future.done():
                del self._inflight[addr]
                self._handle(inf)

    def _handle(self, inf: _InFlight) -> None:
        now = self._clock()
        exc = inf.future.exception()
        if exc is not None:
            log.debug("fetch from %s failed: %r", inf.address, exc)
            for tp in inf.sent:
                st = self._subs.assignment.get(tp)
                if st is not None:
                    st.backoff(now, self._backoff_ms, self._backoff_max_ms)
                    self.failing[tp] = exc
            self._metadata_stale = True
            if isinstance(exc, errors.ExactlyError) and not exc.retriable:
                self._errors.append(exc)  # e.g. not authorized: poll raises it
            return
        resp = inf.future.result()
        if resp.throttle_time_ms > 0:  # a quota exceeded: no Fetch to this leader for that long
            self.throttle_time_ms_max = max(self.throttle_time_ms_max, resp.throttle_time_ms)
            self.throttled_until[inf.address] = now + resp.throttle_time_ms
        for tr in resp.responses:
            for pr in tr.partitions:
                self.handle_partition(TopicPartition(tr.topic, pr.partition), pr, inf.sent, resp.error_code)

    def handle_partition(self, tp: TopicPartition, pr, sent: dict[TopicPartition, tuple[int, int]],
                         top_error: int = 0) -> None:
        """Apply one FetchPartitionResponse `pr` for a request that fetched
        `sent[tp] = (fetch offset, epoch)`. Responses for a partition that was
        since revoked, sought or already has buffered records are dropped."""
        if tp not in sent:
            return
        fetch_offset, epoch = sent[tp]
        st = self._subs.assignment.get(tp)
        if st is None or st.epoch != epoch or st.position != fetch_offset or st.buffered is not None:
            return
        now = self._clock()
        code = pr.error_code or top_error
        if code in (ErrorCode.NONE, ErrorCode.OFFSET_OUT_OF_RANGE):
            self.failing.pop(tp, None)
        if code == ErrorCode.NONE:
            st.succeeded()
            st.high_watermark = pr.high_watermark
            st.last_stable_offset = pr.last_stable_offset
            st.log_start_offset = pr.log_start_offset
            aborted = None
            lso = -1
            if self.read_committed:
                if st.aborted is None:
                    st.aborted = AbortedTransactions()
                st.aborted.add((a.producer_id, a.first_offset) for a in pr.aborted_transactions)
                aborted = st.aborted
                lso = pr.last_stable_offset if pr.last_stable_offset > 0 else -1
            fetched = parse_fetched(tp, pr.records, fetch_offset, aborted, lso, self._check_crcs)
            if fetched.records or fetched.error is not None:
                st.buffered = fetched
            elif fetched.next_fetch_offset > fetch_offset:
                st.advance(fetched.next_fetch_offset)  # only markers / aborted data
        elif code == ErrorCode.OFFSET_OUT_OF_RANGE:
            if self._subs.default_reset is ResetStrategy.NONE:
                st.backoff(now, self._backoff_ms, self._backoff_max_ms)
                self._errors.append(errors.NoOffsetForPartitionError(
                    [tp], f"fetch offset {fetch_offset} is out of range for {tp.topic}-{tp.partition}"
                          " and auto.offset.reset is none"))
            else:
                log.info("fetch offset %d out of range for %s-%d; resetting to %s",
                         fetch_offset, tp.topic, tp.partition, self._subs.default_reset.value)
                st.request_reset(self._subs.default_reset)
        else:
            st.backoff(now, self._backoff_ms, self._backoff_max_ms)
            err = errors.for_code(code, f"fetch {tp.topic}-{tp.partition}")
            self.failing[tp] = err
            if err.retriable or code in METADATA_ERRORS:
                self._metadata_stale = True
            else:
                self._errors.append(err)

    # ------------------------------------------------------------ draining

    def drain(self, max_records: int) -> list[ConsumerRecord]:
        """Up to `max_records` buffered records, taken from the partitions in
        rotating order (paused partitions keep theirs), advancing their positions. Raises a deferred fetch error
        (e.g. errors.NoOffsetForPartitionError, CorruptMessageError, an authorization
        error) when no records are returned with it."""
        out: list[ConsumerRecord] = []
        ready = [tp for tp, st in self._subs.assignment.items() if st.buffered is not None and not st.paused]
        if ready:
            k = self._rotation % len(ready)
            self._rotation += 1
            for tp in ready[k:] + ready[:k]:
                if len(out) >= max_records:
                    break
                st = self._subs.assignment[tp]
                fetched = st.buffered
                recs, pos = fetched.drain(max_records - len(out))
                out.extend(recs)
                st.advance(pos)
                if fetched.exhausted:
                    if fetched.error is not None:
                        if out:
                            break  # raise on the next poll, after these records
                        st.buffered = None
                        st.backoff(self._clock(), self._backoff_ms, self._backoff_max_ms)
                        raise fetched.error
                    st.buffered = None
        if not out and self._errors:
            raise self._errors.pop(0)
        return out

    def close(self) -> None:
        for inf in self._inflight.values():
            inf.future.cancel()
        self._inflight.clear()
