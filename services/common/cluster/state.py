"""Cluster state in ZooKeeper (kazoo): live services, topics, partition state,
coordinator ownership and PID blocks.

Layout (docs/design.md, "ZooKeeper layout"):

    /exactly/features                      {"version", "features": {"metadata.version": level}} (features.py)
    /exactly/services/<node_id>            ephemeral: {"version", "role", "host", "port", "kafka_port",
                                           "broker_id", "features"[, "log_dir_offline"]}
    /exactly/topics/<topic>                {"partitions": {"0": [replica ids]}, "configs", "internal"}
    /exactly/topics/<topic>/<p>/state      {"leader", "leader_epoch", "isr"} (versioned CAS)
    /exactly/coordinators/<kind>/<p>       {"owner", "coordinator_epoch"} (versioned CAS)
    /exactly/producer_id_block             {"next": first PID of the next block} (versioned CAS)

Views are cached and refreshed by watches; every public method is thread-safe.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import zlib
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry

from exactly_wire.error_codes import ErrorCode

from ..protocol import INTERNAL_TOPIC_FOR_KIND, TRANSACTION_STATE_TOPIC
from ..topic_config import CLEANUP_POLICY, COMPACT, MIN_INSYNC_REPLICAS, SEGMENT_BYTES
from ..transport import limits
from ..settings import (SERVICE_SCHEMAS, GroupCoordinatorSchema, ServiceSchema, TxnCoordinatorSchema,
                        role_settings)
from ..security.zk_security import ZkSecurity
from ..security.zk_tls import ZkTls
from . import features
from .features import FEATURES_PATH, SupportedRange
from .partition_usage import PartitionUsage

log = logging.getLogger(__name__)

# What a call to ZooKeeper raises when ZooKeeper does not answer: kazoo's errors, and
# KazooTimeoutError (a read with a timeout that ran out, not a KazooException).
ZOOKEEPER_ERRORS = (KazooException, KazooTimeoutError, OSError, TimeoutError)

ROOT = "/exactly"
SERVICES = f"{ROOT}/services"
TOPICS = f"{ROOT}/topics"
COORDINATORS = f"{ROOT}/coordinators"
PID_BLOCK = f"{ROOT}/producer_id_block"

ROLE_FOR_KIND = {"txn": "txn_coordinator", "group": "group_coordinator"}
# FindCoordinator key types: 0 group, 1 transaction, 2 transaction-group (KIP-447 draft:
# a group-aware producer's transaction coordinator is the owner of partition
# crc32(group id) % n of TRANSACTION_STATE_TOPIC, so every producer of a group has one).
KIND_FOR_KEY_TYPE = {0: "group", 1: "txn", 2: "txn"}

PARTITION_LEADER = "partition_leader"


@dataclass(frozen=True)
class NodeInfo:
    node_id: str
    role: str
    host: str
    port: int
    kafka_port: int = 0  # the Kafka protocol listener's port; 0: none
    # The broker id the node registered (its data directory's meta.properties); None: a
    # version that registers none, whose id is the derivation `broker_id(node_id)`.
    registered_broker_id: int | None = None
    # The metadata.version levels it supports (features.py; a version before feature levels: 1).
    supported: SupportedRange = features.PRE_FEATURES

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def broker_id(self) -> int:
        """The int32 broker id Kafka clients know this node by."""
        return broker_id(self.node_id) if self.registered_broker_id is None else self.registered_broker_id

    @classmethod
    def from_registration(cls, node_id: str, data: bytes) -> "NodeInfo":
        """A node from its registration znode's JSON. Raises UnknownFormatVersion (a
        layout this version does not read), ValueError or KeyError (malformed)."""
        d = features.zk_read("zk-registration", data, f"{SERVICES}/{node_id}")
        registered = d.get("broker_id")
        return cls(node_id, d["role"], d["host"], int(d["port"]), int(d.get("kafka_port", 0)),
                   None if registered is None else int(registered), features.supported_of(d))


BROKER_ID_BITS = 24
# Attempts of a compare-and-set write that other writers keep changing (each one reads again).
_CAS_ATTEMPTS = 20


def broker_id(node_id: str) -> int:
    """The Kafka broker id of a node id: a stable int32 in [0, 2**24) (the low 24
    bits of the CRC-32 of the UTF-8 node id), the same in every process without
    coordination. Below 2**24 because librdkafka (2.12 at least) copies the
    cluster id of a Metadata response up to the next zero byte, which is the top
    byte of the controller id that follows it: with a non-zero top byte the
    cluster id gets trailing garbage and confluent-kafka's describe_cluster()
    crashes (Kafka's own broker ids are small, so this never shows there)."""
    return zlib.crc32(node_id.encode()) & ((1 << BROKER_ID_BITS) - 1)


class BrokerIdCollision(RuntimeError):
    """Another live node id has this node's Kafka broker id (`broker_id`)."""


def broker_id_collision(node_id: str, live: Iterable[str], mine: int | None = None,
                        registered: Mapping[str, int] | None = None) -> str | None:
    """The live node id, other than `node_id`, whose broker id equals `node_id`'s
    (`mine`; default: derived), or None; `registered`: the ids live nodes registered
    (the others' are derived). Two such nodes would be one broker to Kafka clients, so
    the second refuses to register (rename one of them)."""
    mine = broker_id(node_id) if mine is None else mine
    registered = registered or {}
    return next((other for other in live
                 if other != node_id and registered.get(other, broker_id(other)) == mine), None)


@dataclass(frozen=True)
class PartitionState:
    """Content of /exactly/topics/<topic>/<p>/state: leader node id (None: offline),
    leader epoch, in-sync replicas; `version` and `mzxid` of the znode when read from
    ZooKeeper (-1 otherwise), for compare-and-set and for telling whether a leader
    registered after the state was written (it restarted)."""

    leader: str | None
    leader_epoch: int
    isr: tuple[str, ...]
    version: int = -1
    mzxid: int = -1

    def encode(self) -> bytes:
        return features.zk_json("zk-partition-state", {"leader": self.leader, "leader_epoch": self.leader_epoch,
                                                       "isr": list(self.isr)})

    @classmethod
    def decode(cls, data: bytes, version: int = -1, mzxid: int = -1) -> "PartitionState":
        """Raises features.UnknownFormatVersion for a state of a newer version."""
        d = features.zk_read("zk-partition-state", data, "partition state")
        return cls(d.get("leader"), int(d.get("leader_epoch", 0)), tuple(d.get("isr", ())), version, mzxid)


@dataclass(frozen=True)
class TopicInfo:
    name: str
    partitions: dict[int, list[str]]  # partition -> replica node ids
    configs: dict[str, str] = field(default_factory=dict)
    internal: bool = False
    states: dict[int, PartitionState] = field(default_factory=dict)
    principal: str = ""  # who created it (CreateTopics' caller; "" for internal and older topics)
    # partition -> replicas leaving it once its first replica leads (coordinator_replicas.py; level 3)
    removing: dict[int, tuple[str, ...]] = field(default_factory=dict)

    def leader(self, partition: int) -> str | None:
        st = self.states.get(partition)
        if st is not None:
            return st.leader
        replicas = self.partitions.get(partition)
        return replicas[0] if replicas else None


def state_path(topic: str, partition: int) -> str:
    """ZooKeeper path of a partition's state znode."""
    return f"{TOPICS}/{topic}/{partition}/state"


def partition_for_key(key: str, num_partitions: int) -> int:
    """Stable partition of an internal topic for a transactional.id or group id:
    crc32(utf-8 key) % num_partitions (never Python's hash(); docs/design.md, "Architecture")."""
    return zlib.crc32(key.encode()) % num_partitions


def reconnect_retry(session_timeout_s: float) -> KazooRetry:
    """How kazoo reconnects after losing ZooKeeper (`session_timeout_s` in s): forever,
    backing off from 0.1 s to min(session timeout / 4, 1 s) between attempts. Kazoo's default
    doubles up to an hour, so after a ZooKeeper outage of 30 s a process would try
    again up to some 20 s after the server's return, and the session the server
    restored would expire meanwhile (docs/design.md, "ZooKeeper faults")."""
    return KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_jitter=0.4,
                      max_delay=max(min(session_timeout_s / 4, 1.0), 0.1))


class ClusterState:
    """This process's view of the cluster in ZooKeeper.

    zk_hosts: "host:port[,...]"; node_id/role/host/port: this process's identity,
    published by `register()` as an ephemeral znode.
    """

    def __init__(self, zk_hosts: str, node_id: str, role: str, host: str, port: int,
                 session_timeout_s: float = 10.0, props: ServiceSchema | Mapping[str, object] | None = None,
                 assigned_broker_id: int | None = None):
        # The process's parsed settings (a mapping of Kafka keys is parsed with the role's schema).
        self.settings = role_settings(SERVICE_SCHEMAS.get(role, ServiceSchema), props or {})
        self.node_id = node_id
        self.role = role
        self.host = host
        self.port = port
        self.kafka_port = 0  # set before register() when a Kafka listener runs
        # This node's Kafka broker id (its data directory's meta.properties; None: derived).
        self.broker_id = broker_id(node_id) if assigned_broker_id is None else assigned_broker_id
        # The finalized metadata.version (features.py), read by start() and kept current
        # by a watch; `features_epoch` is the version of its znode.
        self.metadata_version = features.BASELINE_LEVEL
        self.features_epoch = -1
        # The levels this process runs at (unstable.feature.versions.enable adds the unstable ones).
        self.supported = features.supported_range(self.settings.unstable_feature_versions_enable)
        self._feature_listeners: list[Callable[[int], None]] = []
        # zookeeper.set.acl: digest credentials and znode ACLs (zk_security.py).
        self.zk_security = ZkSecurity(self.settings)
        # With the authorizer on: producer id bindings (pid_binding.py), set by server.py.
        self.pid_bindings = None
        # zookeeper.ssl.client.enable: the session over TLS to the secureClientPort (zk_tls.py).
        self.zk_tls = ZkTls.from_settings(self.settings)
        self.zk = KazooClient(hosts=zk_hosts, timeout=session_timeout_s, auth_data=self.zk_security.auth_data,
                              default_acl=self.zk_security.default_acl,
                              connection_retry=reconnect_retry(session_timeout_s), **self.zk_tls.kazoo_kwargs())
        self._lock = threading.RLock()
        self._nodes: dict[str, NodeInfo] = {}
        self._registrations_watched: set[str] = set()  # node ids whose registration data is watched (for good)
        self._topics: dict[str, TopicInfo] = {}
        self._topic_watched: set[str] = set()
        self._topic_tokens: dict[str, object] = {}
        # The partitions of each principal's topics, for max_partitions (partition_usage.py).
        self.partition_usage = PartitionUsage(
            self.zk, self._count_partitions_of,
            enabled=lambda: self.metadata_version >= features.FORMATS["zk-partition-count"].level_of(1))
        # Coordinator owners by (kind, partition), kept current by data watches set on
        # the first lookup (coordinator_for): a lookup costs no ZooKeeper round trip.
        self._owners: dict[tuple[str, int], tuple[str | None, int]] = {}
        self._listeners: list[Callable[[], None]] = []
        self._session_listeners: list[Callable[[str], None]] = []
        self._registered = False
        self._stopped = False
        # KIP-112: this partition leader's log directory failed (mark_log_dir_offline).
        self.log_dir_offline = False

    # ------------------------------------------------------------ lifecycle
    def start(self, timeout_s: float = 30.0) -> None:
        """Connect to ZooKeeper, read (or, in a new cluster, create) the finalized
        feature levels, create the base paths and start the watches. Raises
        FeatureLevelError when this version does not support the finalized
        metadata.version (the process must not start)."""
        self.zk.start(timeout=timeout_s)
        self.zk.add_listener(self._on_zk_state)
        if self.zk_security.set_acl:
            self._protect_root()
        self._start_features()
        for path in (SERVICES, TOPICS, f"{COORDINATORS}/txn", f"{COORDINATORS}/group"):
            self.zk.ensure_path(path)
        self.zk.ChildrenWatch(SERVICES, self._on_services)
        self.zk.ChildrenWatch(TOPICS, self._on_topics)

    # ------------------------------------------------------------ feature levels
    def _start_features(self) -> None:
        """Read /exactly/features; when it is missing, create it at the level of a new
        cluster (the newest) or, when versions before feature levels ran this cluster
        (their base znodes exist), at the baseline level (features.initial_level).
        Created before the base paths, so a process starting at the same time sees
        either the znode or no base paths. Then watch it."""
        try:
            data, stat = self.zk.get(FEATURES_PATH)
        except NoNodeError:
            existing = any(self.zk.exists(p) for p in (SERVICES, TOPICS, COORDINATORS, PID_BLOCK))
            level = features.initial_level(existing, self.supported)
            self.zk.ensure_path(ROOT)
            try:
                self.zk.create(FEATURES_PATH, features.encode_finalized(level))
                log.info("feature levels: metadata.version %d (%s cluster)", level,
                         "an existing" if existing else "a new")
            except NodeExistsError:
                pass
            data, stat = self.zk.get(FEATURES_PATH)
        level = features.decode_finalized(data)
        features.check_finalized(level, self.supported)
        self.metadata_version, self.features_epoch = level, stat.version
        self.zk.DataWatch(FEATURES_PATH, self._on_features)

    def _on_features(self, data, stat, event=None) -> None:
        if data is None:  # deleted by hand: the level stays (a new cluster would create it)
            log.error("%s was deleted; keeping metadata.version %d", FEATURES_PATH, self.metadata_version)
            return
        try:
            level = features.decode_finalized(data)
        except (features.UnknownFormatVersion, ValueError, KeyError) as exc:
            log.error("%s is unreadable (%s); keeping metadata.version %d", FEATURES_PATH, exc,
                      self.metadata_version)
            return
        changed = level != self.metadata_version
        self.metadata_version, self.features_epoch = level, stat.version
        if changed:
            log.info("metadata.version is now %d (epoch %d)", level, stat.version)
        for fn in list(self._feature_listeners):
            try:
                fn(level)
            except Exception:  # noqa: BLE001 - a listener bug must not kill the watch
                log.exception("feature listener failed")

    def broker_id_of(self, node_id: str) -> int:
        """The Kafka broker id of `node_id`: the one it registered while it is live,
        else its derivation (`broker_id`), which every node registers unless its data
        directory says otherwise (meta.py)."""
        with self._lock:
            node = self._nodes.get(node_id)
        return node.broker_id if node is not None else broker_id(node_id)

    def add_feature_listener(self, fn: Callable[[int], None]) -> None:
        """`fn(level)` with the finalized metadata.version, from a kazoo thread, on
        every change of /exactly/features (also a level this version does not
        support: the caller stops the process then)."""
        self._feature_listeners.append(fn)

    def feature_processes(self) -> dict[str, tuple[str, SupportedRange]]:
        """Every live process read from ZooKeeper now (not the cache): node id ->
        (role, supported metadata.version range). Blocking (kazoo)."""
        out = {}
        for child in self.zk.get_children(SERVICES):
            try:
                data, _ = self.zk.get(f"{SERVICES}/{child}")
                node = NodeInfo.from_registration(child, data)
            except NoNodeError:
                continue
            except (features.UnknownFormatVersion, ValueError, KeyError):
                out[child] = ("unknown", SupportedRange(0, 0))  # unreadable: supports nothing known
                continue
            out[child] = (node.role, node.supported)
        return out

    def update_metadata_version(self, level: int, upgrade: bool, validate_only: bool = False
                                ) -> tuple[ErrorCode, str]:
        """Raise (`upgrade`) or lower the finalized metadata.version to `level`, by
        compare-and-set of /exactly/features against the version read (Kafka's
        UpdateFeatures). An upgrade is refused while a live process does not support
        `level` (features.upgrade_refusal names them); a downgrade below the current
        level is refused (features.downgrade_refusal). Returns (NONE, "") or
        (INVALID_UPDATE_VERSION, why), (FEATURE_UPDATE_FAILED, why) when the znode
        kept changing. Blocking (kazoo)."""
        for _ in range(_CAS_ATTEMPTS):
            data, stat = self.zk.get(FEATURES_PATH)
            current = features.decode_finalized(data)
            if upgrade:
                processes = {n: rng for n, (_, rng) in self.feature_processes().items()}
                why = features.upgrade_refusal(level, current, processes, self.supported)
            else:
                why = features.downgrade_refusal(level, current, self.supported)
            if why is not None:
                return ErrorCode.INVALID_UPDATE_VERSION, why
            if validate_only or level == current:
                return ErrorCode.NONE, ""
            try:
                self.zk.set(FEATURES_PATH, features.encode_finalized(level), version=stat.version)
            except BadVersionError:
                continue
            log.info("metadata.version %d -> %d", current, level)
            return ErrorCode.NONE, ""
        return ErrorCode.FEATURE_UPDATE_FAILED, f"{FEATURES_PATH} kept changing; try again"

    # ZooKeeper's own znodes, created world-writable by the server: locked like the root when
    # the services' view is ZooKeeper's whole tree (no chroot).
    ZOOKEEPER_OWN = ("/zookeeper", "/zookeeper/quota")

    def _protect_root(self) -> None:
        """zookeeper.set.acl: the root znode of this client's view (the chroot's root
        node with a chroot, else ZooKeeper's "/") gets the default ACL (the cluster
        identity all, nobody else anything) while the world has any permission on it,
        so nobody without the digest lists or creates nodes beside /exactly. Without a
        chroot ZooKeeper's own `/zookeeper` and `/zookeeper/quota` get it too (the server
        creates them world-writable: anyone could create znodes under them). On a
        ZooKeeper shared with other applications, give the cluster a chroot (those two
        are then the other applications' to protect). zk_security.py."""
        paths = ("/",) + (() if self.zk.chroot else self.ZOOKEEPER_OWN)
        for path in paths:
            try:
                acls, _ = self.zk.get_acls(path)
            except NoNodeError:
                continue
            if self.zk_security.open_to_world(acls):
                self.zk.set_acls(path, self.zk_security.default_acl)
                log.info("ZooKeeper %s: closed to the world", path)

    def ensure_sensitive_path(self, path: str) -> None:
        """Create `path` (and its parents) if missing; `path` itself gets the
        sensitive ACL (cluster identity only, not world-readable) when
        zookeeper.set.acl is on."""
        parent = path.rsplit("/", 1)[0]
        if parent:
            self.zk.ensure_path(parent)
        try:
            self.zk.create(path, b"", acl=self.zk_security.sensitive_acl)
        except NodeExistsError:
            pass

    def register(self) -> None:
        """Publish this process under /exactly/services/<node_id> (ephemeral). A node
        left by this node_id's previous, killed incarnation is replaced. Raises
        BrokerIdCollision when a live node of another id has this node's broker id."""
        path = f"{SERVICES}/{self.node_id}"
        live = self.zk.get_children(SERVICES)
        registered = {n.node_id: n.broker_id for n in self.nodes().values()}
        other = broker_id_collision(self.node_id, live, self.broker_id, registered)
        if other is not None:
            raise BrokerIdCollision(f"node id {self.node_id!r} has the Kafka broker id {self.broker_id} "
                                    f"of the live node {other!r}; give this node another id")
        data = self._registration()
        while True:
            try:
                self.zk.create(path, data, ephemeral=True)
                break
            except NodeExistsError:
                try:
                    _, stat = self.zk.get(path)
                    if stat.ephemeralOwner == self.zk.client_id[0]:
                        self.zk.set(path, data)
                        break
                    self.zk.delete(path, version=stat.version)
                except (NoNodeError, BadVersionError):
                    pass
        self._registered = True
        self._notify()  # coordinators count this node as live from now on

    def _registration(self) -> bytes:
        d = {"role": self.role, "host": self.host, "port": self.port, "kafka_port": self.kafka_port,
             "broker_id": self.broker_id, "features": features.registration_features(self.supported)}
        if self.role == ROLE_FOR_KIND["txn"] and self.hosts_replicas:
            # The internal topic it hosts replicas of once metadata.version is 3
            # (coordinator_replicas.py): the controller counts it as a replica then.
            d["hosts"] = [TRANSACTION_STATE_TOPIC]
        if self.log_dir_offline:
            d["log_dir_offline"] = True
        return features.zk_json("zk-registration", d)

    @property
    def hosts_replicas(self) -> bool:
        """Whether this process can host replicas of its internal topic: a transaction
        coordinator that runs at metadata.version 3 (unstable.feature.versions.enable)."""
        return self.role == ROLE_FOR_KIND["txn"] and self.supported.covers(3)

    def mark_log_dir_offline(self, timeout_s: float = 10.0) -> None:
        """KIP-112 (docs/design.md, "Disk faults"): publish that this process's log
        directory failed, in its registration znode (`"log_dir_offline": true`, kept
        on re-registration). The controller then counts it as no replica at all: the
        partitions it led get new leaders from their ISR and it leaves every ISR, as
        on a crash, while the process keeps serving. Blocking (kazoo); raises
        kazoo's errors or TimeoutError after `timeout_s` (s): the caller retries."""
        self.log_dir_offline = True
        if self._registered:
            self.zk.set_async(f"{SERVICES}/{self.node_id}", self._registration()).get(timeout=timeout_s)

    @property
    def registered(self) -> bool:
        """True once `register()` has published this process. Until then a node_id
        listed under /exactly/services may still be this node_id's previous, killed
        incarnation (its session not yet expired), which must not make this process
        claim anything: the znode is replaced when registering, and the partitions
        claimed from the stale view would be resigned and claimed again."""
        return self._registered

    def stop(self, timeout_s: float = 5.0) -> None:
        """Deregister (delete this process's znode, so others see it gone at once
        instead of after the session timeout) and close the session. Bounded: without a
        connection the znode is not deleted (ZooKeeper removes it with the session), and
        a delete unanswered after `timeout_s` seconds is given up, so a process stopped
        while ZooKeeper is unreachable still exits."""
        self._stopped = True
        try:
            if self._registered and self.zk.connected:
                self.zk.delete_async(f"{SERVICES}/{self.node_id}").get(timeout=timeout_s)
        except Exception:  # noqa: BLE001 - best effort on shutdown
            pass
        self.zk.stop()
        self.zk.close()

    def add_listener(self, fn: Callable[[], None]) -> None:
        """`fn()` is called from a kazoo thread whenever topics, partition states, live
        nodes or their registrations change."""
        self._listeners.append(fn)

    def add_session_listener(self, fn: Callable[[str], None]) -> None:
        """`fn(state)` with "LOST", "SUSPENDED" or "CONNECTED", from a kazoo thread."""
        self._session_listeners.append(fn)

    def _on_zk_state(self, state) -> None:
        if state == KazooState.LOST:
            log.warning("ZooKeeper session lost")
        elif state == KazooState.SUSPENDED:
            log.warning("ZooKeeper connection suspended")
        for fn in list(self._session_listeners):
            fn(str(state))
        if state == KazooState.CONNECTED and self._registered and not self._stopped:
            # The session may be new: republish our ephemeral znode (not from this thread).
            self.zk.handler.spawn(self._reregister)

    def _reregister(self) -> None:
        try:
            if not self.zk.exists(f"{SERVICES}/{self.node_id}"):
                self.register()
        except Exception:  # noqa: BLE001 - retried at the next reconnect
            log.exception("re-registration failed")

    def _notify(self) -> None:
        for fn in list(self._listeners):
            try:
                fn()
            except Exception:  # noqa: BLE001 - a listener bug must not kill the watch
                log.exception("cluster listener failed")

    # ------------------------------------------------------------ watches
    def _on_services(self, children: list[str]) -> None:
        nodes = {}
        for child in children:
            try:
                data, _ = self.zk.get(f"{SERVICES}/{child}")
            except NoNodeError:
                continue
            try:
                nodes[child] = NodeInfo.from_registration(child, data)
            except (features.UnknownFormatVersion, ValueError, KeyError) as exc:
                log.error("registration of %s not read, the node is left out: %s", child, exc)
        with self._lock:
            self._nodes = nodes
            new = [child for child in children if child not in self._registrations_watched]
            self._registrations_watched.update(new)
        for child in new:
            first = [True]
            self.zk.DataWatch(f"{SERVICES}/{child}", lambda data, stat, event=None, child=child, first=first:
                              self._on_registration(child, data, first))
        self._notify()

    def _on_registration(self, child: str, data: bytes | None, first: list[bool]) -> None:
        """A registration's data changed while its znode stayed (KIP-112: its log
        directory went offline, `mark_log_dir_offline`): no children watch says so, so
        this one does. One watch per node id for the process's life, kept through the
        znode's deletion and re-creation (kazoo reports both) and through reconnects
        (after which kazoo reads again and calls here when the data changed, with no
        event: so every call but the watch's first is a change). `first`: the watch's
        flag, its first call being the read _on_services already made."""
        if first[0]:
            first[0] = False
            return
        if data is not None:
            try:
                info = NodeInfo.from_registration(child, data)
            except (features.UnknownFormatVersion, ValueError, KeyError, TypeError) as exc:
                log.error("registration of %s not read: %s", child, exc)
            else:
                with self._lock:
                    if child in self._nodes:
                        self._nodes = {**self._nodes, child: info}
        self._notify()

    def _on_topics(self, children: list[str]) -> None:
        for name in children:
            with self._lock:
                if name in self._topic_watched:
                    continue
                self._topic_watched.add(name)
            self._load_topic(name)
        with self._lock:
            for gone in set(self._topics) - set(children):
                del self._topics[gone]
                self._topic_watched.discard(gone)
        self._notify()

    def _load_topic(self, name: str) -> None:
        """Watch the topic znode (partitions added, configs altered, deletion) and the
        state znode of each partition. The watches of one load stop once the topic
        was deleted or loaded again (a topic re-created under the same name)."""
        token = object()
        with self._lock:
            self._topic_tokens[name] = token
        watched: set[int] = set()

        def current() -> bool:
            with self._lock:
                return self._topic_tokens.get(name) is token

        def on_topic(data, stat, event=None):
            if not current():
                return False
            if data is None:
                with self._lock:
                    self._topics.pop(name, None)
                    self._topic_watched.discard(name)
                    self._topic_tokens.pop(name, None)
                self._notify()
                return False
            try:
                d = features.zk_read("zk-topic", data, f"{TOPICS}/{name}")
            except features.UnknownFormatVersion as exc:
                log.error("topic %s not served: %s", name, exc)
                return None
            parts = {int(p): list(r) for p, r in d["partitions"].items()}
            removing = {int(p): tuple(r) for p, r in (d.get("removing") or {}).items()}
            with self._lock:
                old = self._topics.get(name)
                self._topics[name] = TopicInfo(name, parts, dict(d.get("configs", {})),
                                               bool(d.get("internal", False)), old.states if old else {},
                                               str(d.get("principal", "")), removing)
            for p in sorted(set(parts) - watched):
                watched.add(p)
                # kazoo calls func(data, stat, event) when it accepts three arguments.
                self.zk.DataWatch(state_path(name, p),
                                  lambda data, stat, event=None, p=p: self._on_state(name, p, data, stat)
                                  if current() else False)
            self._notify()
            return None

        self.zk.DataWatch(f"{TOPICS}/{name}", on_topic)

    def _on_state(self, name: str, partition: int, data: bytes | None, stat=None) -> None:
        with self._lock:
            topic = self._topics.get(name)
            if topic is None:
                return
            if data:
                new = PartitionState.decode(data, stat.version if stat else -1, stat.mzxid if stat else -1)
                old = topic.states.get(partition)
                if old is not None and 0 <= new.version < old.version:
                    return  # an older read arriving late
                topic.states[partition] = new
            else:
                topic.states.pop(partition, None)
        self._notify()

    # ------------------------------------------------------------ views
    def nodes(self) -> dict[str, NodeInfo]:
        """Live service processes by node id."""
        with self._lock:
            return dict(self._nodes)

    def topics(self) -> dict[str, TopicInfo]:
        with self._lock:
            return dict(self._topics)

    def topic(self, name: str) -> TopicInfo | None:
        """The cached metadata of topic `name`, None when it does not exist (one lookup,
        where `topics()` copies them all)."""
        with self._lock:
            return self._topics.get(name)

    def leader_of(self, topic: str, partition: int) -> NodeInfo | None:
        """The live leader of a partition, or None (unknown topic/partition or leader down)."""
        with self._lock:
            t = self._topics.get(topic)
            leader = t.leader(partition) if t and partition in t.partitions else None
            return self._nodes.get(leader) if leader else None

    def partition_state(self, topic: str, partition: int) -> tuple[PartitionState | None, int]:
        """(state, znode version) read straight from ZooKeeper, for compare-and-set."""
        try:
            data, stat = self.zk.get(state_path(topic, partition))
        except NoNodeError:
            return None, -1
        return PartitionState.decode(data, stat.version, stat.mzxid), stat.version

    def read_partition_states(self, tps: list[tuple[str, int]], timeout_s: float = 10.0
                              ) -> dict[tuple[str, int], PartitionState | None]:
        """Fresh partition states of `tps` from ZooKeeper, read in one pipelined burst
        (None for a missing znode). Raises kazoo errors (connection loss, session
        expiry, timeout) when ZooKeeper cannot answer."""
        pending = [(tp, self.zk.get_async(state_path(*tp))) for tp in tps]
        out: dict[tuple[str, int], PartitionState | None] = {}
        for tp, res in pending:
            try:
                data, stat = res.get(timeout=timeout_s)
            except NoNodeError:
                out[tp] = None
                continue
            out[tp] = PartitionState.decode(data, stat.version, stat.mzxid)
        return out

    def registration_zxid(self, timeout_s: float = 10.0) -> int | None:
        """czxid of this process's /exactly/services/<node_id> znode when it belongs to
        the current session (a leader elected after it was written has a newer state
        znode), else None (not registered yet, or registered by an older session).
        Raises kazoo errors when ZooKeeper cannot answer."""
        stat = self.zk.exists_async(f"{SERVICES}/{self.node_id}").get(timeout=timeout_s)
        cid = self.zk.client_id
        if stat is None or cid is None or stat.ephemeralOwner != cid[0]:
            return None
        return stat.czxid

    def update_partition_state(self, topic: str, partition: int, state: PartitionState,
                               expected_version: int) -> tuple[bool, int]:
        """Compare-and-set the partition state (the leader's ISR changes). Returns
        (True, new version) on success, (False, -1) when the znode changed since
        `expected_version` (someone else, e.g. the controller, wrote it) or is gone.
        Raises kazoo connection errors."""
        try:
            stat = self.zk.set(state_path(topic, partition), state.encode(), version=expected_version)
        except (BadVersionError, NoNodeError):
            return False, -1
        return True, stat.version

    # ------------------------------------------------------------ topics
    def create_topic(self, name: str, num_partitions: int, replication_factor: int,
                     configs: dict[str, str] | None = None, internal: bool = False,
                     principal: str = "", partition_quota: float | None = None) -> tuple[ErrorCode, str]:
        """Assign replicas round-robin over live partition leaders and write the topic;
        `principal` (the caller, "" for none) is kept with it, and the partitions of its
        topics counted (partition_usage.py) in the same ZooKeeper multi-op, so that
        `partition_quota` (its max_partitions, None: none) is reserved and the topic
        created in one step, whatever runs concurrently on this or other processes.
        Everything is validated before anything is allocated (services.common.transport.limits).

        Returns (error code, message): NONE, TOPIC_ALREADY_EXISTS, INVALID_TOPIC_EXCEPTION
        (bad name, or one colliding with an existing topic once '.' and '_' are
        unified), INVALID_PARTITIONS (< 1 or above `max.partitions.per.topic`),
        POLICY_VIOLATION (the cluster would pass `max.partitions`, or the principal its
        partition quota), INVALID_REPLICATION_FACTOR (< 1 or more than the live partition leaders)."""
        topics = self.topics()
        bad = limits.validate_topic_name(name, topics, internal)
        if bad is None:
            others = sum(len(t.partitions) for t in topics.values() if t.name != name)
            bad = limits.validate_partition_count(name, num_partitions, others, self.settings)
        if bad is None:
            bad = limits.validate_replication_factor(replication_factor, len(self._live_leaders()))
        if bad is not None:
            return bad
        assignment = self._assign(name, range(num_partitions), replication_factor)
        if assignment is None:
            live = len(self._live_leaders())
            return (ErrorCode.INVALID_REPLICATION_FACTOR,
                    f"replication factor {replication_factor} with {live} live partition leaders")
        body = {"partitions": {str(p): r for p, r in assignment.items()},
                "configs": dict(configs or {}), "internal": internal}
        if principal:
            body["principal"] = principal
        for _ in range(_CAS_ATTEMPTS):
            if name in self.topics() or self.zk.exists(f"{TOPICS}/{name}"):
                return ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists"
            tx = self.zk.transaction()
            counted = False
            if principal:  # reserve: the count is written with the topic, checked against what was read
                used, version = self.partition_usage.read(principal)
                why, used, version = self.partition_usage.refusal(principal, used, version, num_partitions,
                                                                  partition_quota)
                if why is not None:
                    return ErrorCode.POLICY_VIOLATION, why
                counted = self.partition_usage.write(tx, principal, used + num_partitions, version)
            tx.create(f"{TOPICS}/{name}", features.zk_json("zk-topic", body))
            for p, replicas in assignment.items():
                tx.create(f"{TOPICS}/{name}/{p}")
                tx.create(f"{TOPICS}/{name}/{p}/state", PartitionState(replicas[0], 0, tuple(replicas)).encode())
            results = tx.commit()
            if counted and self.partition_usage.lost_race(results[0]):
                continue  # another creation by the principal committed first: count again
            if any(isinstance(r, NodeExistsError) for r in results):
                return ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists"
            failed = [r for r in results if isinstance(r, Exception)]
            if failed:
                return ErrorCode.UNKNOWN_SERVER_ERROR, f"topic creation failed: {failed[0]!r}"
            return ErrorCode.NONE, ""
        return ErrorCode.UNKNOWN_SERVER_ERROR, f"the partition count of {principal} kept changing; try again"

    def _count_partitions_of(self, principal: str) -> int:
        """The partitions of the topics whose znode names `principal` as creator, read
        from ZooKeeper (not the cache): the count partition_usage.py starts from."""
        total = 0
        for name in self.zk.get_children(TOPICS):
            found = self.read_topic(name)
            if found is not None and found[0].get("principal") == principal:
                total += len(found[0].get("partitions", {}))
        return total

    def writer_claim(self, topic: str, partition: int, timeout_s: float) -> tuple[int, int, int]:
        """(writer producer id, writer epoch, retired writer producer id) of the
        coordinator claim on an internal partition, read from ZooKeeper now
        (docs/design.md, "Coordinator ownership"); (-1, -1, -1) without a claim.
        timeout_s: how long to wait for ZooKeeper's answer (a read sent while the
        connection is down waits for the reconnection). Raises kazoo errors
        (KazooTimeoutError included) when ZooKeeper does not answer."""
        kind = next((k for k, t in INTERNAL_TOPIC_FOR_KIND.items() if t == topic), None)
        if kind is None:
            return -1, -1, -1
        try:
            data, _ = self.zk.get_async(f"{COORDINATORS}/{kind}/{partition}").get(timeout=timeout_s)
        except NoNodeError:
            return -1, -1, -1
        d = features.zk_read("zk-coordinator-claim", data, f"{COORDINATORS}/{kind}/{partition}")
        return (int(d.get("producer_id", -1)), int(d.get("producer_epoch", -1)),
                int(d.get("retired_producer_id", -1)))

    def ensure_internal_topic(self, kind: str, num_partitions: int | None = None,
                              replication_factor: int | None = None) -> None:
        """Create `TRANSACTION_STATE_TOPIC` (kind "txn") or `CONSUMER_OFFSETS_TOPIC` ("group")
        if missing, with `transaction.state.log.num.partitions` / `offsets.topic.num.partitions`
        partitions, the matching `*.replication.factor` (capped at the live partition
        leaders) and `*.segment.bytes`, compacted, and for the transaction log
        `transaction.state.log.min.isr` as its min.insync.replicas (Kafka's topic config):
        the settings of the coordinator role
        owning the topic (this process's, or that role's defaults; services.common.settings).
        Raises RuntimeError when no partition leader is live."""
        name = INTERNAL_TOPIC_FOR_KIND[kind]
        schema = TxnCoordinatorSchema if kind == "txn" else GroupCoordinatorSchema
        owner = self.settings if isinstance(self.settings, schema) else schema()
        configs = {CLEANUP_POLICY: COMPACT}
        if isinstance(owner, TxnCoordinatorSchema):
            layout = (owner.state_log_num_partitions, owner.state_log_replication_factor,
                      owner.state_log_segment_bytes)
            configs[MIN_INSYNC_REPLICAS] = str(owner.state_log_min_isr)
        else:
            layout = (owner.offsets_topic_num_partitions, owner.offsets_topic_replication_factor,
                      owner.offsets_topic_segment_bytes)
        if num_partitions is None:
            num_partitions = layout[0]
        if replication_factor is None:
            replication_factor = layout[1]
        if self.zk.exists(f"{TOPICS}/{name}"):
            return
        leaders = [n for n in self.nodes().values() if n.role == PARTITION_LEADER]
        if not leaders:
            raise RuntimeError(f"cannot create {name}: no live partition leader")
        configs[SEGMENT_BYTES] = str(layout[2])
        code, msg = self.create_topic(name, num_partitions, min(replication_factor, len(leaders)), configs,
                                      internal=True)
        if code not in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS):
            raise RuntimeError(f"cannot create {name}: {msg}")

    # ------------------------------------------------------------ topic administration
    def _assign(self, name: str, partitions: range, replication_factor: int) -> dict[int, list[str]] | None:
        """Round-robin replica lists over the live partition leaders for `partitions`
        (the first replica of partition p is leader number (crc32(name) + p) % n), or
        None when fewer partition leaders than `replication_factor` are live."""
        leaders = self._live_leaders()
        if replication_factor < 1 or replication_factor > len(leaders):
            return None
        start = zlib.crc32(name.encode()) % len(leaders)
        return {p: [leaders[(start + p + i) % len(leaders)] for i in range(replication_factor)]
                for p in partitions}

    def _live_leaders(self) -> list[str]:
        """Node ids of the live partition leaders, sorted."""
        return sorted(n.node_id for n in self.nodes().values() if n.role == PARTITION_LEADER)

    def read_topic(self, name: str) -> tuple[dict, int] | None:
        """(topic znode content, znode version), or None when the topic does not exist
        (or `name` is not a legal topic name: never a path into another znode)."""
        if limits.validate_topic_name(name, internal=True) is not None:
            return None
        try:
            data, stat = self.zk.get(f"{TOPICS}/{name}")
        except NoNodeError:
            return None
        return features.zk_read("zk-topic", data, f"{TOPICS}/{name}"), stat.version

    def delete_topic(self, name: str) -> tuple[ErrorCode, str]:
        """Remove a topic's znodes (topic, partitions, states). Every partition leader
        hosting a replica then closes it and deletes its log directory and its
        producer-state snapshots (`ReplicaManager.refresh`); a replica that was down
        deletes its orphaned directory at start-up. Returns (NONE, ""),
        (UNKNOWN_TOPIC_OR_PARTITION, message) or (INVALID_TOPIC_EXCEPTION, message)
        for an internal topic. Raises kazoo errors when ZooKeeper cannot answer."""
        found = self.read_topic(name)
        if found is None:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}"
        if found[0].get("internal") or name.startswith("__"):
            return ErrorCode.INVALID_TOPIC_EXCEPTION, f"{name} is an internal topic and cannot be deleted"
        try:
            self.zk.delete(f"{TOPICS}/{name}", recursive=True)
        except NoNodeError:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}"
        if found[0].get("principal"):
            self.partition_usage.adjust(found[0]["principal"], -len(found[0].get("partitions", {})))
        log.info("deleted topic %s", name)
        return ErrorCode.NONE, ""

    def create_partitions(self, name: str, count: int, validate_only: bool = False, caller: str = "",
                          partition_quota: Callable[[str], float | None] = lambda principal: None
                          ) -> tuple[ErrorCode, str]:
        """Grow a topic to `count` partitions (Kafka's CreatePartitions): the new
        partitions get replica lists as `create_topic` assigns them, with the topic's
        replication factor, and state znodes led by their first replica in epoch 0;
        written in one multi-op that checks the topic znode's version and, for a topic
        with a creator, writes the creator's new partition count (partition_usage.py).
        The new partitions count against the topic's creator, or `caller` for a topic
        without one; `partition_quota(principal)` is its max_partitions (None: none).
        Existing partitions keep their data (keys may now hash to other partitions).
        Returns NONE, UNKNOWN_TOPIC_OR_PARTITION, INVALID_PARTITIONS (count not above
        the current one), INVALID_TOPIC_EXCEPTION (internal topic: its partition count
        is the coordinators' hash), INVALID_REPLICATION_FACTOR (too few live partition
        leaders), POLICY_VIOLATION (past the partition quota), with a message. Raises
        kazoo errors."""
        while True:
            found = self.read_topic(name)
            if found is None:
                return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}"
            body, version = found
            if body.get("internal") or name.startswith("__"):
                return (ErrorCode.INVALID_TOPIC_EXCEPTION,
                        f"{name} is an internal topic: its partition count cannot change")
            current = len(body["partitions"])
            if count <= current:
                return (ErrorCode.INVALID_PARTITIONS,
                        f"topic {name!r} has {current} partitions; the new count must be larger, got {count}")
            others = sum(len(t.partitions) for t in self.topics().values() if t.name != name)
            bad = limits.validate_partition_count(name, count, others, self.settings)
            if bad is not None:
                return bad
            rf = len(next(iter(body["partitions"].values())))
            assignment = self._assign(name, range(current, count), rf)
            if assignment is None:
                return (ErrorCode.INVALID_REPLICATION_FACTOR,
                        f"replication factor {rf} needs that many live partition leaders")
            creator = body.get("principal", "")
            owner = creator or caller
            usage = self.partition_usage.read(owner) if owner else (0, None)
            why, used, usage_version = self.partition_usage.refusal(
                owner, *usage, count - current, partition_quota(owner) if owner else None)
            if why is not None:
                return ErrorCode.POLICY_VIOLATION, why
            if validate_only:
                return ErrorCode.NONE, ""
            body["partitions"].update({str(p): r for p, r in assignment.items()})
            tx = self.zk.transaction()
            if creator:
                self.partition_usage.write(tx, creator, used + count - current, usage_version)
            tx.set_data(f"{TOPICS}/{name}", features.zk_json("zk-topic", body), version=version)
            for p, replicas in assignment.items():
                tx.create(f"{TOPICS}/{name}/{p}")
                tx.create(f"{TOPICS}/{name}/{p}/state", PartitionState(replicas[0], 0, tuple(replicas)).encode())
            results = tx.commit()
            if any(isinstance(r, (BadVersionError, NodeExistsError, NoNodeError)) for r in results):
                continue  # changed or deleted meanwhile (the topic, or its creator's count): read again
            failed = [r for r in results if isinstance(r, Exception)]
            if failed:
                return ErrorCode.UNKNOWN_SERVER_ERROR, f"creating partitions failed: {failed[0]!r}"
            log.info("topic %s: %d -> %d partitions", name, current, count)
            return ErrorCode.NONE, ""

    def topic_configs(self, name: str) -> dict[str, str] | None:
        """The configs set on a topic (straight from ZooKeeper), None for an unknown topic."""
        found = self.read_topic(name)
        return None if found is None else dict(found[0].get("configs", {}))

    def alter_topic_configs(self, name: str, update: Callable[[dict[str, str]], tuple[ErrorCode, str]],
                            validate_only: bool = False) -> tuple[ErrorCode, str]:
        """Change a topic's configs by compare-and-set on its znode: `update(configs)`
        edits the dict in place and returns (NONE, "") or a refusal, which is
        returned without writing. Partition leaders apply the new configs to their
        replicas when the watch fires. UNKNOWN_TOPIC_OR_PARTITION for an unknown
        topic. Raises kazoo errors."""
        while True:
            found = self.read_topic(name)
            if found is None:
                return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}"
            body, version = found
            configs = dict(body.get("configs", {}))
            code, msg = update(configs)
            if code != ErrorCode.NONE or validate_only:
                return code, msg
            body["configs"] = configs
            try:
                self.zk.set(f"{TOPICS}/{name}", features.zk_json("zk-topic", body), version=version)
            except BadVersionError:
                continue
            except NoNodeError:
                return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}"
            log.info("topic %s: configs now %s", name, configs)
            return ErrorCode.NONE, ""

    # ------------------------------------------------------------ coordinators
    def coordinator_for(self, kind: str, key: str) -> tuple[int, NodeInfo | None, int]:
        """(partition of the internal topic, live owner or None, coordinator epoch) for a
        transactional.id (kind "txn") or group id ("group"). Partition -1 when the
        internal topic does not exist yet."""
        topic = self.topic(INTERNAL_TOPIC_FOR_KIND[kind])
        if topic is None:
            return -1, None, -1
        partition = partition_for_key(key, len(topic.partitions))
        owner, epoch = self._cached_owner(kind, partition)
        with self._lock:
            node = self._nodes.get(owner) if owner else None
        if node is not None and node.role != ROLE_FOR_KIND[kind]:
            node = None
        return partition, node, epoch

    async def lookup_coordinator(self, kind: str, key: str) -> tuple[int, NodeInfo | None, int]:
        """coordinator_for from an event loop: on the loop when the owner is in the
        watched cache, in a worker thread for a partition's first lookup (it reads
        ZooKeeper and sets the watch)."""
        topic = self.topic(INTERNAL_TOPIC_FOR_KIND[kind])
        if topic is None or (kind, partition_for_key(key, len(topic.partitions))) in self._owners:
            return self.coordinator_for(kind, key)
        return await asyncio.to_thread(self.coordinator_for, kind, key)

    async def lookup_coordinator_of_partition(self, kind: str, number: int) -> NodeInfo | None:
        """The live owner of partition `number` % n of the internal topic of `kind`
        ("txn": the owner of a producer id's binding, pid_binding.py), or None (no
        topic or no live owner). On the loop when the owner is in the watched cache,
        else in a worker thread (the first lookup reads ZooKeeper)."""
        topic = self.topic(INTERNAL_TOPIC_FOR_KIND[kind])
        if topic is None or not topic.partitions:
            return None
        partition = number % len(topic.partitions)
        if (kind, partition) in self._owners:
            owner, _ = self._cached_owner(kind, partition)
        else:
            owner, _ = await asyncio.to_thread(self._cached_owner, kind, partition)
        with self._lock:
            node = self._nodes.get(owner) if owner else None
        return node if node is not None and node.role == ROLE_FOR_KIND[kind] else None

    def _cached_owner(self, kind: str, partition: int) -> tuple[str | None, int]:
        """coordinator_owner from the watched cache; the first lookup of a partition
        sets the data watch (one ZooKeeper read), whose calls keep the entry current
        (a deleted or missing node: (None, -1)). A lookup racing a move may see the
        previous owner for a moment; that owner answers NOT_COORDINATOR."""
        key = (kind, partition)
        hit = self._owners.get(key)
        if hit is not None:
            return hit

        def on_change(data, _stat, _event=None) -> None:
            value: tuple[str | None, int] = (None, -1)
            if data:
                try:
                    d = features.zk_read("zk-coordinator-claim", data, f"{COORDINATORS}/{kind}/{partition}")
                    value = (d.get("owner"), int(d.get("coordinator_epoch", -1)))
                except (ValueError, TypeError, AttributeError):
                    pass
            self._owners[key] = value

        self.zk.DataWatch(f"{COORDINATORS}/{kind}/{partition}", on_change)
        return self._owners.get(key) or self.coordinator_owner(kind, partition)

    def coordinator_owner(self, kind: str, partition: int) -> tuple[str | None, int]:
        """(owner node id or None, coordinator epoch) of an internal partition."""
        try:
            data, _ = self.zk.get(f"{COORDINATORS}/{kind}/{partition}")
        except NoNodeError:
            return None, -1
        d = features.zk_read("zk-coordinator-claim", data, f"{COORDINATORS}/{kind}/{partition}")
        return d.get("owner"), int(d.get("coordinator_epoch", -1))

    # ------------------------------------------------------------ producer ids
    def allocate_producer_id_block(self, size: int = 1000) -> tuple[int, int]:
        """Reserve [first, last] PIDs by compare-and-set on /exactly/producer_id_block
        (Kafka's ProducerIdManager); a block is never handed out twice."""
        self.zk.ensure_path(PID_BLOCK)
        while True:
            data, stat = self.zk.get(PID_BLOCK)
            first = int(features.zk_read("zk-producer-id-block", data, PID_BLOCK)["next"]) if data else 0
            try:
                self.zk.set(PID_BLOCK, features.zk_json("zk-producer-id-block", {"next": first + size}),
                            version=stat.version)
                return first, first + size - 1
            except BadVersionError:
                continue
