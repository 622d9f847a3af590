"""Ownership of internal-topic partitions by coordinators, elected through ZooKeeper.

Partition p of `TRANSACTION_STATE_TOPIC` (kind "txn") or `CONSUMER_OFFSETS_TOPIC` ("group")
belongs to the live coordinator sorted_ids[p % n] of that kind (docs/design.md, "Architecture"). The
owner claims it with a compare-and-set on /exactly/coordinators/<kind>/<p> that
bumps the coordinator epoch, then loads it; a coordinator whose claim was
overwritten, whose ZooKeeper session was lost, or whose writes were fenced resigns
at once (docs/design.md, "Coordinator ownership").

Fencing of a deposed owner. Coordinators are not the partition leaders of their
internal topic, so a deposed owner that has not noticed yet could still append. To
keep it from corrupting the state of the new owner, every claim also bumps a
*writer epoch*: each internal partition has a writer producer id (reserved once
from the PID blocks, so never handed to a client) and the owner writes all its
non-transactional batches with that PID and its writer epoch (no sequence;
internal topics accept that). Before loading, the new owner appends a fence
record (`fence_batch`) with its epoch; from then on the partition leader rejects
batches with an older epoch (INVALID_PRODUCER_EPOCH), and the replay, which reads
up to the high watermark after the fence, sees every batch the old owner got in.
This is Kafka's producer-epoch fencing applied to the coordinators themselves.
When the writer epoch would overflow int16 the claim takes a new writer PID and
records the old one as retired; every owner then also closes the retired PID with a
fence at the highest epoch, so that no owner from before the rotation can write.
"""
from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass
from typing import Awaitable, Callable, Mapping

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, RolledBackError, RuntimeInconsistency

from exactly_wire import records
from exactly_wire.error_codes import ErrorCode

from . import features
from ..protocol import INTERNAL_TOPIC_FOR_KIND
from .coordinator_replicas import COORDINATOR_LED_LEVEL, claim_assignment, with_assignment
from .features import FEATURES_PATH
from .state import COORDINATORS, PARTITION_LEADER, ROLE_FOR_KIND, TOPICS, ClusterState

log = logging.getLogger(__name__)

# Producer epochs are int16 in record batches; a writer epoch past this gets a new PID.
MAX_WRITER_EPOCH = 32766
# The epoch of the fence that closes a retired writer PID for good.
RETIRED_WRITER_EPOCH = 32767

# Errors of an internal-topic append that mean "a newer owner wrote with a higher
# writer epoch": the writer is deposed.
FENCED_APPEND_ERRORS = frozenset({ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.PRODUCER_FENCED})


@dataclass(frozen=True)
class Claim:
    """The outcome of a claim: coordinator epoch (markers carry it), the writer
    identity (producer id, producer epoch) of the owner's internal-topic batches, and
    the retired writer PID to close (-1: none)."""

    partition: int
    coordinator_epoch: int
    producer_id: int
    producer_epoch: int
    retired_producer_id: int = -1


def fence_batch(producer_id: int, producer_epoch: int, timestamp_ms: int) -> bytes:
    """A record batch that only moves the writer epoch forward on the partition
    leader: one record with an empty key and no value, written with the writer's
    PID and epoch, no sequence, not transactional. Readers of the internal topics
    skip records with an empty key."""
    return records.encode_batch([(b"", None, (), timestamp_ms)], producer_id=producer_id,
                                producer_epoch=producer_epoch, base_sequence=records.NO_SEQUENCE)


def fence_batches(producer_id: int, producer_epoch: int, retired_producer_id: int,
                  timestamp_ms: int) -> list[bytes]:
    """The fence batches a new owner appends before replaying: the one closing the
    retired writer PID (if any, at RETIRED_WRITER_EPOCH), then its own."""
    out = []
    if retired_producer_id >= 0:
        out.append(fence_batch(retired_producer_id, RETIRED_WRITER_EPOCH, timestamp_ms))
    out.append(fence_batch(producer_id, producer_epoch, timestamp_ms))
    return out


def is_fence_record(key: bytes | None) -> bool:
    """Whether a record of an internal topic is a fence record (empty key)."""
    return key is not None and len(key) == 0


class CoordinatorOwnership:
    """Elects this process to partitions of one internal topic. Runs on the
    service's asyncio loop.

    on_elected(partition, coordinator_epoch, producer_id=..., producer_epoch=...,
    retired_producer_id=...) and on_resigned(partition) are awaited on that loop;
    on_elected should start loading in a task of its own and return quickly. The
    writer identity passed to on_elected is what the coordinator must put on its
    internal-topic batches, after appending `fence_batches`.
    """

    def __init__(self, cluster: ClusterState, kind: str,
                 on_elected: Callable[..., Awaitable[None]],
                 on_resigned: Callable[[int], Awaitable[None]]):
        self.cluster = cluster
        self.kind = kind
        self.topic = INTERNAL_TOPIC_FOR_KIND[kind]
        self.role = ROLE_FOR_KIND[kind]
        self._on_elected = on_elected
        self._on_resigned = on_resigned
        self._owned: dict[int, Claim] = {}
        self._watched: set[int] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._lost = False
        self._stopped = False
        self._task: asyncio.Task | None = None

    @property
    def owned(self) -> dict[int, int]:
        """partition -> coordinator epoch of the partitions this process owns."""
        return {p: c.coordinator_epoch for p, c in self._owned.items()}

    def epoch(self, partition: int) -> int:
        """Coordinator epoch of an owned partition (-1 if not owned)."""
        claim = self._owned.get(partition)
        return claim.coordinator_epoch if claim else -1

    def claim(self, partition: int) -> Claim | None:
        """The current claim of an owned partition, or None."""
        return self._owned.get(partition)

    async def start(self) -> None:
        """Create the internal topic if needed (waiting for a live partition leader),
        then start electing."""
        self._loop = asyncio.get_running_loop()
        while True:
            try:
                await asyncio.to_thread(self.cluster.ensure_internal_topic, self.kind)
                break
            except RuntimeError as exc:
                log.info("waiting to create %s: %s", self.topic, exc)
                await asyncio.sleep(0.5)
        self.cluster.add_listener(self._kick)
        self.cluster.add_session_listener(self._on_session)
        self.cluster.add_feature_listener(lambda level: self._kick())
        self._task = asyncio.create_task(self._run(), name=f"{self.kind}-ownership")
        self._kick()

    async def stop(self) -> None:
        """Stop electing and resign every owned partition (clean shutdown; the
        others claim them when this process leaves /exactly/services)."""
        self._stopped = True
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for p in list(self._owned):
            await self._resign(p)

    def fenced(self, partition: int, coordinator_epoch: int) -> None:
        """Called by the coordinator when the partition leader rejected its
        write as coming from an older writer epoch: a newer owner exists, so resign
        `partition` if it is still held with `coordinator_epoch`. Call on the loop."""
        claim = self._owned.get(partition)
        if claim is not None and claim.coordinator_epoch == coordinator_epoch:
            log.warning("%s coordinator fenced on %s-%d (coordinator epoch %d); resigning",
                        self.kind, self.topic, partition, coordinator_epoch)
            asyncio.get_running_loop().create_task(self._resign(partition, coordinator_epoch))

    def _kick(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._wake.set)

    def _on_session(self, state: str) -> None:
        if state == "LOST":
            self._lost = True
        elif state == "CONNECTED":
            self._lost = False
        self._kick()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self._reconcile()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - keep electing; ZooKeeper may be flapping
                log.exception("coordinator election for %s failed; retrying", self.kind)
                await asyncio.sleep(0.5)
                self._wake.set()

    def desired(self) -> set[int]:
        """The partitions this process should own by its current view: none before it is
        registered, while its ZooKeeper session is lost or once stopped; otherwise
        partition p goes to live coordinator p % n of this kind, sorted by node id."""
        if self._lost or self._stopped or not self.cluster.registered:
            return set()
        topic = self.cluster.topic(self.topic)
        if topic is None:
            return set()
        live = sorted(n.node_id for n in self.cluster.nodes().values() if n.role == self.role)
        if self.cluster.node_id not in live:
            return set()
        return {p for p in topic.partitions if live[p % len(live)] == self.cluster.node_id}

    def in_view(self) -> bool:
        """Whether this process is registered and sees itself among the live
        coordinators of its kind. Until then `desired` is empty for want of a view, not
        because no partition is this process's."""
        return self.cluster.registered and any(
            n.node_id == self.cluster.node_id and n.role == self.role for n in self.cluster.nodes().values())

    def unloaded(self, loaded: Mapping[int, bool]) -> set[int]:
        """The partitions this process should own or holds whose load has not finished.

        `loaded`: the coordinator's partition -> loaded (False while loading). A claim is
        recorded here before the coordinator hears of it, so a partition it does not
        list yet counts as unloaded: readiness and health must not report a claimed
        partition as served before its load even began."""
        done = {p for p, ok in loaded.items() if ok}
        return (self.desired() | set(self._owned) | set(loaded)) - done

    def hosts_replicas(self, level: int | None = None) -> bool:
        """Whether the owners of this kind's partitions are their first replicas at
        `level` (default: the cached finalized level): a transaction coordinator at
        metadata.version 3 (coordinator_replicas.py)."""
        level = self.cluster.metadata_version if level is None else level
        return self.kind == "txn" and level >= COORDINATOR_LED_LEVEL

    async def _reconcile(self) -> None:
        desired = self.desired()
        for p in sorted(set(self._owned) - desired):
            await self._resign(p)
        if self.hosts_replicas():
            topic = self.cluster.topic(self.topic)
            for p in sorted(self._owned):
                replicas = topic.partitions.get(p) if topic is not None else None
                claim = self._owned.get(p)  # resigned meanwhile (the previous one's await)?
                if claim is not None and replicas and replicas[0] != self.cluster.node_id:
                    # Claimed below level 3 (the level was raised since): become its first replica.
                    await asyncio.to_thread(self._assign_owned, p, claim)
        for p in sorted(desired - set(self._owned)):
            if p not in self.desired():
                continue  # the view changed while we were claiming others
            claim = await asyncio.to_thread(self._claim, p)
            self._owned[p] = claim
            log.info("%s coordinator for %s-%d, coordinator epoch %d, writer %d/%d", self.kind, self.topic, p,
                     claim.coordinator_epoch, claim.producer_id, claim.producer_epoch)
            if p not in self._watched:
                self._watched.add(p)
                # kazoo passes (data, stat, event): bind the partition with partial,
                # not with a default argument that the event would overwrite.
                self.cluster.zk.DataWatch(f"{COORDINATORS}/{self.kind}/{p}",
                                          functools.partial(self._on_owner_change, p))
            # A claim by another process between our write and the watch is caught here.
            owner, epoch = await asyncio.to_thread(self.cluster.coordinator_owner, self.kind, p)
            if owner != self.cluster.node_id or epoch != claim.coordinator_epoch:
                await self._resign(p, claim.coordinator_epoch)
                continue
            try:
                await self._on_elected(p, claim.coordinator_epoch, producer_id=claim.producer_id,
                                       producer_epoch=claim.producer_epoch,
                                       retired_producer_id=claim.retired_producer_id)
            except Exception:  # noqa: BLE001 - do not keep a partition we cannot serve
                log.exception("%s coordinator failed to take %s-%d", self.kind, self.topic, p)
                await self._resign(p, claim.coordinator_epoch)
                raise

    def _claim(self, partition: int) -> Claim:
        """Compare-and-set /exactly/coordinators/<kind>/<p>: owner = this node, coordinator
        epoch + 1 (also on a restart of the same owner, so markers of the previous
        incarnation are fenced), writer epoch + 1 (a new writer PID from the PID blocks
        the first time, or when the epoch would overflow int16: the old PID is then
        kept as retired). Runs in a thread."""
        zk = self.cluster.zk
        path = f"{COORDINATORS}/{self.kind}/{partition}"
        while True:
            try:
                data, stat = zk.get(path)
            except NoNodeError:
                data, stat = b"", None
            d = features.zk_read("zk-coordinator-claim", data, path)
            coordinator_epoch = int(d.get("coordinator_epoch", -1)) + 1
            producer_id = int(d.get("producer_id", -1))
            producer_epoch = int(d.get("producer_epoch", -1)) + 1
            retired = int(d.get("retired_producer_id", -1))
            if producer_id < 0 or producer_epoch > MAX_WRITER_EPOCH:
                if producer_id >= 0:
                    retired = producer_id
                producer_id, _ = self.cluster.allocate_producer_id_block(1)
                producer_epoch = 0
            body = features.zk_json("zk-coordinator-claim", {
                "owner": self.cluster.node_id, "coordinator_epoch": coordinator_epoch, "producer_id": producer_id,
                "producer_epoch": producer_epoch, "retired_producer_id": retired})
            # The level read now, not the cached one: a claim decided at level 2 while
            # the level is being raised must not skip the first place (the multi-op below
            # also checks the features znode did not change meanwhile).
            try:
                fdata, fstat = zk.get(FEATURES_PATH)
                level = features.decode_finalized(fdata)
            except NoNodeError:  # deleted by hand: the cached level stands
                fstat, level = None, self.cluster.metadata_version
            if not self.hosts_replicas(level):
                try:
                    if stat is None:
                        zk.create(path, body, makepath=True)
                    else:
                        zk.set(path, body, version=stat.version)
                except (NodeExistsError, BadVersionError):
                    continue
                return Claim(partition, coordinator_epoch, producer_id, producer_epoch, retired)
            # Level 3: the claim and the first place in the partition's replicas, in one multi-op.
            zk.ensure_path(f"{COORDINATORS}/{self.kind}")
            tx = zk.transaction()
            if fstat is not None:
                tx.check(FEATURES_PATH, fstat.version)
            if stat is None:
                tx.create(path, body)
            else:
                tx.set_data(path, body, version=stat.version)
            self._assign_in(tx, partition, d.get("owner"))
            if self._committed(tx, partition):
                return Claim(partition, coordinator_epoch, producer_id, producer_epoch, retired)

    def _assign_in(self, tx, partition: int, previous_owner: str | None) -> None:
        """Add to `tx` the topic znode's write that makes this process the first replica
        of `partition` (coordinator_replicas.claim_assignment), by compare-and-set on
        the version read; nothing when it is already."""
        found = self.cluster.read_topic(self.topic)
        if found is None:
            raise NoNodeError(f"{self.topic} does not exist")
        body, version = found
        key = str(partition)
        plan = claim_assignment(body["partitions"][key], (body.get("removing") or {}).get(key, ()),
                                self.cluster.node_id, previous_owner)
        if plan is None:
            return
        replicas, leaving = plan
        tx.set_data(f"{TOPICS}/{self.topic}", features.zk_json("zk-topic", with_assignment(body, partition, replicas,
                                                                                          leaving)), version=version)
        log.info("%s-%d: replicas %s -> %s (removing %s)", self.topic, partition,
                 ",".join(body["partitions"][key]), ",".join(replicas), ",".join(leaving) or "none")

    def _committed(self, tx, partition: int) -> bool:
        """Commit a claim's multi-op: True when it went through, False when a znode it
        compared changed meanwhile (read again and retry); raises other errors."""
        failed = [r for r in tx.commit() if isinstance(r, Exception)]
        if not failed:
            return True
        # ZooKeeper answers the op that failed with its error, the ones before it
        # RolledBack and the ones after it RuntimeInconsistency.
        cause = [r for r in failed if not isinstance(r, (RolledBackError, RuntimeInconsistency))]
        if all(isinstance(r, (NodeExistsError, BadVersionError)) for r in cause):
            log.info("%s-%d: claim raced (%r); reading again", self.topic, partition, cause)
            return False
        raise cause[0]

    def _assign_owned(self, partition: int, claim: Claim) -> None:
        """Make this process the first replica of a partition it owns under `claim`
        (claimed before metadata.version 3), in one multi-op that checks the claim
        znode is still that claim. Runs in a thread."""
        path = f"{COORDINATORS}/{self.kind}/{partition}"
        for _ in range(20):
            data, stat = self.cluster.zk.get(path)
            d = features.zk_read("zk-coordinator-claim", data, path)
            if d.get("owner") != self.cluster.node_id or int(d.get("coordinator_epoch", -1)) != claim.coordinator_epoch:
                return  # claimed by another: the owner watch resigns it
            tx = self.cluster.zk.transaction()
            tx.check(path, stat.version)
            # Normally the first replica is a partition leader here (claimed below level
            # 3); a coordinator first (a claim raced the raise) is the one that leaves.
            topic = self.cluster.topic(self.topic)
            first = (topic.partitions.get(partition) or [None])[0] if topic is not None else None
            leaders = {n.node_id for n in self.cluster.nodes().values() if n.role == PARTITION_LEADER}
            self._assign_in(tx, partition, first if first is not None and first not in leaders else None)
            if self._committed(tx, partition):
                return

    def _on_owner_change(self, partition: int, data: bytes | None, stat=None, event=None) -> None:
        """DataWatch callback (kazoo thread): resign when the znode no longer names
        this process with the epoch of our claim. A notification showing an older
        coordinator epoch than our claim's is stale, not a newer owner: kazoo
        re-reads the znode when a new session starts, and that read may have been
        answered before our claim was written (claims only ever raise the epoch, by
        compare-and-set). Resigning on it would cost the partition a needless
        second claim and load."""
        claim = self._owned.get(partition)
        if claim is None or self._loop is None or self._loop.is_closed():
            return
        if data is not None:  # None: the claim znode was deleted, nobody's claim stands
            try:
                d = features.zk_read("zk-coordinator-claim", data, f"{COORDINATORS}/{self.kind}/{partition}")
            except ValueError:  # a claim this version cannot read is not ours
                d = {}
            epoch = int(d.get("coordinator_epoch", claim.coordinator_epoch + 1))
            if epoch < claim.coordinator_epoch or (
                    epoch == claim.coordinator_epoch and d.get("owner") == self.cluster.node_id):
                return  # stale, or our own claim
        asyncio.run_coroutine_threadsafe(self._resign(partition, claim.coordinator_epoch), self._loop)

    async def _resign(self, partition: int, coordinator_epoch: int | None = None) -> None:
        claim = self._owned.get(partition)
        if claim is None or (coordinator_epoch is not None and claim.coordinator_epoch != coordinator_epoch):
            return
        del self._owned[partition]
        log.info("%s coordinator resigns %s-%d (coordinator epoch %d)", self.kind, self.topic, partition,
                 claim.coordinator_epoch)
        try:
            await self._on_resigned(partition)
        finally:
            self._kick()
