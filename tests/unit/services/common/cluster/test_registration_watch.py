"""ClusterState's watch of each registration's data (`_on_registration`): a partition
leader marking its log directory offline changes its registration's data, not the list
of registrations, and the controller must hear of it at once (its periodic sweep is a
backstop 10 s apart). Driven here through kazoo's own DataWatch and ChildrenWatch
recipes on a fake client whose watch deliveries and threads run in an order each test
chooses: the orders ZooKeeper and kazoo allow, the ones that used to lose the change
included."""
from __future__ import annotations

import threading
from types import SimpleNamespace

from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import EventType, KazooState, WatchedEvent
from kazoo.recipe.watchers import ChildrenWatch, DataWatch

from services.common.cluster import features
from services.common.cluster import state as cluster_state
from services.common.cluster.state import SERVICES

PL1 = f"{SERVICES}/pl-1"


class FakeZk:
    """The part of KazooClient the recipes use. Watch deliveries queue in `callbacks`
    (kazoo's callback thread) and spawned work in `spawned` (kazoo's threads); a test
    runs them when it chooses. `suspend()` forgets the client-side watches as kazoo does
    on a lost connection; `reconnect()` tells the listeners, which spawn their reads."""

    def __init__(self):
        self.nodes: dict[str, tuple[bytes, int, int]] = {SERVICES: (b"", 0, 0)}  # path -> (data, czxid, mzxid)
        self.zxid = 0
        self.data_watches: dict[str, set] = {}
        self.child_watches: dict[str, set] = {}
        self.listeners: set = set()
        self.spawned: list = []
        self.callbacks: list = []
        self.on_missing_get = None  # run once when a get finds no node (a re-create racing the read)

        def spawn(fn, *args, **kwargs):
            run = lambda: fn(*args, **kwargs)  # noqa: E731
            run.owner = getattr(fn, "__self__", None)
            self.spawned.append(run)
        self.handler = SimpleNamespace(spawn=spawn, lock_object=threading.RLock, sleep_func=lambda s: None)

    def retry(self, fn, *args, **kwargs):
        return fn(*args, **kwargs)

    def add_listener(self, fn):
        self.listeners.add(fn)

    def remove_listener(self, fn):
        self.listeners.discard(fn)

    def _stat(self, path):
        _, czxid, mzxid = self.nodes[path]
        return SimpleNamespace(czxid=czxid, mzxid=mzxid, version=mzxid, ephemeralOwner=1)

    def get(self, path, watch=None):
        if path not in self.nodes:
            hook, self.on_missing_get = self.on_missing_get, None
            if hook:
                hook()
            raise NoNodeError()
        if watch:
            self.data_watches.setdefault(path, set()).add(watch)
        return self.nodes[path][0], self._stat(path)

    def exists(self, path, watch=None):
        if watch:
            self.data_watches.setdefault(path, set()).add(watch)
        return self._stat(path) if path in self.nodes else None

    def get_children(self, path, watch=None):
        if watch:
            self.child_watches.setdefault(path, set()).add(watch)
        prefix = path + "/"
        return sorted(k[len(prefix):] for k in self.nodes if k.startswith(prefix) and "/" not in k[len(prefix):])

    def _fire(self, table, path, kind):
        for watcher in table.pop(path, set()):
            self.callbacks.append(lambda w=watcher: w(WatchedEvent(kind, "CONNECTED", path)))

    def create(self, path, data):
        self.zxid += 1
        self.nodes[path] = (data, self.zxid, self.zxid)
        self._fire(self.data_watches, path, EventType.CREATED)
        self._fire(self.child_watches, path.rsplit("/", 1)[0], EventType.CHILD)

    def set(self, path, data):
        self.zxid += 1
        self.nodes[path] = (data, self.nodes[path][1], self.zxid)
        self._fire(self.data_watches, path, EventType.CHANGED)

    def delete(self, path):
        self.zxid += 1
        del self.nodes[path]
        self._fire(self.data_watches, path, EventType.DELETED)
        self._fire(self.child_watches, path.rsplit("/", 1)[0], EventType.CHILD)

    def suspend(self):
        for fn in list(self.listeners):
            fn(KazooState.SUSPENDED)
        self.data_watches.clear()
        self.child_watches.clear()

    def reconnect(self):
        for fn in list(self.listeners):
            fn(KazooState.CONNECTED)

    @staticmethod
    def run(queue):
        while queue:
            queue.pop(0)()

    def DataWatch(self, path, func):  # noqa: N802 - KazooClient's name
        return DataWatch(self, path, func)


def registration(offline: bool = False) -> bytes:
    body = {"role": "partition_leader", "host": "h", "port": 1, "kafka_port": 0, "broker_id": 1,
            "features": features.registration_features()}
    if offline:
        body["log_dir_offline"] = True
    return features.zk_json("zk-registration", body)


def watched_cluster():
    """(zk, cluster state, notifications): three registrations, watched."""
    zk = FakeZk()
    cs = object.__new__(cluster_state.ClusterState)  # only the watch's state, no session
    cs.zk, cs._lock, cs._nodes, cs._registrations_watched, cs._listeners = zk, threading.RLock(), {}, set(), []
    notes: list[int] = []
    cs._listeners.append(lambda: notes.append(1))
    for node in ("pl-0", "pl-1", "pl-2"):
        zk.create(f"{SERVICES}/{node}", registration())
    zk.callbacks.clear()
    ChildrenWatch(zk, SERVICES, cs._on_services)
    notes.clear()
    return zk, cs, notes


def active_watches(zk, path) -> int:
    return sum(1 for w in zk.data_watches.get(path, ()) if not getattr(w.__self__, "_stopped", False))


def mark_offline(zk):
    zk.set(PL1, registration(offline=True))
    zk.run(zk.callbacks)
    zk.run(zk.spawned)


def test_a_registration_marked_offline_notifies():
    zk, cs, notes = watched_cluster()
    mark_offline(zk)
    assert notes == [1] and cs._nodes["pl-1"].node_id == "pl-1"


def test_the_watch_outlives_a_reconnect_across_which_the_node_re_registered():
    """The connection drops, pl-1's znode goes and comes back meanwhile, and after the
    reconnect pl-1's data watch reads before the children watch: it finds no node, and
    the children read later finds the same list as before (kazoo then calls nothing).
    The watch must still be there for pl-1's offline mark."""
    zk, cs, notes = watched_cluster()
    zk.suspend()
    zk.delete(PL1)
    zk.callbacks.clear()  # disconnected: nothing delivered
    zk.reconnect()
    data_reads = [run for run in zk.spawned if isinstance(run.owner, DataWatch)]
    children_read = [run for run in zk.spawned if isinstance(run.owner, ChildrenWatch)]
    assert len(data_reads) == 3 and len(children_read) == 1
    zk.spawned = []
    zk.run(data_reads)  # pl-1's: no node
    zk.create(PL1, registration())
    zk.run(children_read)  # the same three children: _on_services is not called
    zk.run(zk.callbacks)
    notes.clear()
    mark_offline(zk)
    assert notes, "the offline mark went unreported"
    assert active_watches(zk, PL1) == 1


def test_a_change_read_by_kazoos_own_thread_without_an_event_notifies():
    """pl-1 restarts (deleted, re-created between the data watch's get and exists), so
    the watch reads again in a thread of kazoo's, which reports the data with no event;
    the offline mark lands before that read. It is still a change, not the first call."""
    zk, cs, notes = watched_cluster()
    zk.on_missing_get = lambda: zk.create(PL1, registration())
    zk.delete(PL1)
    zk.run(zk.callbacks)
    notes.clear()
    zk.set(PL1, registration(offline=True))  # before the spawned read
    zk.run(zk.spawned)
    zk.run(zk.callbacks)
    assert notes, "the offline mark went unreported"


def test_restarts_keep_one_watch_per_node_id():
    zk, cs, notes = watched_cluster()
    for _ in range(50):
        zk.delete(PL1)
        zk.run(zk.callbacks)
        zk.create(PL1, registration())
        zk.run(zk.callbacks)
    assert active_watches(zk, PL1) == 1
    assert sum(1 for fn in zk.listeners if isinstance(getattr(fn, "__self__", None), DataWatch)) == 3
    notes.clear()
    mark_offline(zk)
    assert notes == [1]


def test_an_unreadable_registration_is_logged_and_still_notifies(caplog):
    zk, cs, notes = watched_cluster()
    zk.set(PL1, features.zk_json("zk-registration", {"role": "partition_leader", "host": "h", "port": None}))
    zk.run(zk.callbacks)
    assert notes == [1] and "registration of pl-1 not read" in caplog.text
