"""The controller acts on what ZooKeeper's watches report, not on its periodic sweep
(services.common.cluster.controller): the sweep is a backstop against a lost watch,
10 s apart by default, here a minute apart. What it used to be the only one to see
every second, a registration whose data changed while its znode stayed (KIP-112: the
process marked its log directory offline), now starts a sweep at once through the
registration's data watch (ClusterState._on_registration), so leadership moves as
fast as on a crash."""
from __future__ import annotations

import json
import time

from clusters import zookeeper_client
from services.common.cluster.state import SERVICES
from waiting import wait_for

from .test_disk_faults import create_topic, led_by, states
from .test_replication import PROPS, SESSION_MS

BACKSTOP_MS = 60_000


def test_a_registration_marked_offline_moves_leadership_without_the_backstop_sweep(make_cluster):
    cluster = make_cluster(partition_leaders=3, txn_coordinators=0, group_coordinators=0,
                           props={**PROPS, "controller.sweep.interval.ms": str(BACKSTOP_MS)})
    topic = create_topic(cluster, partitions=3)
    part = led_by(cluster, topic, "pl-1")
    zk = zookeeper_client(cluster)
    try:
        # What pl-1's ClusterState.mark_log_dir_offline writes: its registration, with
        # the flag, on the znode its session holds (no child added or removed).
        path = f"{SERVICES}/pl-1"
        data, stat = zk.get(path)
        registration = json.loads(data)
        assert not registration.get("log_dir_offline")
        marked_at = time.monotonic()
        zk.set(path, json.dumps({**registration, "log_dir_offline": True}).encode(), version=stat.version)
        new = wait_for(lambda: (lambda st: st if st[0] not in (None, "pl-1") else None)(
            states(cluster, topic, exclude=("pl-1",))[part]), SESSION_MS / 1000 + 10,
            lambda: f"a new leader: {states(cluster, topic, exclude=('pl-1',))}")
        moved_after = time.monotonic() - marked_at
    finally:
        zk.stop()
        zk.close()
    assert new[0] in ("pl-0", "pl-2")
    # Far sooner than the backstop (a minute): the watch started the sweep.
    assert moved_after < BACKSTOP_MS / 1000 / 4, moved_after
    # No partition is led by pl-1 any more, and none lost its leader. (ISRs are not
    # checked: only pl-1's registration says offline here, its log directory works and it
    # still replicates, so a leader may take it back in, which a real failure prevents;
    # test_disk_faults checks the ISRs with a failing directory.)
    for leader, _ in states(cluster, topic, exclude=("pl-1",)).values():
        assert leader not in (None, "pl-1")
