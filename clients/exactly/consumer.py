"""The Consumer: reads records from partition leaders, optionally as a member of a
consumer group, with Kafka's isolation levels (KIP-98 design document, "Consumer";
docs/design.md, "Last stable offset and read_committed", "SDK" and "Decisions").

Under `read_committed` the Fetch asks the leader to bound the data by the last
stable offset (LSO) and the consumer drops the records of aborted transactions
with the design doc's min-heap algorithm (`exactly._fetcher.AbortedTransactions`);
`seek_to_end` and `auto.offset.reset=latest` go to the LSO. Control batches
(transaction markers) are never returned; positions move past them.

Not thread-safe (like Kafka's consumer), except that a background thread sends the
group heartbeats. Every callback (on_assign, on_revoke, on_lost, commit callbacks)
runs in the thread that calls the Consumer's methods.
"""
from __future__ import annotations

import collections
import concurrent.futures
import inspect
import logging
import os
import re
from typing import Any, Callable, Generator, Iterable, Mapping, NamedTuple

from exactly import _fork, errors
from exactly._client import COORDINATOR_ERRORS, METADATA_ERRORS, ClientCore, Transport, run_flow
from exactly._consumer_group import GroupMembership, parse_offset_fetch
from exactly._consumer_state import (EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, ResetStrategy, SubscriptionState,
                                     reset_timestamp)
from exactly._fetcher import READ_COMMITTED, READ_UNCOMMITTED, Fetcher, list_offsets_request
from exactly._unclosed import collected, creation_stack
from exactly._waiting import WaitWarnings
from exactly.config import ConsumerSchema, parse
from exactly_wire.error_codes import ErrorCode
from exactly.types import (ConsumerGroupMetadata, ConsumerRecord, OffsetAndMetadata, OffsetAndTimestamp,
                           TopicPartition)

log = logging.getLogger(__name__)

Rebalance = Callable[[list[TopicPartition]], Any]
CommitCallback = Callable[[errors.ExactlyError | None, dict[TopicPartition, OffsetAndMetadata]], Any]

# get_watermark_offsets(cached=True) for a partition not fetched yet (librdkafka's
# RD_KAFKA_OFFSET_INVALID, as confluent-kafka returns it).
OFFSET_INVALID = -1001

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


class LeaveOnly(NamedTuple):
    """Leave the group and keep heartbeating ready for a later subscribe
    (`GroupMembership.leave`, unsubscribe)."""


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
      group.instance.id       static membership (KIP-345): a restart within
                              session.timeout.ms gets the same partitions back
                              without a rebalance; close() sends no LeaveGroup
      metadata.max.age.ms     300000: how often a pattern subscription looks for
                              new matching topics
    Keys, defaults and allowed values: `config.ConsumerSchema` (docs/reference/configuration.md,
    "Consumer"). Raises errors.ConfigurationError (a ValueError)
    for an unknown or unsupported key or a wrong value. `transport`: where its calls
    go instead of the network (an `exactly.testing.MockCluster` in a unit test).

    Calls: subscribe / unsubscribe / assign / assignment; poll; pause / resume /
    paused; position / seek / seek_to_beginning / seek_to_end; commit (sync or
    asynchronous with a callback) / committed; get_watermark_offsets,
    beginning_offsets, end_offsets, offsets_for_times; group_metadata; close.
    """

    def __init__(self, conf: Mapping[str, Any], *, transport: Transport | None = None):
        self._created = creation_stack()  # where, in debug mode, for the unclosed warning (`__del__`)
        self._created_in_pid = os.getpid()  # a forked child must not use it (exactly/_fork.py)
        cfg = parse(ConsumerSchema, conf)
        self._isolation_level = _ISOLATION[cfg.isolation_level]
        self._group_id: str | None = cfg.group_id
        self._auto_commit = cfg.enable_auto_commit and self._group_id is not None
        self._auto_commit_interval_ms = cfg.auto_commit_interval_ms
        self._max_poll_records = cfg.max_poll_records
        self._api_timeout_s = cfg.default_api_timeout_ms / 1000.0
        self._session_timeout_ms = cfg.session_timeout_ms
        self._core = self._make_core(cfg, transport)
        # Timers (backoff, auto-commit) and blocking waits run on one monotonic clock,
        # the core's, shared with the Fetcher and the GroupMembership: ms from
        # `_clock()`, seconds (deadlines of `timeout`s) from `_clock.now_s()`.
        self._clock = self._core.clock
        self._backoff_ms = cfg.retry_backoff_ms
        self._backoff_max_ms = max(cfg.retry_backoff_max_ms, self._backoff_ms)
        # Rate-limited WARNINGs of what an empty poll() waits for.
        self._waits = WaitWarnings(log, self._clock)
        self._subs = SubscriptionState(default_reset=ResetStrategy.parse(cfg.auto_offset_reset))
        self._fetcher = Fetcher(
            self._core, self._subs, isolation_level=self._isolation_level,
            max_wait_ms=cfg.fetch_max_wait_ms, min_bytes=cfg.fetch_min_bytes, max_bytes=cfg.fetch_max_bytes,
            partition_max_bytes=cfg.max_partition_fetch_bytes, check_crcs=cfg.check_crcs,
            backoff_ms=self._backoff_ms, backoff_max_ms=self._backoff_max_ms, clock=self._clock)
        self._group: GroupMembership | None = None
        if self._group_id is not None:
            self._group = self._make_membership(
                self._core, self._group_id, session_timeout_ms=self._session_timeout_ms,
                rebalance_timeout_ms=cfg.max_poll_interval_ms, heartbeat_interval_ms=cfg.heartbeat_interval_ms,
                group_instance_id=cfg.group_instance_id,
                backoff_ms=self._backoff_ms, backoff_max_ms=self._backoff_max_ms, clock=self._clock)
        self._on_assign: Rebalance | None = None
        self._on_revoke: Rebalance | None = None
        self._on_lost: Rebalance | None = None
        # Asynchronous commits: in flight, and completed ones whose callbacks wait
        # for the application's thread (appended from gRPC threads).
        self._async_commits: set[concurrent.futures.Future] = set()
        self._commit_results: collections.deque[tuple[CommitCallback, errors.ExactlyError | None,
                                                      dict[TopicPartition, OffsetAndMetadata]]] = collections.deque()
        # OffsetFetch in flight for positions: (future, {tp: epoch}); and its backoff.
        self._offset_fetch: tuple[concurrent.futures.Future, dict[TopicPartition, int]] | None = None
        self._offset_fetch_failures = 0
        self._offset_fetch_backoff_until = 0
        # ListOffsets in flight for resets, per leader address.
        self._list_offsets: dict[str, tuple[concurrent.futures.Future, dict[TopicPartition, int]]] = {}
        self._next_auto_commit = self._clock() + self._auto_commit_interval_ms
        self._pattern_checked_at: int | None = None
        self._closed = False

    # The I/O of a consumer instance: `exactly.aio` swaps in its grpc.aio core and
    # a membership that heartbeats from a task.
    def _make_core(self, settings: ConsumerSchema, transport: Transport | None) -> ClientCore:
        return ClientCore(settings, transport=transport)

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
        if isinstance(effect, LeaveOnly):
            return self._group.leave()
        raise TypeError(f"unknown effect {effect!r}")

    # ------------------------------------------------------------ subscription

    def subscribe(self, topics: Iterable[str] | str | re.Pattern, on_assign: Rebalance | None = None,
                  on_revoke: Rebalance | None = None, on_lost: Rebalance | None = None) -> None:
        """Join the consumer group (`group.id`) and read the partitions the group
        coordinator assigns to this member from `topics`: a list of topic names,
        or a regular expression — a str starting with "^" or a compiled
        `re.Pattern` (alone, or as the only element of the list) — matched with
        `re.match` against the cluster's topics on each metadata refresh
        (`metadata.max.age.ms`); internal topics (`__*`) never match, and a new
        matching topic makes the member rejoin.

        Rebalance callbacks get a sorted list of TopicPartition, in the thread
        that calls poll: `on_assign(partitions)` after an assignment — or
        `on_assign(partitions, generation)` when the callback takes two
        arguments (the KIP-447 draft's onPartitionsAssigned overload, for
        `Producer.init_transactions_for_group(partitions, group_id, generation)`);
        `on_revoke(partitions)` before partitions are given up in a rebalance, on
        unsubscribe and on close (after the auto commit); `on_lost(partitions)`
        instead of on_revoke when the partitions were already lost — the session
        expired, the generation was fenced (ILLEGAL_GENERATION,
        UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID) or poll was not called for
        max.poll.interval.ms — so other members may own them and nothing is
        committed (Kafka's onPartitionsLost; without on_lost, on_revoke is
        called). The join happens in `poll`. Raises errors.InvalidGroupIdError
        without group.id, errors.IllegalStateError after `assign`, ValueError
        (no topics, or an invalid pattern)."""
        self._check_open()
        if self._group is None:
            raise errors.InvalidGroupIdError("subscribe() requires group.id")
        pattern = _pattern_of(topics)
        if pattern is not None:
            self._subs.subscribe_pattern(pattern)
            self._pattern_checked_at = None
        else:
            names = [topics] if isinstance(topics, str) else list(topics)
            if not names:
                raise ValueError("subscribe() needs at least one topic")
            self._subs.subscribe(names)
        self._on_assign, self._on_revoke, self._on_lost = on_assign, on_revoke, on_lost
        self._group.request_rejoin("subscription changed")
        self._group.start_heartbeat()

    def unsubscribe(self) -> None:
        """Stop reading: give up the group's partitions (auto commit, then
        on_revoke — or on_lost when they were lost — and LeaveGroup, which a
        static member does not send) or the partitions of `assign`. Buffered
        records are dropped. A later `subscribe` or `assign` starts afresh.
        Raises the exception of a failing rebalance callback (after
        unsubscribing)."""
        self._check_open()
        failure = None
        if self._subs.subscription is not None and self._group is not None:
            failure = run_flow(self._unsubscribe_flow(), self._perform)
            self._group.take_lost()
        self._subs.unsubscribe()
        self._on_assign = self._on_revoke = self._on_lost = None
        self._cancel_position_requests()
        if failure is not None:
            raise failure

    def _unsubscribe_flow(self) -> Generator:
        failure = yield from self._give_up_partitions()
        yield LeaveOnly()
        return failure

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

    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        """Stop fetching `partitions` (TopicPartition list): `poll` returns none
        of their records until `resume`, while they stay assigned, keep their
        positions (and what was already fetched) and are committed as before.
        A rebalance that revokes a partition forgets its pause. Raises
        errors.IllegalStateError for a partition not assigned (nothing paused)."""
        self._check_open()
        self._subs.pause(partitions)

    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        """Fetch paused `partitions` again from their positions. Raises
        errors.IllegalStateError for a partition not assigned."""
        self._check_open()
        self._subs.resume(partitions)

    def paused(self) -> set[TopicPartition]:
        """The assigned partitions that are paused."""
        return self._subs.paused()

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
        Callbacks of completed asynchronous commits run first, in this thread.
        Raises errors.IllegalStateError when neither subscribed nor assigned;
        errors.NoOffsetForPartitionError (auto.offset.reset=none); errors.CorruptMessageError;
        errors.FencedInstanceIdError (another process joined with this
        group.instance.id; fatal: close the consumer); non-retriable errors from
        the services (e.g. authorization); what a callback raised."""
        self._check_open()
        return run_flow(self._poll_flow(timeout, max_records), self._perform)

    def _poll_flow(self, timeout: float, max_records: int | None) -> Generator:
        if self._subs.subscription is None and not self._subs.user_assigned:
            raise errors.IllegalStateError("poll() needs subscribe() or assign() first")
        limit = self._max_poll_records if max_records is None else int(max_records)
        if limit < 1:
            raise ValueError("max_records must be >= 1")
        deadline = self._clock.now_s() + max(0.0, timeout)
        self._run_commit_callbacks()
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
            remaining = deadline - self._clock.now_s()
            if remaining <= 0:
                self._report_waits()
                return []
            yield WaitForResponses(min(remaining, self._backoff_ms / 1000))

    def _report_waits(self) -> None:
        """poll() returns nothing: log at WARNING, rate-limited (`exactly._waiting`), what
        it waits for — no service of bootstrap.servers answering, a subscribed topic the
        cluster does not know, the group's coordinator unusable, assigned partitions
        without a known leader or whose fetches fail. An empty poll for want of new
        records logs nothing."""
        found: dict[str, Callable[[], str]] = {}
        try:
            md = self._core.metadata_nowait()
        except errors.ExactlyError as exc:
            md, unreachable = None, exc
            servers = ",".join(getattr(self._core, "bootstrap", ()))
            found["cluster"] = lambda: (f"poll() gets nothing: no service of bootstrap.servers {servers} answers "
                                        f"({type(unreachable).__name__}: {unreachable})")
        subs = self._subs
        if md is not None and subs.pattern is None and subs.subscription:
            known = {name for name, t in md.topics.items() if t.error_code == ErrorCode.NONE}
            for topic in subs.subscription:
                if topic not in known:
                    found[f"topic:{topic}"] = lambda topic=topic: (
                        f"poll() gets nothing from topic {topic!r}: the cluster does not know it (create it: "
                        "AdminClient.create_topics, `exactly topics create`; consumers do not create topics)")
        group = self._group
        if group is not None and subs.subscription is not None and group.needs_join() \
                and group.last_problem is not None:
            problem = group.last_problem
            found["group"] = lambda: (f"poll() waits to join group {self._group_id!r}: its coordinator is not "
                                      f"usable ({problem!r})")
        failing = {tp: exc for tp, exc in self._fetcher.failing.items() if tp in subs.assignment}
        if failing:
            found["fetch"] = lambda: "poll() gets nothing from " + ", ".join(
                f"{tp.topic}-{tp.partition} ({type(exc).__name__}: {exc})" for tp, exc in sorted(failing.items()))
        for key, message in found.items():
            self._waits.waiting(key, message)
        self._waits.only(set(found))

    def _requests_in_flight(self) -> list:
        """Futures of every request a poll may wait for."""
        futures = self._fetcher.in_flight()
        if self._offset_fetch is not None:
            futures.append(self._offset_fetch[0])
        futures.extend(f for f, _ in self._list_offsets.values())
        futures.extend(self._async_commits)
        if self._group is not None and (p := self._group.pending()) is not None:
            futures.append(p)
        if (refresh := self._core.pending_refresh()) is not None:
            futures.append(refresh)
        return futures

    def _wait(self, timeout_s: float) -> None:
        futures = self._requests_in_flight()
        if futures:
            self._clock.wait_futures(futures, timeout_s, concurrent.futures.FIRST_COMPLETED)
        else:
            self._clock.sleep(timeout_s)
        self._fetcher.handle_completed()

    # ------------------------------------------------------------ group

    def _ensure_group(self) -> Generator:
        group = self._group
        if group is None or self._subs.subscription is None:
            return
        self._maybe_update_pattern()
        failure: BaseException | None = None
        if group.needs_join() and not group.join_in_progress():
            failure = yield from self._give_up_partitions()
            if group.fenced is not None:
                raise group.fenced
            group.start_join(self._subs.subscription)
        assignment = group.advance()
        if assignment is not None:
            self._subs.assign_from_group(assignment)
            log.info("group %s: assigned %s", self._group_id, sorted(assignment))
            if self._on_assign is not None:
                try:
                    if _takes_generation(self._on_assign):
                        self._on_assign(sorted(assignment), group.generation()[0])
                    else:
                        self._on_assign(sorted(assignment))
                except Exception as exc:  # noqa: BLE001 - re-raised below, state already updated
                    log.exception("on_assign callback failed")
                    failure = failure or exc
        if failure is not None:
            raise failure

    def _maybe_update_pattern(self) -> None:
        """With a pattern subscription, match the cluster's topics again whenever
        the metadata was refreshed; a changed match makes the member rejoin."""
        if self._subs.pattern is None:
            return
        try:
            md = self._core.metadata_nowait()
        except errors.ExactlyError as exc:
            log.debug("metadata for the pattern subscription unavailable: %r", exc)
            return
        if md.fetched_at == self._pattern_checked_at:
            return
        self._pattern_checked_at = md.fetched_at
        names = [t.name for t in md.topics.values() if not t.is_internal and t.error_code == ErrorCode.NONE]
        if self._subs.update_pattern_topics(names):
            log.info("group %s: pattern %r now matches %s", self._group_id, self._subs.pattern.pattern,
                     list(self._subs.subscription))
            self._group.request_rejoin("the subscribed pattern matches other topics")

    def _give_up_partitions(self) -> Generator:
        """Before rejoining (eager rebalance), unsubscribing or closing: give the
        group's partitions up. Revoked: commit positions if auto commit is on,
        then on_revoke. Lost (the generation is over, `GroupMembership.take_lost`):
        no commit, on_lost (on_revoke without one). Returns a callback failure."""
        owned = sorted(self._subs.assignment)
        lost = self._group is not None and self._group.take_lost()
        if not owned:
            return None
        if self._auto_commit and not lost:
            yield from self._commit_quietly(self._session_timeout_ms / 1000.0)
        callback = (self._on_lost or self._on_revoke) if lost else self._on_revoke
        failure = None
        if callback is not None:
            try:
                callback(owned)
            except Exception as exc:  # noqa: BLE001
                log.exception("%s callback failed", "on_lost" if lost else "on_revoke")
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
            except concurrent.futures.CancelledError:
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
            raise errors.NoOffsetForPartitionError(none)
        # A leader that was unknown or failed a ListOffsets marked the metadata stale:
        # refresh it here too (throttled), not only when a poll sends fetches, so that
        # position() alone finds the partition's current leader (Kafka's consumer
        # requests a metadata update for a reset whose leader is unknown).
        self._fetcher.maybe_refresh_metadata()
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
                self._fetcher.failing.setdefault(tp, errors.LeaderNotAvailableError("no leader known"))
                continue
            if addr not in self._list_offsets:
                by_leader.setdefault(addr, []).append(tp)
        read_committed = self._isolation_level == READ_COMMITTED
        for addr, tps in by_leader.items():
            req = list_offsets_request(
                {tp: reset_timestamp(self._subs.assignment[tp].reset_strategy, read_committed) for tp in tps},
                self._isolation_level)
            fut = self._core.call_future(self._core.leader_stub(addr).ListOffsets, req)
            self._list_offsets[addr] = (fut, {tp: self._subs.assignment[tp].epoch for tp in tps})

    def _apply_list_offsets(self, fut: concurrent.futures.Future, epochs: dict[TopicPartition, int]) -> None:
        now = self._clock()
        try:
            resp = fut.result()
        except (errors.ExactlyError, concurrent.futures.CancelledError) as exc:
            log.debug("ListOffsets failed: %r", exc)
            self._fetcher.mark_metadata_stale()
            for tp in epochs:
                st = self._subs.assignment.get(tp)
                if st is not None:
                    st.backoff(now, self._backoff_ms, self._backoff_max_ms)
                    self._fetcher.failing[tp] = exc
            return
        for t in resp.topics:
            for p in t.partitions:
                tp = TopicPartition(t.name, p.partition)
                if tp not in epochs:
                    continue
                st = self._subs.assignment.get(tp)
                if p.error_code == ErrorCode.NONE:
                    self._subs.apply_reset(tp, epochs[tp], p.offset)
                    self._fetcher.failing.pop(tp, None)
                    if st is not None:
                        st.succeeded()
                    continue
                err = errors.for_code(p.error_code, f"ListOffsets {tp.topic}-{tp.partition}")
                if not err.retriable and p.error_code not in METADATA_ERRORS:
                    raise err
                self._fetcher.mark_metadata_stale()
                self._fetcher.failing[tp] = err
                if st is not None:
                    st.backoff(now, self._backoff_ms, self._backoff_max_ms)

    def position(self, tp: TopicPartition, timeout: float | None = None) -> int:
        """Offset of the next record `poll` returns for `tp`. If the position is not
        known yet (new assignment, pending seek_to_*), resolves it, waiting up to
        `timeout` seconds (default default.api.timeout.ms), following a leader
        change (metadata is refreshed after a leader error, as in poll). A known
        position is returned at once, also while the partition's leader is down.
        Raises errors.IllegalStateError (not assigned), errors.KafkaTimeoutError,
        errors.NoOffsetForPartitionError."""
        self._check_open()
        return run_flow(self._position_flow(tp, timeout), self._perform)

    def _position_flow(self, tp: TopicPartition, timeout: float | None) -> Generator:
        st = self._subs.state(TopicPartition(*tp))
        deadline = self._clock.now_s() + (self._api_timeout_s if timeout is None else timeout)
        while not st.has_position:
            self._update_positions()
            if st.has_position:
                break
            remaining = deadline - self._clock.now_s()
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
               timeout: float | None = None, *, asynchronous: bool = False,
               callback: CommitCallback | None = None) -> None:
        """Commit offsets: `offsets` maps TopicPartition to OffsetAndMetadata (or
        an int offset): the offset of the next record to read. None commits the
        current positions of all assigned partitions (paused ones included).

        Synchronous (default): retries coordinator moves for up to `timeout`
        seconds (default default.api.timeout.ms), then calls `callback(None,
        offsets)` — or `callback(error, offsets)` and raises the error.
        `asynchronous=True` (confluent-kafka's default, Kafka's commitAsync):
        sends one OffsetCommit and returns at once; `callback(error or None,
        offsets)` (`offsets`: {TopicPartition: OffsetAndMetadata}) runs once the
        commit completed, in the application's thread: on the next `poll`,
        `commit` or `close` (like confluent-kafka's on_commit); close waits for
        commits in flight. Asynchronous commits are not retried.

        Raises errors.InvalidGroupIdError (no group.id); synchronously:
        RebalanceInProgressError / IllegalGenerationError / UnknownMemberIdError
        when the group rebalanced (the consumer rejoins on the next poll),
        FencedInstanceIdError, the last retriable error (e.g.
        NotCoordinatorError) after the timeout."""
        self._check_open()
        if self._group is None:
            raise errors.InvalidGroupIdError("commit() requires group.id")
        if offsets is None:
            todo = {tp: OffsetAndMetadata(pos) for tp, pos in self._subs.positions().items()}
        else:
            todo = {TopicPartition(*tp): om if isinstance(om, OffsetAndMetadata) else OffsetAndMetadata(int(om))
                    for tp, om in offsets.items()}
        managed = self._subs.subscription is not None
        if asynchronous:
            def _completed(err: errors.ExactlyError | None) -> None:
                if callback is not None:
                    self._commit_results.append((callback, err, todo))

            fut = self._group.commit_async(todo, managed, _completed)
            if fut is not None:
                self._async_commits.add(fut)
                fut.add_done_callback(self._async_commits.discard)
            return
        self._run_commit_callbacks()
        try:
            run_flow(self._commit_flow(todo, timeout), self._perform)
        except errors.ExactlyError as exc:
            if callback is not None:
                callback(exc, todo)
            raise
        if callback is not None:
            callback(None, todo)

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

    def _run_commit_callbacks(self) -> None:
        """Run the callbacks of completed asynchronous commits (this thread);
        raises the first exception a callback raised, after running all."""
        failure: BaseException | None = None
        while self._commit_results:
            callback, err, offsets = self._commit_results.popleft()
            try:
                callback(err, offsets)
            except Exception as exc:  # noqa: BLE001 - re-raised below
                log.exception("commit callback failed")
                failure = failure or exc
        if failure is not None:
            raise failure

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

    def get_watermark_offsets(self, partition: TopicPartition, timeout: float | None = None,
                              cached: bool = False) -> tuple[int, int]:
        """(low, high) offsets of `partition`, as confluent-kafka: low is the log
        start offset, high the high watermark (the offset after the last
        replicated record, whatever the isolation level; under read_committed
        `end_offsets` answers the LSO). Asks the partition's leader (ListOffsets
        -2 and -1), waiting up to `timeout` seconds (default
        default.api.timeout.ms). `cached=True` answers from the last fetch
        response of an assigned partition without a request, OFFSET_INVALID
        (-1001) for what is not known yet. Raises errors.KafkaTimeoutError;
        non-retriable errors of the leader."""
        self._check_open()
        tp = TopicPartition(*partition)
        if cached:
            st = self._subs.assignment.get(tp)
            if st is None:
                return OFFSET_INVALID, OFFSET_INVALID
            return (st.log_start_offset if st.log_start_offset >= 0 else OFFSET_INVALID,
                    st.high_watermark if st.high_watermark >= 0 else OFFSET_INVALID)
        deadline = self._clock.now_s() + (self._api_timeout_s if timeout is None else timeout)
        low = self._fetcher.list_offsets({tp: EARLIEST_TIMESTAMP}, READ_UNCOMMITTED,
                                         max(0.0, deadline - self._clock.now_s()))
        high = self._fetcher.list_offsets({tp: LATEST_TIMESTAMP}, READ_UNCOMMITTED,
                                          max(0.0, deadline - self._clock.now_s()))
        return low[tp][0], high[tp][0]

    def beginning_offsets(self, partitions: Iterable[TopicPartition],
                          timeout: float | None = None) -> dict[TopicPartition, int]:
        """{tp: first offset} (the log start offset) of `partitions`, assigned or
        not (Kafka's beginningOffsets). Waits up to `timeout` seconds (default
        default.api.timeout.ms). Raises errors.KafkaTimeoutError."""
        return self._offsets_at(partitions, EARLIEST_TIMESTAMP, timeout)

    def end_offsets(self, partitions: Iterable[TopicPartition],
                    timeout: float | None = None) -> dict[TopicPartition, int]:
        """{tp: end offset} of `partitions`: the high watermark under
        read_uncommitted, the last stable offset under read_committed (Kafka's
        endOffsets; where `seek_to_end` goes). Waits up to `timeout` seconds
        (default default.api.timeout.ms). Raises errors.KafkaTimeoutError."""
        return self._offsets_at(partitions, LATEST_TIMESTAMP, timeout)

    def _offsets_at(self, partitions: Iterable[TopicPartition], timestamp: int,
                    timeout: float | None) -> dict[TopicPartition, int]:
        self._check_open()
        tps = [TopicPartition(*tp) for tp in partitions]
        found = self._fetcher.list_offsets({tp: timestamp for tp in tps}, self._isolation_level,
                                           self._api_timeout_s if timeout is None else timeout)
        return {tp: found[tp][0] for tp in tps}

    def offsets_for_times(self, timestamps: Mapping[TopicPartition, int],
                          timeout: float | None = None) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """For each `{tp: timestamp_ms}`, the earliest offset whose record
        timestamp is >= timestamp_ms, with that record's timestamp, as
        OffsetAndTimestamp(offset, timestamp); None when there is no such record
        (below the high watermark, or the LSO under read_committed). Kafka's
        offsetsForTimes (ListOffsets by timestamp; the leaders use a time index).
        Waits up to `timeout` seconds (default default.api.timeout.ms). Raises
        ValueError for a negative timestamp, errors.KafkaTimeoutError."""
        self._check_open()
        queries = {TopicPartition(*tp): int(ts) for tp, ts in timestamps.items()}
        for tp, ts in queries.items():
            if ts < 0:
                raise ValueError(f"timestamp of {tp.topic}-{tp.partition} must be >= 0, not {ts}")
        found = self._fetcher.list_offsets(queries, self._isolation_level,
                                           self._api_timeout_s if timeout is None else timeout)
        return {tp: OffsetAndTimestamp(*found[tp]) if found[tp][0] >= 0 else None for tp in queries}

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

    def close(self, timeout: float | None = None) -> None:
        """Wait for asynchronous commits in flight and run their callbacks, commit
        positions (if auto commit), call on_revoke (on_lost when the partitions
        were lost) for the owned partitions, leave the group (a static member
        sends no LeaveGroup: its partitions wait session.timeout.ms for it,
        KIP-345), and close connections. `timeout`: seconds for the commits
        (default default.api.timeout.ms). Idempotent. In a forked child, a consumer
        of the parent is only marked closed (its group membership stays the parent's)."""
        if self._closed:
            return
        if self._created_in_pid != os.getpid():
            self._closed = True
            self._core.close()
            return
        wait_s = self._api_timeout_s if timeout is None else timeout
        try:
            if self._async_commits:
                self._clock.wait_futures(list(self._async_commits), wait_s, concurrent.futures.ALL_COMPLETED)
            try:
                self._run_commit_callbacks()
            except Exception:  # noqa: BLE001 - closing anyway
                log.exception("commit callback failed during close")
            run_flow(self._close_flow(wait_s), self._perform)
        finally:
            self._release()
            self._core.close()

    def _close_flow(self, wait_s: float | None = None) -> Generator:
        wait_s = self._api_timeout_s if wait_s is None else wait_s
        if self._group is not None and self._subs.subscription is not None:
            yield from self._give_up_partitions()
        elif self._auto_commit:
            yield from self._commit_quietly(min(wait_s, self._session_timeout_ms / 1000.0))
        if self._group is not None:
            yield LeaveGroup()

    def _release(self) -> None:
        """Closed: cancel every request in flight (the core is closed next)."""
        self._closed = True
        self._fetcher.close()
        self._cancel_position_requests()

    def _cancel_position_requests(self) -> None:
        for fut, _ in self._list_offsets.values():
            fut.cancel()
        self._list_offsets.clear()
        if self._offset_fetch is not None:
            self._offset_fetch[0].cancel()
            self._offset_fetch = None

    def __enter__(self) -> "Consumer":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __del__(self) -> None:
        # Unclosed: a ResourceWarning; nothing is committed, no LeaveGroup sent (exactly._unclosed).
        collected(self, not getattr(self, "_closed", True), self._abandon)

    def _abandon(self) -> None:
        """Release what an unclosed consumer holds, without waiting or I/O."""
        self._release()
        if self._group is not None:
            self._group.stop_heartbeat()
        self._core.close()

    def _check_open(self) -> None:
        """Raise errors.IllegalStateError when closed, or in a forked child of the
        process that created this consumer."""
        _fork.check_process(self._created_in_pid, "consumer")
        if self._closed:
            raise errors.IllegalStateError("consumer is closed")


def _takes_generation(callback: Callable) -> bool:
    """Whether an on_assign callback accepts (partitions, generation)."""
    try:
        params = inspect.signature(callback).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in params)


def _pattern_of(topics: Iterable[str] | str | re.Pattern) -> re.Pattern | None:
    """The regular expression of a pattern subscription (a compiled pattern, or
    a str starting with "^", alone or as the only list element), else None.
    Raises ValueError for an invalid expression or a pattern mixed with names."""
    items = [topics] if isinstance(topics, (str, re.Pattern)) else list(topics)
    patterns = [t for t in items if isinstance(t, re.Pattern) or (isinstance(t, str) and t.startswith("^"))]
    if not patterns:
        return None
    if len(items) != 1:
        raise ValueError("subscribe() takes one pattern, or topic names, not both")
    p = patterns[0]
    if isinstance(p, re.Pattern):
        return p
    try:
        return re.compile(p)
    except re.error as exc:
        raise ValueError(f"invalid topic pattern {p!r}: {exc}") from None


def rewind_to_committed(consumer: Any) -> None:
    """Seek every partition assigned to `consumer` back to its committed offset (the
    beginning when nothing is committed), so records of an aborted transaction are
    consumed again (`Producer.run_in_transaction` does it after an aborted attempt). Raises
    what Consumer.committed raises."""
    parts = list(consumer.assignment())
    if not parts:
        return
    seek_to_committed(consumer, parts, consumer.committed(parts))


def seek_to_committed(consumer: Any, partitions: Iterable[TopicPartition],
                      committed: Mapping[TopicPartition, OffsetAndMetadata | None]) -> None:
    """Seek each of `partitions` of `consumer` (a Consumer or an exactly.aio.AIOConsumer,
    whose seeks are synchronous) to its offset in `committed` (what `committed()`
    returned), or to the beginning where there is none. No I/O; raises what seek raises
    (errors.IllegalStateError for an unassigned partition)."""
    for tp in partitions:
        om = committed.get(tp)
        if om is None:
            consumer.seek_to_beginning([tp])
        else:
            consumer.seek(tp, om.offset)


__all__ = ["Consumer", "rewind_to_committed", "seek_to_committed", "WaitForResponses",
           "CommitOffsets", "FetchCommitted", "LeaveGroup", "OFFSET_INVALID"]
