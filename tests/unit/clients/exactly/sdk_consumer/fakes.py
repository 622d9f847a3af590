"""In-process stand-ins for ClientCore, partition leaders and a group coordinator,
answering with the real protobuf messages (unit tests only)."""
from __future__ import annotations

import concurrent.futures
from typing import Any, Callable

from exactly import errors
from exactly_wire.error_codes import ErrorCode
from exactly_wire.v1 import exactly_pb2 as pb

from sdk_producer.fake_clock import FakeClock

from .logbuilder import PartitionLog


class _Stub:
    def __init__(self, core: "FakeCore", address: str):
        self._core, self._address = core, address

    def __getattr__(self, rpc: str) -> Callable:
        def method(request, timeout=None):
            return self._core.dispatch(self._address, rpc, request)
        method.rpc = rpc
        method.address = self._address
        return method


class FakeTopic:
    def __init__(self, name: str):
        self.name, self.is_internal, self.error_code = name, name.startswith("__"), 0


class FakeMetadata:
    """The cluster as `core` describes it: live (it follows `core.leaders` and
    `core.down`), or with `snapshot=True` frozen as it was when taken, like
    ClientCore's cached metadata."""

    def __init__(self, core: "FakeCore", snapshot: bool = False):
        self._leaders = dict(core.leaders) if snapshot else core.leaders
        self._down = set(core.down) if snapshot else core.down
        self._extra_topics = set(core.extra_topics) if snapshot else core.extra_topics
        self.fetched_at = core.metadata_refreshes

    @property
    def topics(self) -> dict[str, FakeTopic]:
        return {t: FakeTopic(t) for t in sorted({t for t, _ in self._leaders} | self._extra_topics)}

    def leader(self, topic: str, partition: int) -> str | None:
        addr = self._leaders.get((topic, partition))
        return None if addr in self._down else addr

    def partitions(self, topic: str) -> list[int]:
        return sorted(p for t, p in self._leaders if t == topic)


class FakeCore:
    """Quacks like exactly._client.ClientCore. `handlers[(address, rpc)]` answer
    requests; an address in `down` fails with NetworkException. A handler may
    return a concurrent.futures.Future to answer later (call_future only).
    `metadata()` follows `leaders` and `down` as they change, unless
    `cache_metadata` is set: then, like ClientCore, it answers the snapshot taken at
    the first call or the last `refresh=True`."""

    request_timeout_s = 30.0
    retry_backoff_ms = 1
    retry_backoff_max_ms = 5

    def __init__(self):
        self.leaders: dict[tuple[str, int], str] = {}
        self.handlers: dict[tuple[str, str], Callable[[Any], Any]] = {}
        self.down: set[str] = set()
        self.calls: list[tuple[str, str, Any]] = []
        self.coordinator_address = "coord:1"
        self.invalidations = 0
        self.metadata_refreshes = 0
        self.extra_topics: set[str] = set()
        self.cache_metadata = False
        self._cached: FakeMetadata | None = None
        # The consumer's clock (ClientCore.clock): virtual, driven by the test's thread; the
        # fakes answer at once, so a wait nothing ended within 2 ms waits out its timeout, and a
        # sleep (of retry.backoff.ms = 1 here) pauses 0.2 ms of real time.
        self.clock = FakeClock(grace_s=0.002, poll_s=0.0002)

    def dispatch(self, address: str, rpc: str, request):
        self.calls.append((address, rpc, request))
        if address in self.down:
            raise errors.NetworkException(f"{address} is down")
        return self.handlers[(address, rpc)](request)

    def calls_of(self, rpc: str) -> list:
        return [req for _, r, req in self.calls if r == rpc]

    def metadata(self, topics=None, refresh: bool = False) -> FakeMetadata:
        if refresh:
            self.metadata_refreshes += 1
        if not self.cache_metadata:
            return FakeMetadata(self)
        if refresh or self._cached is None:
            self._cached = FakeMetadata(self, snapshot=True)
        return self._cached

    metadata_nowait = metadata  # no I/O here: the same answer without waiting

    def pending_refresh(self):
        return None

    def leader_for(self, topic: str, partition: int) -> str:
        addr = FakeMetadata(self).leader(topic, partition)
        if addr is None:
            raise errors.LeaderNotAvailableError(f"no leader for {topic}-{partition}")
        return addr

    def retry(self, fn, timeout_s: float | None = None, on_retry=None):
        """Like ClientCore.retry, without waiting between tries (at most 20)."""
        for _ in range(19):
            try:
                return fn()
            except errors.ExactlyError as exc:
                if not exc.retriable:
                    raise
        return fn()

    def leader_stub(self, address: str) -> _Stub:
        return _Stub(self, address)

    group_stub = leader_stub

    def find_coordinator(self, key: str, key_type: int, timeout_s: float | None = None) -> str:
        if self.coordinator_address in self.down:
            raise errors.CoordinatorNotAvailableError("no coordinator")
        return self.coordinator_address

    def cached_coordinator(self, key: str, key_type: int) -> str | None:
        return None if self.coordinator_address in self.down else self.coordinator_address

    def submit(self, fn, *args) -> concurrent.futures.Future:
        """ClientCore.submit, run at once in this thread."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        try:
            fut.set_result(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - as a future would
            fut.set_exception(exc)
        return fut

    def invalidate_coordinator(self, key: str, key_type: int) -> None:
        self.invalidations += 1

    def call(self, method, request, timeout_s: float | None = None):
        result = method(request)
        if isinstance(result, concurrent.futures.Future):
            return result.result()
        return result

    def call_future(self, method, request, timeout_s: float | None = None) -> concurrent.futures.Future:
        try:
            result = method(request)
        except errors.ExactlyError as exc:
            fut: concurrent.futures.Future = concurrent.futures.Future()
            fut.set_exception(exc)
            return fut
        if isinstance(result, concurrent.futures.Future):
            return result
        fut = concurrent.futures.Future()
        fut.set_result(result)
        return fut

    def close(self) -> None:
        pass


class FakeLeader:
    """Serves Fetch and ListOffsets from PartitionLogs, with Kafka's read_committed
    semantics (data bounded by the LSO, aborted transactions listed)."""

    def __init__(self, core: FakeCore, address: str, logs: dict[tuple[str, int], PartitionLog]):
        self.logs = logs
        self.errors: dict[tuple[str, int], int] = {}  # one-shot per-partition error codes
        for key in logs:
            core.leaders[key] = address
        core.handlers[(address, "Fetch")] = self.fetch
        core.handlers[(address, "ListOffsets")] = self.list_offsets

    def fetch(self, req: pb.FetchRequest) -> pb.FetchResponse:
        out = []
        for ft in req.topics:
            parts = []
            for fp in ft.partitions:
                key = (ft.topic, fp.partition)
                log = self.logs[key]
                code = self.errors.pop(key, 0)
                if code:
                    parts.append(pb.FetchPartitionResponse(partition=fp.partition, error_code=code))
                    continue
                if fp.fetch_offset > log.next_offset:
                    parts.append(pb.FetchPartitionResponse(partition=fp.partition,
                                                           error_code=ErrorCode.OFFSET_OUT_OF_RANGE))
                    continue
                bound = log.lso() if req.isolation_level == 1 else None
                data, aborted = log.fetch(fp.fetch_offset, bound=bound)
                parts.append(pb.FetchPartitionResponse(
                    partition=fp.partition, high_watermark=log.next_offset, last_stable_offset=log.lso(),
                    log_start_offset=0, records=data,
                    aborted_transactions=[pb.AbortedTransaction(producer_id=p, first_offset=f)
                                          for p, f in aborted] if req.isolation_level == 1 else []))
            out.append(pb.FetchTopicResponse(topic=ft.topic, partitions=parts))
        return pb.FetchResponse(responses=out)

    def list_offsets(self, req: pb.ListOffsetsRequest) -> pb.ListOffsetsResponse:
        out = []
        for t in req.topics:
            parts = []
            for p in t.partitions:
                log = self.logs[(t.name, p.partition)]
                offset = {-2: 0, -1: log.next_offset, -3: log.lso()}.get(p.timestamp, -1)
                if p.timestamp >= 0:  # the fake's records have no timestamps: offset = timestamp
                    offset = p.timestamp if p.timestamp < log.next_offset else -1
                if p.timestamp == -1 and req.isolation_level == 1:
                    offset = log.lso()
                parts.append(pb.ListOffsetsPartitionResponse(
                    partition=p.partition, offset=offset,
                    timestamp=p.timestamp if p.timestamp >= 0 and offset >= 0 else -1))
            out.append(pb.ListOffsetsTopicResponse(name=t.name, partitions=parts))
        return pb.ListOffsetsResponse(topics=out)


class FakeGroupCoordinator:
    """A one-group coordinator: every JoinGroup starts a generation at once, and
    SyncGroup hands out `assignments[member_id]` (default: `assignment`)."""

    def __init__(self, core: FakeCore, address: str = "coord:1"):
        core.coordinator_address = address
        self.generation = 0
        self.members: list[str] = []
        self.assignment: list[tuple[str, int]] = []
        self.assignments: dict[str, list[tuple[str, int]]] = {}
        self.committed: dict[tuple[str, int], int] = {}
        self.unstable: set[tuple[str, int]] = set()
        self.heartbeat_code = 0
        self.join_codes: list[int] = []
        self.commit_codes: list[int] = []
        for rpc in ("JoinGroup", "SyncGroup", "Heartbeat", "LeaveGroup", "OffsetCommit", "OffsetFetch"):
            core.handlers[(address, rpc)] = getattr(self, rpc.lower())

    def joingroup(self, req: pb.JoinGroupRequest) -> pb.JoinGroupResponse:
        if self.join_codes:
            code = self.join_codes.pop(0)
            if code == ErrorCode.MEMBER_ID_REQUIRED:
                return pb.JoinGroupResponse(error_code=code, member_id=f"m{len(self.members) + 1}")
            return pb.JoinGroupResponse(error_code=code)
        member = req.member_id or f"m{len(self.members) + 1}"
        if member not in self.members:
            self.members.append(member)
        self.generation += 1
        return pb.JoinGroupResponse(generation_id=self.generation, protocol_name="range",
                                    leader=self.members[0], member_id=member, members=self.members)

    def syncgroup(self, req: pb.SyncGroupRequest) -> pb.SyncGroupResponse:
        if req.generation_id != self.generation:
            return pb.SyncGroupResponse(error_code=ErrorCode.ILLEGAL_GENERATION)
        tps = self.assignments.get(req.member_id, self.assignment)
        by_topic: dict[str, list[int]] = {}
        for t, p in tps:
            by_topic.setdefault(t, []).append(p)
        return pb.SyncGroupResponse(assignment=[pb.TopicPartitions(topic=t, partitions=ps)
                                                for t, ps in by_topic.items()])

    def heartbeat(self, req: pb.HeartbeatRequest) -> pb.HeartbeatResponse:
        return pb.HeartbeatResponse(error_code=self.heartbeat_code)

    def leavegroup(self, req: pb.LeaveGroupRequest) -> pb.LeaveGroupResponse:
        if req.member_id in self.members:
            self.members.remove(req.member_id)
        return pb.LeaveGroupResponse()

    def offsetcommit(self, req: pb.OffsetCommitRequest) -> pb.OffsetCommitResponse:
        code = self.commit_codes.pop(0) if self.commit_codes else 0
        results = []
        for t in req.topics:
            for p in t.partitions:
                if not code:
                    self.committed[(t.name, p.partition)] = p.committed_offset
            results.append(pb.TopicResult(topic=t.name, partitions=[
                pb.PartitionResult(partition=p.partition, error_code=code) for p in t.partitions]))
        return pb.OffsetCommitResponse(topics=results)

    def offsetfetch(self, req: pb.OffsetFetchRequest) -> pb.OffsetFetchResponse:
        topics = []
        for t in req.topics:
            parts = []
            for p in t.partitions:
                key = (t.topic, p)
                if req.require_stable and key in self.unstable:
                    self.unstable.discard(key)
                    parts.append(pb.OffsetFetchPartition(partition=p, committed_offset=-1,
                                                         error_code=ErrorCode.UNSTABLE_OFFSET_COMMIT))
                else:
                    parts.append(pb.OffsetFetchPartition(partition=p, committed_offset=self.committed.get(key, -1)))
            topics.append(pb.OffsetFetchTopic(name=t.topic, partitions=parts))
        return pb.OffsetFetchResponse(topics=topics)
