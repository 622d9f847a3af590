"""The Consumer: reads records from partition leaders, optionally as a member of a
consumer group, with Kafka's isolation levels (KIP-98 design document, "Consumer";
docs/design.md, "Last stable offset and read_committed", "SDK" and "Decisions").

Under `read_committed` the Fetch asks the leader to bound the data by the last
stable offset (LSO) and the consumer drops the records of aborted transactions
with the design doc's min-heap algorithm (`exactly._fetcher.AbortedTransactions`);
`seek_to_end` and `auto.offset.reset=latest` go to the LSO. Control batches
(transaction markers) are never returned; positions move past them.

Not thread-safe (like Kafka's consumer), except that a background thread sends the
group heartbeats.
"""
from __future__ import annotations

import concurrent.futures
import logging
import time
from typing import Any, Callable, Generator, Iterable, Mapping, NamedTuple

from exactly import errors
from exactly._client import CANCELLED, COORDINATOR_ERRORS, METADATA_ERRORS, ClientCore, run_flow
from exactly._consumer_group import GroupMembership, parse_offset_fetch
from exactly._consumer_state import (NoOffsetForPartitionError, ResetStrategy, SubscriptionState,
                                     reset_timestamp)
from exactly._fetcher import READ_COMMITTED, READ_UNCOMMITTED, Fetcher
from exactly_wire.clock import monotonic_ms
from exactly_wire.error_codes import ErrorCode
from exactly.types import ConsumerGroupMetadata, ConsumerRecord, OffsetAndMetadata, TopicPartition
from exactly_wire.v1 import exactly_pb2 as pb

log = logging.getLogger(__name__)

Rebalance = Callable[[list[TopicPartition]], Any]

_ISOLATION = {"read_uncommitted": READ_UNCOMMITTED, "read_committed": READ_COMMITTED}


# I/O effects yielded by the Consumer's flows (see `run_flow` in exactly._client): the
# Consumer performs them blocking, exactly.aio awaits them.
class WaitForResponses(NamedTuple):
    """Wait up to `timeout_s` seconds for any request in flight (fetches, offset
    lookups, a join), then handle the completed fetches."""

    timeout_s: float


class CommitOffsets(NamedTuple):
    """`GroupMembership.commit_sync(offsets, managed, timeout_s)`."""

    offsets: Mapping[TopicPartition, OffsetAndMetadata]
    managed: bool
    timeout_s: float


class FetchCommitted(NamedTuple):
    """`GroupMembership.fetch_committed(partitions, require_stable, timeout_s)`."""

    partitions: list[TopicPartition]
    require_stable: bool
    timeout_s: float


class LeaveGroup(NamedTuple):
    """Stop heartbeating and leave the group (`GroupMembership.close`)."""


def _bool(value: Any) -> bool:
    if isinstance(value, str):
        v = value.strip().lower()
        if v in ("true", "1", "yes", "on"):
            return True
        if v in ("false", "0", "no", "off"):
            return False
        raise ValueError(f"not a boolean: {value!r}")
    return bool(value)


class Consumer:
    """Consume records from topics.

    `conf` (Kafka keys; times in ms, sizes in bytes):
      bootstrap.servers       "host:port[,host:port]" of any service (required)
      group.id                consumer group (required for subscribe/commit/committed)
      isolation.level         read_uncommitted (default) | read_committed
      enable.auto.commit      True (default): positions are committed every
                              auto.commit.interval.ms (5000) from poll, and on close
      auto.offset.reset       where to start without a committed offset or after
                              OFFSET_OUT_OF_RANGE: earliest | latest (default) | none
      session.timeout.ms      10000; heartbeat.interval.ms 3000;
      max.poll.interval.ms    300000 (rebalance timeout; a member that does not poll
                              for this long leaves the group)
      max.poll.records        500; fetch.max.wait.ms 500; fetch.min.bytes 1;
      fetch.max.bytes         52428800; max.partition.fetch.bytes 1048576
      check.crcs              True; default.api.timeout.ms 60000 (blocking calls);
      request.timeout.ms      30000; retry.backoff.ms 100; retry.backoff.max.ms 1000
      group.instance.id       optional static member id
    Raises ValueError for an invalid configuration.
    """

    def __init__(self, conf: Mapping[str, Any]):
        conf = dict(conf)
        iso = str(conf.get("isolation.level", "read_uncommitted")).strip().lower()
        if iso not in _ISOLATION:
            raise ValueError(f"isolation.level must be read_uncommitted or read_committed, not {iso!r}")
        self._isolation_level = _ISOLATION[iso]
        self._group_id: str | None = conf.get("group.id") or None
        self._auto_commit = _bool(conf.get("enable.auto.commit", True)) and self._group_id is not None
        self._auto_commit_interval_ms = int(conf.get("auto.commit.interval.ms", 5000))
        self._max_poll_records = int(conf.get("max.poll.records", 500))
        if self._max_poll_records < 1:
            raise ValueError("max.poll.records must be >= 1")
        self._api_timeout_s = int(conf.get("default.api.timeout.ms", 60000)) / 1000.0
        self._session_timeout_ms = int(conf.get("session.timeout.ms", 10000))
        self._core = self._make_core(conf)
        # Timers (backoff, auto-commit) run on one monotonic ms clock, shared with the
        # Fetcher and the GroupMembership; blocking waits for `timeout` use seconds.
        self._clock = monotonic_ms
        self._backoff_ms = self._core.retry_backoff_ms
        self._backoff_max_ms = max(self._core.retry_backoff_max_ms, self._backoff_ms)
        self._subs = SubscriptionState(default_reset=ResetStrategy.parse(conf.get("auto.offset.reset", "latest")))
        self._fetcher = Fetcher(
            self._core, self._subs, isolation_level=self._isolation_level,
            max_wait_ms=int(conf.get("fetch.max.wait.ms", 500)),
            min_bytes=int(conf.get("fetch.min.bytes", 1)),
            max_bytes=int(conf.get("fetch.max.bytes", 52428800)),
            partition_max_bytes=int(conf.get("max.partition.fetch.bytes", 1048576)),
            check_crcs=_bool(conf.get("check.crcs", True)),
            backoff_ms=self._backoff_ms, backoff_max_ms=self._backoff_max_ms, clock=self._clock)
        self._group: GroupMembership | None = None
        if self._group_id is not None:
            self._group = self._make_membership(
                self._core, self._group_id, session_timeout_ms=self._session_timeout_ms,
                rebalance_timeout_ms=int(conf.get("max.poll.interval.ms", 300000)),
                heartbeat_interval_ms=int(conf.get("heartbeat.interval.ms", 3000)),
                group_instance_id=conf.get("group.instance.id") or None,
                backoff_ms=self._backoff_ms, backoff_max_ms=self._backoff_max_ms, clock=self._clock)
        self._on_assign: Rebalance | None = None
        self._on_revoke: Rebalance | None = None
        # OffsetFetch in flight for positions: (future, {tp: epoch}); and its backoff.
        self._offset_fetch: tuple[concurrent.futures.Future, dict[TopicPartition, int]] | None = None
        self._offset_fetch_failures = 0
        self._offset_fetch_backoff_until = 0
        # ListOffsets in flight for resets, per leader address.
        self._list_offsets: dict[str, tuple[concurrent.futures.Future, dict[TopicPartition, int]]] = {}
        self._next_auto_commit = self._clock() + self._auto_commit_interval_ms
        self._closed = False

    # The I/O of a consumer instance: `exactly.aio` swaps in its grpc.aio core and
    # a membership that heartbeats from a task.
    def _make_core(self, conf: dict[str, Any]) -> ClientCore:
        return ClientCore(conf)

    def _make_membership(self, core: ClientCore, group_id: str, **settings: Any) -> GroupMembership:
        return GroupMembership(core, group_id, **settings)

    def _perform(self, effect: Any) -> Any:
        """Perform one effect of a flow, blocking this thread."""
        if isinstance(effect, WaitForResponses):
            return self._wait(effect.timeout_s)
        if isinstance(effect, CommitOffsets):
            return self._group.commit_sync(effect.offsets, effect.managed, effect.timeout_s)
        if isinstance(effect, FetchCommitted):
            return self._group.fetch_committed(effect.partitions, effect.require_stable, effect.timeout_s)
        if isinstance(effect, LeaveGroup):
            return self._group.close()
        raise TypeError(f"unknown effect {effect!r}")

    # ------------------------------------------------------------ subscription

    def subscribe(self, topics: Iterable[str] | str, on_assign: Rebalance | None = None,
                  on_revoke: Rebalance | None = None) -> None:
        """Join the consumer group (`group.id`) and read the partitions the group
        coordinator assigns to this member from `topics` (list of topic names).
        `on_assign(partitions)` / `on_revoke(partitions)` get a list of
        TopicPartition after an assignment / before partitions are given up in a
        rebalance (and on close). The join happens in `poll`.
        Raises errors.InvalidGroupIdError without group.id, errors.IllegalStateError
        after `assign`."""
        self._check_open()
        if self._group is None:
            raise errors.InvalidGroupIdError("subscribe() requires group.id")
        topics = [topics] if isinstance(topics, str) else list(topics)
        if not topics:
            raise ValueError("subscribe() needs at least one topic")
        self._subs.subscribe(topics)
        self._on_assign, self._on_revoke = on_assign, on_revoke
        self._group.request_rejoin("subscription changed")
        self._group.start_heartbeat()

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly `partitions` (TopicPartition list), without group
        management. Positions of partitions kept from a previous assignment are
        kept; new ones start at the committed offset (when group.id is set) or by
        auto.offset.reset. Raises errors.IllegalStateError after `subscribe`."""
        self._check_open()
        self._subs.assign_from_user(partitions)

    def assignment(self) -> set[TopicPartition]:
        """The partitions currently assigned to this consumer."""
        return set(self._subs.assignment)

    # ------------------------------------------------------------ polling

    def poll(self, timeout: float = 1.0, max_records: int | None = None) -> list[ConsumerRecord]:
        """Return the next records (list of ConsumerRecord, at most `max_records`,
        default max.poll.records), waiting up to `timeout` seconds for some.

        Joins or rejoins the group when needed (calling on_revoke / on_assign),
        initialises positions (committed offset, else auto.offset.reset), and sends
        fetches to the partition leaders in the background; while a leader is down
        its partitions are retried with backoff and poll returns what the others
        have (possibly []). Under read_committed, records of aborted transactions
        and anything at or past the LSO are never returned (design doc "Consumer";
        docs/design.md, "Transactions" and "Decisions"). Records of one partition come in offset order.
        Raises errors.IllegalStateError when neither subscribed nor assigned;
        NoOffsetForPartitionError (auto.offset.reset=none); errors.CorruptMessageError;
        non-retriable errors from the services (e.g. authorization)."""
        self._check_open()
        return run_flow(self._poll_flow(timeout, max_records), self._perform)

    def _poll_flow(self, timeout: float, max_records: int | None) -> Generator:
        if self._subs.subscription is None and not self._subs.user_assigned:
            raise errors.IllegalStateError("poll() needs subscribe() or assign() first")
        limit = self._max_poll_records if max_records is None else int(max_records)
        if limit < 1:
            raise ValueError("max_records must be >= 1")
        deadline = time.monotonic() + max(0.0, timeout)
        if self._group is not None:
            self._group.polled()
        self._maybe_auto_commit()
        while True:
            yield from self._ensure_group()
            self._update_positions()
            out = self._fetcher.drain(limit)
            self._fetcher.send_fetches()  # prefetch while the application processes `out`
            if out:
                return out
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            yield WaitForResponses(min(remaining, self._backoff_ms / 1000))

    def _requests_in_flight(self) -> list:
        """Futures of every request a poll may wait for."""
        futures = self._fetcher.in_flight()
        if self._offset_fetch is not None:
            futures.append(self._offset_fetch[0])
        futures.extend(f for f, _ in self._list_offsets.values())
        if self._group is not None and (p := self._group.pending()) is not None:
            futures.append(p)
        return futures

    def _wait(self, timeout_s: float) -> None:
        futures = self._requests_in_flight()
        if futures:
            concurrent.futures.wait(futures, timeout=timeout_s, return_when=concurrent.futures.FIRST_COMPLETED)
        else:
            time.sleep(timeout_s)
        self._fetcher.handle_completed()

    # ------------------------------------------------------------ group

    def _ensure_group(self) -> Generator:
        group = self._group
        if group is None or self._subs.subscription is None:
            return
        failure: BaseException | None = None
        if group.needs_join() and not group.join_in_progress():
            failure = yield from self._revoke_all()
            group.start_join(self._subs.subscription)
        assignment = group.advance()
        if assignment is not None:
            self._subs.assign_from_group(assignment)
            log.info("group %s: assigned %s", self._group_id, sorted(assignment))
            if self._on_assign is not None:
                try:
                    self._on_assign(sorted(assignment))
                except Exception as exc:  # noqa: BLE001 - re-raised below, state already updated
                    log.exception("on_assign callback failed")
                    failure = failure or exc
        if failure is not None:
            raise failure

    def _revoke_all(self) -> Generator:
        """Before rejoining (eager rebalance): commit positions if auto commit is on,
        call on_revoke, give the partitions up. Returns an on_revoke failure."""
        owned = sorted(self._subs.assignment)
        if not owned:
            return None
        if self._auto_commit:
            yield from self._commit_quietly(self._session_timeout_ms / 1000.0)
        failure = None
        if self._on_revoke is not None:
            try:
                self._on_revoke(owned)
            except Exception as exc:  # noqa: BLE001
                log.exception("on_revoke callback failed")
                failure = exc
        self._subs.assign_from_group([])
        return failure

    def _commit_quietly(self, timeout_s: float) -> Generator:
        offsets = {tp: OffsetAndMetadata(pos) for tp, pos in self._subs.positions().items()}
        if not offsets or self._group is None:
            return
        try:
            yield CommitOffsets(offsets, self._subs.subscription is not None, timeout_s)
        except errors.ExactlyError as exc:
            log.warning("group %s: offset commit failed: %r", self._group_id, exc)

    def _maybe_auto_commit(self) -> None:
        if not self._auto_commit or self._group is None:
            return
        now = self._clock()
        if now < self._next_auto_commit:
            return
        self._next_auto_commit = now + self._auto_commit_interval_ms
        managed = self._subs.subscription is not None
        if managed and self._group.stable_generation() is None:
            return
        offsets = {tp: OffsetAndMetadata(pos) for tp, pos in self._subs.positions().items()}
        self._group.commit_async(offsets, managed)

    # ------------------------------------------------------------ positions

    def _update_positions(self) -> None:
        """Advance position initialisation: OffsetFetch for newly assigned
        partitions, then ListOffsets for pending resets. Non-blocking."""
        self._update_from_committed()
        self._update_from_resets()

    def _update_from_committed(self) -> None:
        now = self._clock()
        if self._offset_fetch is not None and self._offset_fetch[0].done():
            fut, epochs = self._offset_fetch
            self._offset_fetch = None
            try:
                committed = parse_offset_fetch(fut.result(), epochs)
            except CANCELLED:
                committed = None
            except errors.ExactlyError as exc:
                if not exc.retriable:
                    raise
                if exc.code in COORDINATOR_ERRORS and self._group is not None:
                    self._group.coordinator_dead(exc)
                log.debug("OffsetFetch for positions failed: %r", exc)
                self._offset_fetch_failures += 1
                self._offset_fetch_backoff_until = now + min(
                    self._backoff_max_ms, self._backoff_ms * 2 ** (self._offset_fetch_failures - 1))
                committed = None
            if committed is not None:
                self._offset_fetch_failures = 0
                for tp, om in committed.items():
                    self._subs.apply_committed(tp, epochs[tp], om.offset if om is not None else None)
        awaiting = self._subs.awaiting_committed()
        if not awaiting or self._offset_fetch is not None or now < self._offset_fetch_backoff_until:
            return
        if self._group is None:
            for tp in awaiting:  # no group, no committed offsets
                self._subs.apply_committed(tp, self._subs.assignment[tp].epoch, None)
            return
        fut = self._group.fetch_committed_async(awaiting, self._isolation_level == READ_COMMITTED)
        if fut is None:
            self._offset_fetch_failures += 1
            self._offset_fetch_backoff_until = now + self._backoff_ms
            return
        self._offset_fetch = (fut, {tp: self._subs.assignment[tp].epoch for tp in awaiting})

    def _update_from_resets(self) -> None:
        for addr, (fut, epochs) in list(self._list_offsets.items()):
            if fut.done():
                del self._list_offsets[addr]
                self._apply_list_offsets(fut, epochs)
        pending = self._subs.awaiting_reset()
        if not pending:
            return
        none = [tp for tp in pending if self._subs.assignment[tp].reset_strategy is ResetStrategy.NONE]
        if none:
            raise NoOffsetForPartitionError(none)
        now = self._clock()
        busy = {tp for _, epochs in self._list_offsets.values() for tp in epochs}
        by_leader: dict[str, list[TopicPartition]] = {}
        for tp in pending:
            st = self._subs.assignment[tp]
            if tp in busy or not st.ready(now):
                continue
            addr = self._fetcher.leader(tp)
            if addr is None:
                st.backoff(now, self._backoff_ms, self._backoff_max_ms)
                continue
            if addr not in self._list_offsets:
                by_leader.setdefault(addr, []).append(tp)
        read_committed = self._isolation_level == READ_COMMITTED
        for addr, tps in by_leader.items():
            topics: dict[str, list[pb.ListOffsetsPartition]] = {}
            for tp in tps:
                ts = reset_timestamp(self._subs.assignment[tp].reset_strategy, read_committed)
                topics.setdefault(tp.topic, []).append(pb.ListOffsetsPartition(partition=tp.partition, timestamp=ts))
            req = pb.ListOffsetsRequest(isolation_level=self._isolation_level,
                                        topics=[pb.ListOffsetsTopic(name=t, partitions=ps) for t, ps in topics.items()])
            fut = self._core.call_future(self._core.leader_stub(addr).ListOffsets, req)
            self._list_offsets[addr] = (fut, {tp: self._subs.assignment[tp].epoch for tp in tps})

    def _apply_list_offsets(self, fut: concurrent.futures.Future, epochs: dict[TopicPartition, int]) -> None:
        now = self._clock()
        try:
            resp = fut.result()
        except (errors.ExactlyError, *CANCELLED) as exc:
            log.debug("ListOffsets failed: %r", exc)
            self._fetcher.mark_metadata_stale()
            for tp in epochs:
                st = self._subs.assignment.get(tp)
                if st is not None:
                    st.backoff(now, self._backoff_ms, self._backoff_max_ms)
            return
        for t in resp.topics:
            for p in t.partitions:
                tp = TopicPartition(t.name, p.partition)
                if tp not in epochs:
                    continue
                st = self._subs.assignment.get(tp)
                if p.error_code == ErrorCode.NONE:
                    self._subs.apply_reset(tp, epochs[tp], p.offset)
                    if st is not None:
                        st.succeeded()
                    continue
                err = errors.for_code(p.error_code, f"ListOffsets {tp.topic}-{tp.partition}")
                if not err.retriable and p.error_code not in METADATA_ERRORS:
                    raise err
                self._fetcher.mark_metadata_stale()
                if st is not None:
                    st.backoff(now, self._backoff_ms, self._backoff_max_ms)

    def position(self, tp: TopicPartition, timeout: float | None = None) -> int:
        """Offset of the next record `poll` returns for `tp`. If the position is not
        known yet (new assignment, pending seek_to_*), resolves it, waiting up to
        `timeout` seconds (default default.api.timeout.ms). A known position is
        returned at once, also while the partition's leader is down.
        Raises errors.IllegalStateError (not assigned), errors.KafkaTimeoutError,
        NoOffsetForPartitionError."""
        self._check_open()
        return run_flow(self._position_flow(tp, timeout), self._perform)

    def _position_flow(self, tp: TopicPartition, timeout: float | None) -> Generator:
        st = self._subs.state(TopicPartition(*tp))
        deadline = time.monotonic() + (self._api_timeout_s if timeout is None else timeout)
        while not st.has_position:
            self._update_positions()
            if st.has_position:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise errors.KafkaTimeoutError(f"position of {tp[0]}-{tp[1]} not known in time")
            yield WaitForResponses(min(remaining, self._backoff_ms / 1000))
        return st.position

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Make the next `poll` read `tp` from `offset` (>= 0). Drops buffered
        records and the partition's read_committed state (design doc "Consumer").
        Raises errors.IllegalStateError (not assigned), ValueError (negative)."""
        self._check_open()
        if offset < 0:
            raise ValueError(f"offset must be >= 0, not {offset}")
        self._subs.state(TopicPartition(*tp)).seek(int(offset))

    def seek_to_beginning(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        """Move `partitions` (default: all assigned) to the log start offset,
        evaluated on the next poll/position. Raises errors.IllegalStateError."""
        self._seek_to(partitions, ResetStrategy.EARLIEST)

    def seek_to_end(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        """Move `partitions` (default: all assigned) to the end: the high watermark
        under read_uncommitted, the LSO under read_committed (design doc "Discussion
        on Seeks"); evaluated on the next poll/position. Raises errors.IllegalStateError."""
        self._seek_to(partitions, ResetStrategy.LATEST)

    def _seek_to(self, partitions: Iterable[TopicPartition] | None, strategy: ResetStrategy) -> None:
        self._check_open()
        tps = list(self._subs.assignment) if partitions is None else [TopicPartition(*tp) for tp in partitions]
        states = [self._subs.state(tp) for tp in tps]
        for st in states:
            st.request_reset(strategy)

    # ------------------------------------------------------------ offsets

    def commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata | int] | None = None,
               timeout: float | None = None) -> None:
        """Commit offsets synchronously: `offsets` maps TopicPartition to
        OffsetAndMetadata (or an int offset): the offset of the next record to
        read. None commits the current positions of all assigned partitions.
        Retries coordinator moves for up to `timeout` seconds (default
        default.api.timeout.ms). Raises errors.InvalidGroupIdError (no group.id);
        RebalanceInProgressError / IllegalGenerationError / UnknownMemberIdError
        when the group rebalanced (the consumer rejoins on the next poll); the
        last retriable error (e.g. NotCoordinatorError) after the timeout."""
        self._check_open()
        run_flow(self._commit_flow(offsets, timeout), self._perform)

    def _commit_flow(self, offsets: Mapping[TopicPartition, OffsetAndMetadata | int] | None,
                     timeout: float | None) -> Generator:
        if self._group is None:
            raise errors.InvalidGroupIdError("commit() requires group.id")
        if offsets is None:
            todo = {tp: OffsetAndMetadata(pos) for tp, pos in self._subs.positions().items()}
        else:
            todo = {TopicPartition(*tp): om if isinstance(om, OffsetAndMetadata) else OffsetAndMetadata(int(om))
                    for tp, om in offsets.items()}
        yield CommitOffsets(todo, self._subs.subscription is not None,
                            self._api_timeout_s if timeout is None else timeout)

    def committed(self, partitions: Iterable[TopicPartition],
                  timeout: float | None = None) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """The group's committed offsets: `{tp: OffsetAndMetadata or None}`. Under
        read_committed asks with require_stable and waits (retrying with backoff)
        while a transactional offset commit for a partition is pending (KIP-447).
        Raises errors.InvalidGroupIdError (no group.id); the last retriable error
        after `timeout` seconds (default default.api.timeout.ms)."""
        self._check_open()
        return run_flow(self._committed_flow(partitions, timeout), self._perform)

    def _committed_flow(self, partitions: Iterable[TopicPartition], timeout: float | None) -> Generator:
        if self._group is None:
            raise errors.InvalidGroupIdError("committed() requires group.id")
        return (yield FetchCommitted([TopicPartition(*tp) for tp in partitions],
                                     self._isolation_level == READ_COMMITTED,
                                     self._api_timeout_s if timeout is None else timeout))

    def group_metadata(self) -> ConsumerGroupMetadata:
        """This member's group id, generation and member id, for
        `Producer.send_offsets_to_transaction` (KIP-447; generation -1 and member
        "" outside group management). Raises errors.InvalidGroupIdError."""
        if self._group is None:
            raise errors.InvalidGroupIdError("group_metadata() requires group.id")
        if self._subs.subscription is None:
            return ConsumerGroupMetadata(self._group_id, -1, "", self._group.group_instance_id)
        gen, member = self._group.generation()
        return ConsumerGroupMetadata(self._group_id, gen, member, self._group.group_instance_id)

    # ------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Commit positions (if auto commit), call on_revoke for the owned partitions,
        leave the group, and close connections. Idempotent."""
        if self._closed:
            return
        try:
            run_flow(self._close_flow(), self._perform)
        finally:
            self._release()
            self._core.close()

    def _close_flow(self) -> Generator:
        if self._auto_commit:
            yield from self._commit_quietly(min(self._api_timeout_s, self._session_timeout_ms / 1000.0))
        if self._subs.subscription is not None and self._subs.assignment and self._on_revoke is not None:
            try:
                self._on_revoke(sorted(self._subs.assignment))
            except Exception:  # noqa: BLE001 - closing anyway
                log.exception("on_revoke callback failed during close")
        if self._group is not None:
            yield LeaveGroup()

    def _release(self) -> None:
        """Closed: cancel every request in flight (the core is closed next)."""
        self._closed = True
        self._fetcher.close()
        for fut, _ in self._list_offsets.values():
            fut.cancel()
        if self._offset_fetch is not None:
            self._offset_fetch[0].cancel()

    def __enter__(self) -> "Consumer":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise errors.IllegalStateError("consumer is closed")


__all__ = ["Consumer", "NoOffsetForPartitionError"]
