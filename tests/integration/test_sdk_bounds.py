"""Every SDK call ends within its documented bound (docs/sdk.md, "Timeouts: what each one bounds"), sync and
asyncio, whatever the cluster does: a transaction coordinator stopped with SIGSTOP, a
cluster killed with SIGKILL, a closed port, a server that accepts TCP and never
answers, a TLS listener closing at accept, a partition leader stopped, a group coordinator stopped. Each call gets
its bound (`max.block.ms`, `default.api.timeout.ms`, or its `timeout` argument) plus
SLACK_S; a retry never starts a fresh request.timeout.ms past it."""
from __future__ import annotations

import asyncio
import signal
import socket
import time
from typing import Any, Awaitable, Callable

import pytest

from exactly import AdminClient, Consumer, NewTopic, OffsetAndMetadata, Producer, TopicPartition, errors
from exactly.aio import AIOConsumer, AIOProducer
from exactly_tools.certs import CertificateAuthority

import listeners

pytestmark = pytest.mark.integration

REQUEST_TIMEOUT_MS = 3000
BOUND_MS = 4000          # max.block.ms of producers, default.api.timeout.ms of consumers
SLACK_S = 2.5


def _producer_conf(bootstrap: str, **extra: Any) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, "request.timeout.ms": REQUEST_TIMEOUT_MS,
            "max.block.ms": BOUND_MS, "retry.backoff.max.ms": 500, **extra}


def _consumer_conf(bootstrap: str, **extra: Any) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, "request.timeout.ms": REQUEST_TIMEOUT_MS,
            "default.api.timeout.ms": BOUND_MS, "retry.backoff.max.ms": 500, "group.id": "bounds",
            "enable.auto.commit": False, "auto.offset.reset": "earliest", **extra}


def _timed(fn: Callable[[], Any]) -> tuple[float, BaseException | None]:
    started = time.monotonic()
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - the caller asserts on it
        return time.monotonic() - started, exc
    return time.monotonic() - started, None


async def _timed_async(fn: Callable[[], Awaitable[Any]]) -> tuple[float, BaseException | None]:
    started = time.monotonic()
    try:
        await fn()
    except BaseException as exc:  # noqa: BLE001 - the caller asserts on it
        return time.monotonic() - started, exc
    return time.monotonic() - started, None


def _assert_bounded(what: str, elapsed: float, exc: BaseException | None, bound_s: float = BOUND_MS / 1000) -> None:
    assert exc is None or isinstance(exc, errors.ExactlyError), f"{what}: {exc!r}"
    assert elapsed <= bound_s + SLACK_S, f"{what} took {elapsed:.1f} s (bound {bound_s} s): {exc!r}"


def _closed_port() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"127.0.0.1:{port}"


def _topic(bootstrap: str, name: str, partitions: int = 3) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        admin.create_topics([NewTopic(name, partitions)])
    finally:
        admin.close()


# ---------------------------------------------------------------- unreachable clusters

@pytest.mark.parametrize("where", ["closed port", "silent server"])
def test_init_transactions_is_bounded_by_max_block_ms(where):
    with listeners.mute() as silent:
        bootstrap = _closed_port() if where == "closed port" else silent
        p = Producer(_producer_conf(bootstrap, **{"transactional.id": "bounds-init"}))
        try:
            elapsed, exc = _timed(p.init_transactions)
        finally:
            p.close(timeout=0)
        _assert_bounded(f"init_transactions ({where})", elapsed, exc)
        assert isinstance(exc, errors.KafkaTimeoutError), exc

        async def _aio() -> tuple[float, BaseException | None]:
            ap = AIOProducer(_producer_conf(bootstrap, **{"transactional.id": "bounds-init"}))
            try:
                return await _timed_async(ap.init_transactions)
            finally:
                await ap.close(timeout=0)

        elapsed, exc = asyncio.run(_aio())
        _assert_bounded(f"aio init_transactions ({where})", elapsed, exc)
        assert isinstance(exc, errors.KafkaTimeoutError), exc


@pytest.mark.parametrize("where", ["closed port", "silent server"])
def test_consumer_offset_calls_are_bounded_by_default_api_timeout_ms(where):
    tp = TopicPartition("bounds", 0)
    with listeners.mute() as silent:
        bootstrap = _closed_port() if where == "closed port" else silent
        c = Consumer(_consumer_conf(bootstrap))
        try:
            for name, call in (("committed", lambda: c.committed([tp])),
                               ("commit", lambda: c.commit({tp: OffsetAndMetadata(1)}))):
                elapsed, exc = _timed(call)
                _assert_bounded(f"Consumer.{name} ({where})", elapsed, exc)
                assert exc is not None and exc.retriable, exc
        finally:
            c.close(timeout=0)

        async def _aio() -> None:
            ac = AIOConsumer(_consumer_conf(bootstrap))
            try:
                for name, call in (("committed", lambda: ac.committed([tp])),
                                   ("commit", lambda: ac.commit({tp: OffsetAndMetadata(1)}))):
                    elapsed, exc = await _timed_async(call)
                    _assert_bounded(f"AIOConsumer.{name} ({where})", elapsed, exc)
                    assert exc is not None and exc.retriable, exc
            finally:
                await ac.close()

        asyncio.run(_aio())


def test_polling_a_silent_server_returns_empty_sync_and_aio():
    """Against a server that never answers, poll() returns [] by its timeout in both
    clients (the group is joined in the background, as librdkafka's)."""
    with listeners.mute() as silent:
        c = Consumer(_consumer_conf(silent))
        try:
            c.subscribe(["bounds"])
            for _ in range(3):
                elapsed, exc = _timed(lambda: c.poll(1.0))
                _assert_bounded("Consumer.poll(1.0) (silent server)", elapsed, exc, bound_s=1.0)
                assert exc is None, exc
        finally:
            c.close(timeout=0)

        async def _aio() -> None:
            ac = AIOConsumer(_consumer_conf(silent))
            try:
                await ac.subscribe(["bounds"])
                for _ in range(3):
                    out: list = []

                    async def _poll() -> None:
                        out.extend(await ac.poll(1.0))

                    elapsed, exc = await _timed_async(_poll)
                    _assert_bounded("AIOConsumer.poll(1.0) (silent server)", elapsed, exc, bound_s=1.0)
                    assert exc is None and out == [], (exc, out)
            finally:
                await ac.close()

        asyncio.run(_aio())


def test_send_waits_for_metadata_up_to_max_block_ms():
    """Kafka's send(): with no metadata for the topic (the cluster is down), it blocks
    up to max.block.ms and then raises KafkaTimeoutError, not an immediate
    NetworkException."""
    p = Producer(_producer_conf(_closed_port()))
    try:
        elapsed, exc = _timed(lambda: p.send("bounds", b"x"))
    finally:
        p.close(timeout=0)
    _assert_bounded("send (cluster down)", elapsed, exc)
    assert isinstance(exc, errors.KafkaTimeoutError), exc
    assert elapsed >= BOUND_MS / 1000 - 0.5, f"send gave up after {elapsed:.1f} s, before max.block.ms"

    async def _aio() -> tuple[float, BaseException | None]:
        ap = AIOProducer(_producer_conf(_closed_port()))
        try:
            return await _timed_async(lambda: ap.send("bounds", b"x"))
        finally:
            await ap.close(timeout=0)

    elapsed, exc = asyncio.run(_aio())
    _assert_bounded("aio send (cluster down)", elapsed, exc)
    assert isinstance(exc, errors.KafkaTimeoutError), exc


def test_a_tls_listener_closing_at_accept_is_retried_up_to_max_block_ms(tmp_path):
    """A TLS listener at its connection limit closes each connection at accept, without a
    byte: that says nothing of the transport, so send() retries for max.block.ms and
    raises KafkaTimeoutError (retriable), not a fatal ConnectionSetupError calling the
    listener plaintext."""
    tls = {"security.protocol": "SSL", "ssl.ca.location": str(CertificateAuthority.create(tmp_path).ca_path)}
    with listeners.mute(close_at_accept=True) as address:
        p = Producer(_producer_conf(address, **tls))
        try:
            elapsed, exc = _timed(lambda: p.send("bounds", b"x"))
        finally:
            p.close(timeout=0)
    _assert_bounded("send (TLS listener closing at accept)", elapsed, exc)
    assert isinstance(exc, errors.KafkaTimeoutError) and exc.retriable, repr(exc)
    assert elapsed >= BOUND_MS / 1000 - 0.5, f"send gave up after {elapsed:.1f} s, before max.block.ms"


# ---------------------------------------------------------------- a stopped coordinator

def _open_transactions(bootstrap: str, topic: str, prefix: str) -> dict[str, Producer]:
    """Three initialised producers: 'commit' and 'abort' with a flushed record in an
    open transaction, 'offsets' with an empty open transaction."""
    out = {}
    for name in ("commit", "abort", "offsets"):
        p = Producer(_producer_conf(bootstrap, **{"transactional.id": f"{prefix}-{name}"}))
        p.init_transactions()
        p.begin_transaction()
        if name != "offsets":
            p.send(topic, name.encode(), partition=0)
            p.flush(10)
        out[name] = p
    return out


async def _open_transactions_aio(bootstrap: str, topic: str, prefix: str) -> dict[str, AIOProducer]:
    out = {}
    for name in ("commit", "abort", "offsets"):
        p = AIOProducer(_producer_conf(bootstrap, **{"transactional.id": f"{prefix}-{name}"}))
        await p.init_transactions()
        p.begin_transaction()
        if name != "offsets":
            await p.send(topic, name.encode(), partition=0)
        out[name] = p
    return out


def _transaction_calls(ps: dict[str, Any]) -> list[tuple[str, Callable[[], Any]]]:
    offsets = {TopicPartition("bounds-in", 0): OffsetAndMetadata(1)}
    return [("commit_transaction", ps["commit"].commit_transaction),
            ("abort_transaction", ps["abort"].abort_transaction),
            ("send_offsets_to_transaction", lambda: ps["offsets"].send_offsets_to_transaction(offsets, "bounds"))]


def test_transaction_calls_with_the_transaction_coordinator_stopped(cluster):
    _topic(cluster.bootstrap_servers, "bounds-txn")
    sync_ps = _open_transactions(cluster.bootstrap_servers, "bounds-txn", "stop-sync")
    loop = asyncio.new_event_loop()
    try:
        aio_ps = loop.run_until_complete(_open_transactions_aio(cluster.bootstrap_servers, "bounds-txn", "stop-aio"))
        cluster.signal("txn-0", signal.SIGSTOP)
        try:
            for name, call in _transaction_calls(sync_ps):
                elapsed, exc = _timed(call)
                _assert_bounded(f"{name} (coordinator stopped)", elapsed, exc)
                assert exc is not None, f"{name} succeeded against a stopped coordinator"
            for name, call in _transaction_calls(aio_ps):
                elapsed, exc = loop.run_until_complete(_timed_async(call))
                _assert_bounded(f"aio {name} (coordinator stopped)", elapsed, exc)
                assert exc is not None, f"aio {name} succeeded against a stopped coordinator"
        finally:
            cluster.signal("txn-0", signal.SIGCONT)
        for p in aio_ps.values():
            loop.run_until_complete(p.close(timeout=5))
    finally:
        loop.close()
        for p in sync_ps.values():
            p.close(timeout=5)


def test_transaction_and_offset_calls_with_the_cluster_killed(make_cluster):
    cluster = make_cluster(partition_leaders=1)
    _topic(cluster.bootstrap_servers, "bounds-killed", partitions=1)
    sync_ps = _open_transactions(cluster.bootstrap_servers, "bounds-killed", "kill-sync")
    c = Consumer(_consumer_conf(cluster.bootstrap_servers))
    tp = TopicPartition("bounds-killed", 0)
    c.committed([tp])  # the group coordinator is known before the cluster dies
    loop = asyncio.new_event_loop()
    try:
        aio_ps = loop.run_until_complete(_open_transactions_aio(cluster.bootstrap_servers, "bounds-killed", "kill-aio"))
        ac = loop.run_until_complete(_make_aio_consumer(cluster.bootstrap_servers))
        loop.run_until_complete(ac.committed([tp]))
        for svc in list(cluster.services):
            cluster.kill(svc)
        for name, call in _transaction_calls(sync_ps)[:2] + [
                ("Consumer.committed", lambda: c.committed([tp])),
                ("Consumer.commit", lambda: c.commit({tp: OffsetAndMetadata(1)}))]:
            elapsed, exc = _timed(call)
            _assert_bounded(f"{name} (cluster killed)", elapsed, exc)
            assert exc is not None
        for name, call in _transaction_calls(aio_ps)[:2] + [
                ("AIOConsumer.committed", lambda: ac.committed([tp])),
                ("AIOConsumer.commit", lambda: ac.commit({tp: OffsetAndMetadata(1)}))]:
            elapsed, exc = loop.run_until_complete(_timed_async(call))
            _assert_bounded(f"aio {name} (cluster killed)", elapsed, exc)
            assert exc is not None
        for p in aio_ps.values():
            loop.run_until_complete(p.close(timeout=0))
        loop.run_until_complete(ac.close())
    finally:
        loop.close()
        for p in sync_ps.values():
            p.close(timeout=0)
        c.close(timeout=0)


async def _make_aio_consumer(bootstrap: str) -> AIOConsumer:
    return AIOConsumer(_consumer_conf(bootstrap))


# ---------------------------------------------------------------- a stopped leader, a stopped group coordinator

def _leader_of(cluster, topic: str, partition: int) -> str:
    from exactly._client import ClientCore
    from exactly.config import AdminSchema, parse
    core = ClientCore(parse(AdminSchema, {"bootstrap.servers": cluster.bootstrap_servers}))
    try:
        address = core.leader_for(topic, partition)
    finally:
        core.close()
    return next(name for name, svc in cluster.services.items() if svc.address == address)


def test_poll_returns_by_its_timeout_while_a_leader_is_stopped(cluster):
    _topic(cluster.bootstrap_servers, "bounds-poll")
    p = Producer({"bootstrap.servers": cluster.bootstrap_servers})
    for i in range(30):
        p.send("bounds-poll", b"%d" % i, partition=i % 3)
    p.flush(30)
    p.close()
    # request.timeout.ms far above poll's timeout: a poll must not wait for a fetch.
    conf = _consumer_conf(cluster.bootstrap_servers, **{"request.timeout.ms": 10000})
    c = Consumer(conf)
    c.assign([TopicPartition("bounds-poll", i) for i in range(3)])
    loop = asyncio.new_event_loop()
    try:
        ac = loop.run_until_complete(_make_aio_consumer_conf(conf))
        loop.run_until_complete(ac.assign([TopicPartition("bounds-poll", i) for i in range(3)]))
        seen = seen_aio = 0
        deadline = time.monotonic() + 20
        while (seen < 30 or seen_aio < 30) and time.monotonic() < deadline:
            seen += len(c.poll(0.2))
            seen_aio += len(loop.run_until_complete(ac.poll(0.2)))
        assert seen == seen_aio == 30
        victim = _leader_of(cluster, "bounds-poll", 0)
        cluster.signal(victim, signal.SIGSTOP)
        try:
            stopped_at = time.monotonic()
            while time.monotonic() - stopped_at < 14:  # past request.timeout.ms
                elapsed, exc = _timed(lambda: c.poll(1.0))
                _assert_bounded("Consumer.poll(1.0) (leader stopped)", elapsed, exc, bound_s=1.0)
                elapsed, exc = loop.run_until_complete(_timed_async(lambda: ac.poll(1.0)))
                _assert_bounded("AIOConsumer.poll(1.0) (leader stopped)", elapsed, exc, bound_s=1.0)
        finally:
            cluster.signal(victim, signal.SIGCONT)
        loop.run_until_complete(ac.close())
    finally:
        loop.close()
        c.close(timeout=0)


async def _make_aio_consumer_conf(conf: dict[str, Any]) -> AIOConsumer:
    return AIOConsumer(conf)


def test_asynchronous_commit_never_blocks_with_the_group_coordinator_stopped(cluster):
    _topic(cluster.bootstrap_servers, "bounds-commit", partitions=1)
    tp = TopicPartition("bounds-commit", 0)
    # Bootstrapped from the group coordinator alone: the lookup after the failed commit
    # asks the stopped process itself, as one in five lookups does in a larger cluster.
    c = Consumer(_consumer_conf(cluster.services["group-0"].address, **{"group.id": "bounds-async"}))
    c.commit({tp: OffsetAndMetadata(1)})  # the coordinator is known
    cluster.signal("group-0", signal.SIGSTOP)
    try:
        elapsed, exc = _timed(lambda: c.commit({tp: OffsetAndMetadata(2)}))
        _assert_bounded("commit (group coordinator stopped)", elapsed, exc)
        assert exc is not None
        results: list = []
        for i in range(3):
            elapsed, exc = _timed(lambda: c.commit({tp: OffsetAndMetadata(3 + i)}, asynchronous=True,
                                                   callback=lambda err, offsets: results.append(err)))
            assert exc is None, exc
            assert elapsed < 0.5, f"commit(asynchronous=True) blocked {elapsed:.1f} s"
    finally:
        cluster.signal("group-0", signal.SIGCONT)
    c.close(timeout=10)
