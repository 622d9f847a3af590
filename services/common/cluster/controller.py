"""The controller: partition leader election through ZooKeeper (Kafka's controller
with unclean leader election off).

One partition-leader process at a time is the controller: the one holding the
ephemeral znode /exactly/controller ({"node_id"}). Every partition-leader process
runs a `Controller`; the others wait on a watch of that znode and run for it again
when it goes away (its holder's session ended). A new controller increments
/exactly/controller_epoch and every state write it makes is a ZooKeeper multi-op that
also checks that znode's version, so a controller that was replaced (paused, or
disconnected) cannot write anything any more. A process that restarts under the same
node id replaces the controller znode its previous incarnation left behind.

The controller sweeps all partitions at each change of live services, their
registrations (a log directory gone offline), topics or partition states (ZooKeeper
watches: ClusterState's listeners), at each change of its session or of its own
znode, and every `controller.sweep.interval.ms` (10000) as a backstop. Nothing
depends on that backstop but a lost watch: each sweep reads every partition's state,
work a partition leader's event loop waits behind (the GIL), so it is not paid every
second for nothing. A sweep whose write was refused, or the first after a change of the
session (kazoo's reads of the watched znodes after a reconnect run in threads of their
own), is followed by another within RETRY_AFTER_REFUSAL_S:

- Live replicas are the registered partition-leader processes whose log directory
  is not offline (KIP-112: a process that marked it failed counts as dead here);
  each registration's czxid tells when that process (session) registered.
- A partition keeps its leader while the leader is live and registered before the
  state was last written; dead replicas are removed from its ISR (the leader stays).
- Otherwise (the leader's session ended, or it registered again since: it restarted)
  a new leader is elected: the first live ISR member in assignment order (the
  restarted leader last); ISR = its live members; leader epoch + 1. With no live ISR
  member the partition goes offline (leader none, leader epoch + 1, ISR kept): no
  unclean election; it comes back when an ISR member does.

Writes are compare-and-set on the state znode's version; a lost race is simply
decided again at the next sweep. `plan_partition` is the pure decision, unit-tested.
"""
from __future__ import annotations

import logging
import threading
from typing import Mapping, Sequence

from kazoo.client import KazooState
from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError

from . import features
from ..protocol import TRANSACTION_STATE_TOPIC
from .coordinator_replicas import COORDINATOR_LED_LEVEL, plan_removal, with_assignment
from .state import PARTITION_LEADER, ROOT, SERVICES, TOPICS, ClusterState, PartitionState, state_path
from ..settings import PartitionLeaderSchema

log = logging.getLogger(__name__)

CONTROLLER = f"{ROOT}/controller"
CONTROLLER_EPOCH = f"{ROOT}/controller_epoch"
RETRY_AFTER_REFUSAL_S = 1.0  # a sweep that lost a compare-and-set runs again this soon (s)


def plan_partition(replicas: Sequence[str], state: PartitionState,
                   live: Mapping[str, int], prefer_first: bool = False) -> PartitionState | None:
    """The state a partition should move to, or None to leave it.

    replicas: assigned replica ids in assignment order; state: as read from ZooKeeper
    (`mzxid` set); live: live replica-hosting node id -> czxid of its registration;
    prefer_first: leadership goes to the first replica whenever it is live and in sync
    (a coordinator-led internal partition, metadata.version 3). See the module
    docstring for the rules."""
    leader = state.leader
    in_sync_live = [r for r in replicas if r in state.isr and r in live] + \
        sorted(r for r in state.isr if r not in replicas and r in live)
    if leader is not None and leader in live and live[leader] < state.mzxid:
        isr = tuple(r for r in state.isr if r in live)
        first = replicas[0] if replicas else None
        if prefer_first and first != leader and first in isr and live[first] < state.mzxid:
            return PartitionState(first, state.leader_epoch + 1, isr)
        if set(isr) != set(state.isr):
            return PartitionState(leader, state.leader_epoch, isr)
        return None
    restarted = leader if leader is not None and leader in live else None
    candidates = [r for r in in_sync_live if r != restarted] + [r for r in in_sync_live if r == restarted]
    if candidates:
        return PartitionState(candidates[0], state.leader_epoch + 1, tuple(in_sync_live))
    if leader is None:
        return None
    return PartitionState(None, state.leader_epoch + 1, tuple(state.isr))


class Controller:
    """Runs the controller election and, while elected, the sweeps, in a thread of
    its own (kazoo calls block). `start()` / `stop()`; `is_controller` for tests and
    metrics. Settings: controller.sweep.interval.ms (10000)."""

    def __init__(self, cluster: ClusterState,
                 sweep_interval_ms: int = PartitionLeaderSchema.model_fields["controller_sweep_interval_ms"].default):
        self.cluster = cluster
        self.zk = cluster.zk
        self.node_id = cluster.node_id
        self.sweep_interval_s = max(sweep_interval_ms, 10) / 1000
        self.is_controller = False
        self._epoch_version = -1
        self._event = threading.Event()
        self._stopped = threading.Event()
        self._recheck = False  # the session changed: sweep again within RETRY_AFTER_REFUSAL_S
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.cluster.add_listener(self._event.set)
        self.cluster.add_session_listener(self._on_session)
        self._thread = threading.Thread(target=self._run, name="controller", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop; a controller resigns (deletes its znode) so another takes over at once."""
        self._stopped.set()
        self._event.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.is_controller:
            self.is_controller = False
            try:
                _, stat = self.zk.get(CONTROLLER)
                if stat.ephemeralOwner == self.zk.client_id[0]:
                    self.zk.delete(CONTROLLER, version=stat.version)
            except Exception:  # noqa: BLE001 - best effort on shutdown; the session end removes it anyway
                pass

    # ------------------------------------------------------------ election
    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                if self._campaign():
                    self._lead()
            except KazooException as exc:
                log.warning("controller: ZooKeeper error: %r", exc)
                self._stopped.wait(0.5)
            except Exception:  # noqa: BLE001 - keep the controller alive; logged with its traceback
                log.exception("controller failed")
                self._stopped.wait(0.5)
            self.is_controller = False

    def _session(self) -> int | None:
        cid = self.zk.client_id
        return cid[0] if cid else None

    def _campaign(self) -> bool:
        """Try to become the controller; waits for a change when someone else is."""
        if self.zk.state != KazooState.CONNECTED:
            self._stopped.wait(0.2)
            return False
        try:
            self.zk.create(CONTROLLER, features.zk_json("zk-controller", {"node_id": self.node_id}), ephemeral=True,
                           makepath=True)
        except NodeExistsError:
            self._event.clear()
            try:
                data, stat = self.zk.get(CONTROLLER, watch=self._wake)
            except NoNodeError:
                return False
            if stat.ephemeralOwner != self._session():
                if features.zk_read("zk-controller", data, CONTROLLER).get("node_id") == self.node_id:
                    # Left by this node's previous incarnation: its session is dead or dying.
                    try:
                        self.zk.delete(CONTROLLER, version=stat.version)
                    except (NoNodeError, KazooException):
                        pass
                    return False
                self._event.wait(self.sweep_interval_s * 5)
                return False
        self._bump_epoch()
        return True

    def _bump_epoch(self) -> None:
        self.zk.ensure_path(CONTROLLER_EPOCH)
        while True:
            data, stat = self.zk.get(CONTROLLER_EPOCH)
            epoch = int(features.zk_read("zk-controller", data, CONTROLLER_EPOCH).get("epoch", 0)) + 1 if data else 1
            try:
                new = self.zk.set(CONTROLLER_EPOCH, features.zk_json("zk-controller", {"epoch": epoch}),
                                  version=stat.version)
            except BadVersionError:
                continue
            self._epoch_version = new.version
            self.is_controller = True
            log.info("%s is the controller (controller epoch %d)", self.node_id, epoch)
            return

    def _still_controller(self) -> bool:
        if self.zk.state != KazooState.CONNECTED:
            return False
        # Watched: the znode deleted or replaced starts the next pass at once.
        stat = self.zk.exists(CONTROLLER, watch=self._wake)
        return stat is not None and stat.ephemeralOwner == self._session()

    def _wake(self, _event=None) -> None:
        """A watch fired (one bound method: kazoo keeps one watcher per path for it)."""
        self._event.set()

    def _on_session(self, _state: str) -> None:
        # After a reconnect kazoo sets the watches again and reads anew, in threads of
        # its own: a change those reads report may land just after the sweep this wakes,
        # so the next one is due soon as well.
        self._recheck = True
        self._event.set()

    def _lead(self) -> None:
        while not self._stopped.is_set():
            self._event.clear()  # before the check: a wake from here on is not lost
            recheck, self._recheck = self._recheck, False
            if not self._still_controller():
                log.warning("%s: no longer the controller", self.node_id)
                return
            refused = not self.sweep()
            soon = refused or recheck
            self._event.wait(min(self.sweep_interval_s, RETRY_AFTER_REFUSAL_S) if soon else self.sweep_interval_s)
            self._stopped.wait(0.02)  # coalesce bursts of watch events

    # ------------------------------------------------------------ sweeps
    def live_replicas(self, coordinators: bool = False) -> dict[str, int]:
        """Live replica-hosting node id -> czxid of its registration: the partition
        leaders, and with `coordinators` (metadata.version 3) the coordinators that host
        replicas of their internal topic (`"hosts"`). A process whose log directory is
        offline is not live as a replica."""
        live = {}
        for child in self.zk.get_children(SERVICES):
            try:
                data, stat = self.zk.get(f"{SERVICES}/{child}")
            except NoNodeError:
                continue
            try:
                d = features.zk_read("zk-registration", data, f"{SERVICES}/{child}")
            except ValueError as exc:  # a registration this version cannot read: not a replica it knows
                log.error("registration of %s not read: %s", child, exc)
                continue
            hosts = coordinators and bool(d.get("hosts"))
            if (d.get("role") == PARTITION_LEADER or hosts) and not d.get("log_dir_offline"):
                live[child] = stat.czxid
        return live

    def sweep(self) -> bool:
        """Decide and write every partition's state once. Returns False when a write was
        refused (its compare-and-set lost: decided again at the next sweep)."""
        coordinator_led = self.cluster.metadata_version >= COORDINATOR_LED_LEVEL
        live = self.live_replicas(coordinator_led)
        topics = self.cluster.topics().values()
        parts = [(t.name, p, tuple(replicas), coordinator_led and t.name == TRANSACTION_STATE_TOPIC,
                  t.removing.get(p, ())) for t in topics for p, replicas in sorted(t.partitions.items())]
        pending = [(name, p, replicas, prefer, removing, self.zk.get_async(state_path(name, p)))
                   for name, p, replicas, prefer, removing in parts]
        clean = True
        for name, p, replicas, prefer, removing, res in pending:
            try:
                data, stat = res.get(timeout=10)
            except NoNodeError:
                continue
            state = PartitionState.decode(data, stat.version, stat.mzxid)
            new = plan_partition(replicas, state, live, prefer_first=prefer)
            if new is None:
                # The state stands (its leader live and current): the moment to drop the
                # replicas leaving, if its first replica leads and every other is in sync.
                current = state.leader in live and live[state.leader] < state.mzxid
                if removing and plan_removal(replicas, removing, state.leader, state.isr, current) is not None:
                    if not self._remove_replicas(name, p, state, stat.version, current):
                        clean = False
                continue
            if not self._write(name, p, new, stat.version):
                clean = False
            else:
                log.info("%s-%d: leader %s epoch %d ISR %s -> leader %s epoch %d ISR %s", name, p,
                         state.leader, state.leader_epoch, ",".join(state.isr), new.leader or "none",
                         new.leader_epoch, ",".join(new.isr))
        return clean

    def _remove_replicas(self, topic: str, partition: int, state: PartitionState, state_version: int,
                         leader_current: bool) -> bool:
        """Drop a partition's removing replicas (coordinator_replicas.plan_removal) from
        its replicas in the topic znode and from its ISR, in one multi-op with the
        controller epoch checked, each znode by compare-and-set on what was read."""
        found = self.cluster.read_topic(topic)
        if found is None:
            return True
        body, topic_version = found
        key = str(partition)
        replicas = list(body.get("partitions", {}).get(key, ()))
        removing = list((body.get("removing") or {}).get(key, ()))
        plan = plan_removal(replicas, removing, state.leader, state.isr, leader_current)
        if plan is None:
            return True
        new_replicas, isr = plan
        body = with_assignment(body, partition, new_replicas, ())
        tx = self.zk.transaction()
        tx.check(CONTROLLER_EPOCH, self._epoch_version)
        tx.set_data(f"{TOPICS}/{topic}", features.zk_json("zk-topic", body), version=topic_version)
        tx.set_data(state_path(topic, partition), PartitionState(state.leader, state.leader_epoch, isr).encode(),
                    version=state_version)
        failed = [r for r in tx.commit() if isinstance(r, Exception)]
        if failed:
            log.info("%s-%d: removal of replicas %s refused (%r); deciding again", topic, partition,
                     ",".join(removing), failed[0])
            return False
        log.info("%s-%d: replicas %s -> %s (the first replica leads; %s removed)", topic, partition,
                 ",".join(replicas), ",".join(new_replicas), ",".join(removing))
        return True

    def _write(self, topic: str, partition: int, state: PartitionState, version: int) -> bool:
        tx = self.zk.transaction()
        tx.check(CONTROLLER_EPOCH, self._epoch_version)
        tx.set_data(state_path(topic, partition), state.encode(), version=version)
        results = tx.commit()
        failed = [r for r in results if isinstance(r, Exception)]
        if failed:
            log.info("%s-%d: state write refused (%r); deciding again", topic, partition, failed[0])
            return False
        return True
