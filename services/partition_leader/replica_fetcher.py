"""Followers replicating from their leaders: one asyncio task per followed replica.

Each task follows one (leader, leader epoch), as Kafka's `ReplicaFetcherThread`:

1. Truncation (KIP-101): OffsetForLeaderEpoch with the replica's latest epoch to the
   leader; truncate where the two logs agree (`replication.truncation_offset`, never
   below the high watermark), repeating while the answer is not final. A replica with
   no epoch information truncates to its high watermark.
2. Fetch with `replica_id` from the log end offset, long-polling up to
   `replica.fetch.wait.max.ms`; the leader's batches are appended byte for byte
   (`Partition.append_as_follower`) and the high watermark follows the leader's.
   OFFSET_OUT_OF_RANGE sends the task back to truncation, except when the replica's
   log ends below the leader's log start offset (retention or DeleteRecords removed
   what it misses): it then starts empty there (`Partition.truncate_fully_and_start_at`).
   Every answer carries the leader's log start offset, which the replica adopts
   (`Partition.follow_log_start_offset`; its cleaner then deletes the segments below).

Transport failures and FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH / NOT_LEADER_OR_FOLLOWER
(the leader and this replica see different epochs, until the ZooKeeper watches catch
up) are retried after `replica.fetch.backoff.ms`. `sync()` starts, keeps or cancels
tasks to match `ReplicaManager.follower_targets()` after every refresh.

Fetches and OffsetForLeaderEpoch travel through the tunnel to the leader
(services/common/transport/tunnel.py): one stream per peer carries every follower task's calls,
each answered like the direct call (TunnelError is a grpc.RpcError).

Settings: replica.fetch.wait.max.ms (500), replica.fetch.max.bytes (1048576),
replica.fetch.backoff.ms (200).
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable, Mapping

import grpc

from exactly_wire.error_codes import ErrorCode
from exactly_wire.records import CorruptRecordError
from exactly_wire.v1 import exactly_pb2 as pb
from services.common.settings import PartitionLeaderSchema, role_settings
from services.common.transport.tunnel import TunnelChannel, method_path

from .leader_epoch import UNDEFINED_EPOCH, EpochEndOffset
from .partition import Partition
from .replica_manager import ReplicaManager, TopicPartition
from .replication import truncation_offset

log = logging.getLogger(__name__)

MAX_TRUNCATION_ROUNDS = 16
_FETCH = method_path("PartitionLeader", "Fetch")
_OFFSET_FOR_LEADER_EPOCH = method_path("PartitionLeader", "OffsetForLeaderEpoch")
_OK, _RETRY, _TRUNCATE = "ok", "retry", "truncate"


class ReplicaFetchers:
    """The follower tasks of one process.

    addresses(node_id) -> "host:port" of a live node or None; tunnel(address) -> the
    TunnelChannel to it (shared, ClusterClient.tunnel); notify(tp) wakes waiters when a
    replica's state moved.
    """

    def __init__(self, manager: ReplicaManager, addresses: Callable[[str], str | None],
                 tunnel: Callable[[str], TunnelChannel],
                 props: PartitionLeaderSchema | Mapping[str, str] | None = None,
                 notify: Callable[[TopicPartition], None] = lambda tp: None):
        settings = role_settings(PartitionLeaderSchema, props or {})
        self.manager = manager
        self.addresses = addresses
        self.tunnel = tunnel
        self.notify = notify
        self.max_wait_ms = settings.replica_fetch_wait_max_ms
        self.max_bytes = settings.replica_fetch_max_bytes
        self.backoff_s = settings.replica_fetch_backoff_ms / 1000
        self._tasks: dict[TopicPartition, tuple[tuple[str, int], asyncio.Task]] = {}

    def sync(self) -> None:
        """Match the tasks to the manager's followed replicas (leader, epoch)."""
        targets = self.manager.hosted.follower_targets()
        for tp, (target, task) in list(self._tasks.items()):
            if targets.get(tp) != target or task.done():
                task.cancel()
                del self._tasks[tp]
        for tp, target in targets.items():
            if tp not in self._tasks:
                task = asyncio.create_task(self._follow(tp, *target), name=f"fetch-{tp[0]}-{tp[1]}")
                self._tasks[tp] = (target, task)

    async def stop(self) -> None:
        tasks = [t for _, t in self._tasks.values()]
        self._tasks.clear()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _current(self, tp: TopicPartition, leader: str, epoch: int) -> Partition | None:
        p = self.manager.hosted.replicas.get(tp)
        if p is None or p.is_leader or p.leader_id != leader or p.leader_epoch != epoch:
            return None
        return p

    async def _follow(self, tp: TopicPartition, leader: str, epoch: int) -> None:
        truncated = False
        while True:
            p = self._current(tp, leader, epoch)
            if p is None:
                return
            address = self.addresses(leader)
            if address is None:
                await asyncio.sleep(self.backoff_s)
                continue
            calls = self.tunnel(address)
            try:
                if not truncated:
                    truncated = await self._truncate(calls, tp, leader, epoch)
                    if not truncated:
                        await asyncio.sleep(self.backoff_s)
                    continue
                outcome = await self._fetch(calls, tp, leader, epoch)
                if outcome != _OK:
                    truncated = outcome != _TRUNCATE
                    await asyncio.sleep(self.backoff_s)
            except asyncio.CancelledError:
                raise
            except grpc.RpcError as exc:
                log.debug("%s-%d: fetching from %s failed: %s", *tp, leader, exc)
                await asyncio.sleep(self.backoff_s)
            except OSError as exc:  # the log directory failed (KIP-112): every replica here stops
                log.exception("%s-%d: writing the batches from %s failed", *tp, leader)
                self.manager.hosted.fail_log_dir(exc)
                return
            except Exception:  # noqa: BLE001 - keep following; logged with its traceback
                log.exception("%s-%d: replication from %s failed", *tp, leader)
                truncated = False
                await asyncio.sleep(self.backoff_s)

    async def _truncate(self, calls: TunnelChannel, tp: TopicPartition, leader: str, epoch: int) -> bool:
        """Truncation phase; True once the log agrees with the leader's."""
        for _ in range(MAX_TRUNCATION_ROUNDS):
            p = self._current(tp, leader, epoch)
            if p is None:
                return False
            latest = p.epochs.latest_epoch
            if latest == UNDEFINED_EPOCH:
                p.truncate_to(p.high_watermark)
                return True
            req = pb.OffsetForLeaderEpochRequest(replica_id=self.manager.hosted.node_id, topics=[pb.OffsetForLeaderTopic(
                topic=tp[0], partitions=[pb.OffsetForLeaderPartition(partition=tp[1], current_leader_epoch=epoch,
                                                                     leader_epoch=latest)])])
            resp = await calls.call(_OFFSET_FOR_LEADER_EPOCH, req, pb.OffsetForLeaderEpochResponse, 30)
            part = resp.topics[0].partitions[0]
            p = self._current(tp, leader, epoch)
            if p is None:
                return False
            if part.error_code != ErrorCode.NONE:
                log.debug("%s-%d: OffsetForLeaderEpoch from %s: %s", *tp, leader, ErrorCode(part.error_code).name)
                return False
            offset, complete = truncation_offset(EpochEndOffset(part.leader_epoch, part.end_offset), p.epochs,
                                                 p.log_end_offset, p.high_watermark)
            p.truncate_to(offset)
            if complete:
                log.info("%s-%d: following %s in epoch %d from offset %d", *tp, leader, epoch, p.log_end_offset)
                return True
        return True

    async def _fetch(self, calls: TunnelChannel, tp: TopicPartition, leader: str, epoch: int) -> str:
        """One replica fetch: _OK, _RETRY (an error answer: back off) or _TRUNCATE
        (the log must be truncated again first)."""
        p = self._current(tp, leader, epoch)
        if p is None:
            return _OK
        req = pb.FetchRequest(replica_id=self.manager.hosted.node_id, max_wait_ms=self.max_wait_ms, min_bytes=1,
                              max_bytes=self.max_bytes, topics=[pb.FetchTopic(topic=tp[0], partitions=[
                                  pb.FetchPartition(partition=tp[1], fetch_offset=p.log_end_offset,
                                                    partition_max_bytes=self.max_bytes,
                                                    current_leader_epoch=epoch)])])
        resp = await calls.call(_FETCH, req, pb.FetchResponse, self.max_wait_ms / 1000 + 30)
        p = self._current(tp, leader, epoch)
        if p is None:
            return _OK
        if resp.error_code:
            return _RETRY
        part = resp.responses[0].partitions[0]
        if part.error_code != ErrorCode.NONE:
            if part.error_code == ErrorCode.OFFSET_OUT_OF_RANGE and \
                    0 <= p.log_end_offset < part.log_start_offset <= part.high_watermark:
                p.truncate_fully_and_start_at(part.log_start_offset)
                return _OK
            if part.error_code == ErrorCode.OFFSET_OUT_OF_RANGE:
                log.info("%s-%d: offset %d out of range at %s; truncating again", *tp, p.log_end_offset, leader)
                return _TRUNCATE
            log.debug("%s-%d: fetch from %s: %s", *tp, leader, ErrorCode(part.error_code).name)
            return _RETRY
        if part.records:
            try:
                p.append_as_follower(part.records)
            except (CorruptRecordError, ValueError) as exc:
                log.warning("%s-%d: cannot append the batches from %s: %s", *tp, leader, exc)
                return _TRUNCATE
        if p.update_follower_high_watermark(part.high_watermark):
            self.notify(tp)
        if part.log_start_offset > p.log_start_offset:
            p.follow_log_start_offset(part.log_start_offset)
        return _OK
