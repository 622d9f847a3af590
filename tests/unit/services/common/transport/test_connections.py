"""Connection limits' pure logic (services.common.transport.connections; docs/design.md,
"Connections"): per-IP counting and overrides, the KIP-612 creation-rate bucket,
the fd budget, /proc/net/tcp parsing and the gRPC sweeper's choice of connections
to shut, the rate-limited refusal log."""
from __future__ import annotations

import logging
import os
import re
import socket

import pytest

from exactly.testing import MockTime
from exactly_wire.config import ConfigurationError
from services.common.settings import service_settings
from services.common.transport import connections as c


def test_per_ip_limit_counts_each_address_and_release_frees_a_place():
    limits = c.ConnectionLimits(per_ip=2)
    assert limits.admit("10.0.0.1") is None
    assert limits.admit("10.0.0.1") is None
    assert limits.admit("10.0.0.1") == c.MAX_CONNECTIONS_PER_IP
    assert limits.admit("10.0.0.2") is None  # another address has its own count
    limits.release("10.0.0.1")
    assert limits.admit("10.0.0.1") is None
    assert limits.active == 3 and limits.by_ip == {"10.0.0.1": 2, "10.0.0.2": 1}


def test_ipv4_mapped_ipv6_counts_as_its_ipv4_address():
    limits = c.ConnectionLimits(per_ip=1)
    assert limits.admit("::ffff:10.0.0.1") is None
    assert limits.admit("10.0.0.1") == c.MAX_CONNECTIONS_PER_IP


def test_overrides_raise_or_lower_one_address():
    limits = c.ConnectionLimits(per_ip=1, overrides=c.parse_overrides("10.0.0.9:3, [::1]:0"))
    assert [limits.admit("10.0.0.9") for _ in range(4)] == [None, None, None, c.MAX_CONNECTIONS_PER_IP]
    assert limits.admit("::1") == c.MAX_CONNECTIONS_PER_IP  # 0: never
    assert limits.admit("10.0.0.8") is None


def test_max_connections_counts_every_address():
    limits = c.ConnectionLimits(max_connections=2)
    assert limits.admit("10.0.0.1") is None and limits.admit("10.0.0.2") is None
    assert limits.admit("10.0.0.3") == c.MAX_CONNECTIONS
    limits.release("10.0.0.3")  # never admitted: nothing to release
    assert limits.active == 2


def test_release_of_an_unknown_address_changes_nothing():
    limits = c.ConnectionLimits()
    limits.release("10.0.0.1")
    assert limits.active == 0 and limits.by_ip == {}


@pytest.mark.parametrize("bad", ["10.0.0.1", "10.0.0.1:x", ":5", "10.0.0.1:-1", "no-such-host.invalid:3"])
def test_malformed_overrides_are_refused_naming_the_entry(bad):
    with pytest.raises(ValueError, match=re.escape(repr(bad.rpartition(":")[0] if "invalid" in bad else bad))):
        c.parse_overrides(bad)
    with pytest.raises(ConfigurationError) as refused:  # at start: the key, once, then why
        service_settings({"max.connections.per.ip.overrides": bad})
    assert str(refused.value).startswith(f"max.connections.per.ip.overrides={bad!r} is invalid")
    assert str(refused.value).count("max.connections.per.ip.overrides") == 1


def test_overrides_resolve_a_host_name():
    assert c.parse_overrides("localhost:7")["127.0.0.1"] == 7
    assert c.parse_overrides("") == {}


def test_creation_rate_refuses_beyond_the_rate_and_refills_with_time():
    clock = MockTime(1_000_000)  # 1000 s
    limits = c.ConnectionLimits(rate=5, clock=clock.now_s)
    got = [limits.admit(f"10.0.0.{i}") for i in range(8)]
    assert got.count(None) == 5 and got[5:] == [c.MAX_CONNECTION_CREATION_RATE] * 3
    clock.advance(500)  # 2.5 tokens
    got = [limits.admit(f"10.0.1.{i}") for i in range(3)]
    assert got == [None, None, c.MAX_CONNECTION_CREATION_RATE]
    clock.advance(100_000)  # the bucket holds one second's worth, not more
    assert [limits.admit(f"10.0.2.{i}") for i in range(6)].count(None) == 5


def test_a_refused_connection_spends_no_rate_token():
    clock = MockTime(1_000_000)  # 1000 s
    limits = c.ConnectionLimits(per_ip=1, rate=2, clock=clock.now_s)
    assert limits.admit("10.0.0.1") is None
    assert limits.admit("10.0.0.1") == c.MAX_CONNECTIONS_PER_IP
    assert limits.admit("10.0.0.2") is None  # the second token is still there


def test_fd_budget_halves_what_the_reserve_leaves():
    assert c.connection_budget(20000, 1024, c.MAX_INT) == 9488
    assert c.connection_budget(20000, 1024, 500) == 500
    assert c.connection_budget(1000, 1024, c.MAX_INT) == 1  # never 0 or negative


def test_raise_nofile_limit_reaches_the_hard_limit():
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        assert c.raise_nofile_limit() == min(hard, 1048576)
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == min(hard, 1048576)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


TCP = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 100 1 0 100 0 0 10 0
   1: 0100007F:1F90 0200007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 201 1 0 20 4 30 10 -1
   2: 0100007F:1F90 0300007F:D432 01 00000000:00000000 00:00000000 00000000     0        0 202 1 0 20 4 30 10 -1
   3: 0100007F:1F91 0300007F:D433 01 00000000:00000000 00:00000000 00000000     0        0 203 1 0 20 4 30 10 -1
   4: 0100007F:1F90 0300007F:D434 06 00000000:00000000 00:00000000 00000000     0        0 0 1 0 20 4 30 10 -1
"""
TCP6 = """  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:1F90 00000000000000000000000001000000:C001 01 00000000:00000000 00:00000000 00000000     0        0 301 1 0 20 4 30 10 -1
   1: 0000000000000000FFFF00000500000A:1F90 0000000000000000FFFF00000600000A:C002 01 00000000:00000000 00:00000000 00000000     0        0 302 1 0 20 4 30 10 -1
"""


def test_proc_net_tcp_lists_the_ports_held_connections_with_their_peer():
    assert c.parse_proc_net_tcp(TCP, 8080, ipv6=False) == [(201, "127.0.0.2"), (202, "127.0.0.3")]
    assert c.parse_proc_net_tcp(TCP6, 8080, ipv6=True) == [(301, "::1"), (302, "10.0.0.6")]


def _sweeper(**kw):
    return c.GrpcConnectionSweeper(8080, c.ConnectionLimits(**kw), c.RefusalLog("grpc-test"), 1.0)


def test_sweeper_keeps_admitted_connections_and_shuts_the_newest_excess():
    sweeper = _sweeper(per_ip=2)
    assert sweeper.plan([(10, "10.0.0.1"), (11, "10.0.0.1")]) == []
    # Two newer connections of the same peer, one of another: the old two keep their places.
    refused = sweeper.plan([(5, "10.0.0.1"), (10, "10.0.0.1"), (11, "10.0.0.1"), (12, "10.0.0.2")])
    assert refused == [(5, "10.0.0.1", c.MAX_CONNECTIONS_PER_IP)]
    # One old connection closed: the next new one takes its place.
    assert sweeper.plan([(11, "10.0.0.1"), (12, "10.0.0.2"), (13, "10.0.0.1"), (14, "10.0.0.1")]) == \
        [(14, "10.0.0.1", c.MAX_CONNECTIONS_PER_IP)]


def test_sweeper_applies_the_creation_rate_to_new_connections_only():
    sweeper = _sweeper(rate=2)
    first = sweeper.plan([(1, "10.0.0.1"), (2, "10.0.0.2")])
    assert first == []
    refused = sweeper.plan([(1, "10.0.0.1"), (2, "10.0.0.2"), (3, "10.0.0.3")])
    assert refused == [(3, "10.0.0.3", c.MAX_CONNECTION_CREATION_RATE)]  # the bucket is empty, old ones stay


def test_shutdown_socket_ends_the_connection_and_checks_the_inode():
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    try:
        inode = os.fstat(accepted.fileno()).st_ino
        assert not c.shutdown_socket(accepted.fileno(), inode + 1)  # not that socket: left alone
        assert c.socket_descriptors()[inode] == accepted.fileno()
        assert c.shutdown_socket(accepted.fileno(), inode)
        client.settimeout(5)
        assert client.recv(1) == b""  # the peer sees the end
        accepted.fileno()  # the descriptor is still the owner's
    finally:
        for s in (client, accepted, server):
            s.close()


def test_refusal_log_counts_every_refusal_and_logs_once_per_interval(caplog):
    clock = MockTime(1_000_000)  # 1000 s
    refusals = c.RefusalLog("kafka-test", interval_s=10, clock=clock.now_s)
    counter = c.REFUSED.labels("kafka-test", c.MAX_CONNECTIONS_PER_IP)
    before = counter._value.get()
    with caplog.at_level(logging.WARNING, logger=c.__name__):
        logged = [refusals.refused(c.MAX_CONNECTIONS_PER_IP, "10.0.0.1:1") for _ in range(5)]
        clock.advance(11_000)
        logged.append(refusals.refused(c.MAX_CONNECTIONS_PER_IP, "10.0.0.1:2"))
    assert logged == [True, False, False, False, False, True]
    assert counter._value.get() - before == 6
    assert "4 more since the last such message" in caplog.records[-1].getMessage()


BASE = ["--node-id", "pl-0", "--zookeeper", "zk:2181", "--data-dir", "/tmp/x"]


def test_grpc_server_options_carry_the_connection_limits():
    from services.common.transport import server
    from services.common.config import parse_args
    cfg = parse_args("partition_leader", BASE + ["--set", "exactly.ssl.handshake.timeout.ms=2500",
                                                 "--set", "connections.max.idle.ms=60000",
                                                 "--set", "max.connections=50000"])
    options = dict(server.server_options(cfg, nofile=20000))
    assert options["grpc.server_handshake_timeout_ms"] == 2500
    assert options["grpc.max_connection_idle_ms"] == 60000
    assert options["grpc.max_allowed_incoming_connections"] == 9488  # the fd budget, below max.connections
    sweeper, kafka = server.connection_sweeper(cfg, 1234, 20000)
    assert sweeper.limits.limit_for("10.0.0.9") == kafka.limit_for("10.0.0.9") == 1000  # the default per address
    assert sweeper.budget.limits == [sweeper.limits, kafka]
    cfg = parse_args("partition_leader", BASE + ["--set", "max.connections.per.ip=10",
                                                 "--set", "max.connections.per.ip.overrides=10.0.0.1:100"])
    sweeper, _ = server.connection_sweeper(cfg, 1234, 20000)
    assert sweeper.limits.limit_for("10.0.0.1") == 100 and sweeper.limits.limit_for("10.0.0.2") == 10


def test_the_descriptor_budget_counts_what_is_not_a_connection():
    """(RLIMIT_NOFILE - reserve - other descriptors) / 2 per listener: a partition
    leader's segments and indexes shrink what connections may take, as they open."""
    grpc_limits, kafka_limits = c.ConnectionLimits(counted=False), c.ConnectionLimits()
    held = [1500]
    budget = c.DescriptorBudget(1024, c.MAX_INT, [grpc_limits, kafka_limits], nofile=lambda: 20000,
                                descriptors=lambda: held[0])
    for ip in ("10.0.0.1", "10.0.0.2"):
        kafka_limits.admit(ip)
    # 1500 open: 300 gRPC connections, 2 Kafka ones, 1198 others (ZooKeeper, segments, indexes)
    assert budget.update(connections=300) == (20000 - 1024 - 1198) // 2
    assert kafka_limits.max_connections == grpc_limits.max_connections == 8889
    held[0] = 1500 + 2000  # 1000 partitions opened (a .log and an .index each)
    assert budget.update(connections=300) == (20000 - 1024 - 3198) // 2
    held[0] = 30000  # more than the limit: one connection each at least
    assert budget.update(connections=0) == 1
    assert c.DescriptorBudget(1024, 50, [kafka_limits], nofile=lambda: 20000,
                              descriptors=lambda: 100).update() == 50  # max.connections below the budget


def test_memory_trim_returns_what_the_trim_gave_back():
    from services.common.transport import memory
    resident = [900 << 20]

    def trim():
        resident[0] = 200 << 20
        return 1
    trimmer = memory.MemoryTrim(10.0, trim, resident=lambda: resident[0])
    assert trimmer.once() == 700 << 20
    assert trimmer.once() == 0
    assert memory.malloc_trim() is not None  # glibc: the tests run on Linux
    assert memory.resident_bytes() > 0


def test_a_malformed_overrides_setting_stops_the_service_naming_the_key(capsys):
    from services.common.config import parse_args
    with pytest.raises(SystemExit):
        parse_args("partition_leader", BASE + ["--set", "max.connections.per.ip.overrides=10.0.0.1"])
    err = capsys.readouterr().err
    assert "max.connections.per.ip.overrides='10.0.0.1' is invalid for the partition leader: " \
        "'10.0.0.1' is not host:count" in err
    assert err.count("max.connections.per.ip.overrides") == 1
