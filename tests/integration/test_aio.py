"""exactly.aio against a real cluster (real ZooKeeper, real service processes, real
gRPC): produce/consume round trips, transactions seen by a read_committed
AIOConsumer, `async with producer.transaction()` aborting on an error and closing
on fencing, and a consume-transform-produce worker written with exactly.aio
(demo.pipeline_aio) SIGKILLed inside an open transaction. KIP-98 design document,
"Transactional Producer" and "Consumer"; KIP-447."""
from __future__ import annotations

import asyncio
import json
import pathlib
import signal
import subprocess
import sys
import uuid

import pytest

from exactly import Consumer, NewTopic, OffsetAndMetadata, TopicPartition, errors
from exactly.aio import AIOAdminClient, AIOConsumer, AIOProducer
from waiting import wait_for, wait_for_async

from demo.common import GROUP_ID, INVOICES, PURCHASES, SHIPMENTS, check_outputs, item_key, read_topic

pytestmark = pytest.mark.integration

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def create_topic(bootstrap: str, partitions: int = 3, name: str | None = None) -> str:
    topic = name or _name("t")
    async with AIOAdminClient({"bootstrap.servers": bootstrap}) as admin:
        await admin.create_topics([NewTopic(topic, partitions)], timeout=60)
    return topic


async def read_all(bootstrap: str, topic: str, partitions: int, isolation: str, expected: int) -> list:
    """`expected` records of `topic` from the beginning, read with `isolation`, then
    a check that nothing more is readable up to the end of the log."""
    async with AIOConsumer({"bootstrap.servers": bootstrap, "isolation.level": isolation,
                            "enable.auto.commit": False, "fetch.max.wait.ms": 100}) as c:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        await c.assign(tps)
        c.seek_to_end(tps)
        ends = {tp: await c.position(tp) for tp in tps}
        c.seek_to_beginning(tps)
        out: list = []

        async def _read_to_end() -> bool:
            # The end was taken once; under read_committed the markers of a transaction
            # committed just before may still be on their way (EndTxn answers once the
            # outcome is durable), so the expected records are awaited too.
            out.extend(await c.poll(0.2))
            return len(out) >= expected and all([await c.position(tp) >= ends[tp] for tp in tps])

        await wait_for_async(_read_to_end, 30, f"{topic} read to its end ({len(out)} records so far)")
        assert len(out) == expected, [r.value for r in out]
        return out


def test_produce_consume_round_trip(cluster):
    bootstrap = cluster.bootstrap_servers

    async def main():
        topic = await create_topic(bootstrap, 3)
        async with AIOAdminClient({"bootstrap.servers": bootstrap}) as admin:
            assert (await admin.list_topics())[topic] == [0, 1, 2]
            desc = (await admin.describe_topics([topic]))[topic]
            assert sorted(desc.partitions) == [0, 1, 2] and all(p.leader for p in desc.partitions.values())
        async with AIOProducer({"bootstrap.servers": bootstrap, "linger.ms": 5}) as p:
            metas = [await p.send(topic, f"v{i}", key=f"k{i % 7}") for i in range(20)]
            futures = [p.send_nowait(topic, f"w{i}", key=f"k{i % 7}") for i in range(40)]
            await p.flush(30)
            metas += [f.result() for f in futures]
        assert all(m.offset >= 0 for m in metas)
        by_tp: dict = {}
        for m in metas:
            by_tp.setdefault((m.partition), []).append(m.offset)
        assert all(offs == sorted(offs) and len(set(offs)) == len(offs) for offs in by_tp.values())

        group = _name("g")
        conf = {"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                "enable.auto.commit": False, "fetch.max.wait.ms": 100}
        seen = []
        async with AIOConsumer(conf) as c:
            await c.subscribe([topic])
            async for rec in c:
                seen.append(rec)
                if len(seen) == 60:
                    break
            assert c.assignment() == {TopicPartition(topic, p) for p in range(3)}
            await c.commit()
            committed = await c.committed(sorted(c.assignment()))
            assert sum(om.offset for om in committed.values()) == 60
            gm = c.group_metadata()
            assert gm.group_id == group and gm.generation_id >= 1 and gm.member_id
        assert sorted(r.value for r in seen) == sorted([f"v{i}".encode() for i in range(20)]
                                                       + [f"w{i}".encode() for i in range(40)])
        by_key: dict = {}
        for r in seen:
            by_key.setdefault(r.key, []).append(r.partition)
        assert all(len(set(ps)) == 1 for ps in by_key.values())  # one partition per key

    asyncio.run(main())


def test_transactions_seen_by_read_committed(cluster):
    bootstrap = cluster.bootstrap_servers

    async def main():
        topic = await create_topic(bootstrap, 3)
        p = AIOProducer({"bootstrap.servers": bootstrap, "transactional.id": _name("tx"), "linger.ms": 5})
        try:
            await p.init_transactions(30)
            p.begin_transaction()
            committed = [p.send_nowait(topic, f"c{i}", key=f"k{i}") for i in range(20)]
            await p.commit_transaction(30)
            p.begin_transaction()
            aborted = [p.send_nowait(topic, f"a{i}", key=f"k{i}") for i in range(10)]
            await p.flush(30)
            await p.abort_transaction(30)
            async with p.transaction():
                last = await p.send(topic, "last", partition=1)
        finally:
            await p.close()
        assert all(f.result().offset >= 0 for f in committed) and last.offset >= 0
        assert all(f.done() and f.exception() is None for f in aborted)  # written, then aborted
        got = await read_all(bootstrap, topic, 3, "read_committed", 21)
        assert sorted(r.value for r in got) == sorted([f"c{i}".encode() for i in range(20)] + [b"last"])
        await read_all(bootstrap, topic, 3, "read_uncommitted", 31)

    asyncio.run(main())


def test_send_offsets_to_transaction(cluster):
    bootstrap = cluster.bootstrap_servers

    async def main():
        src, dst = await create_topic(bootstrap, 2), await create_topic(bootstrap, 2)
        async with AIOProducer({"bootstrap.servers": bootstrap}) as p:
            for i in range(10):
                await p.send(src, f"s{i}", partition=i % 2)
        group = _name("g")
        async with AIOConsumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                                "auto.offset.reset": "earliest", "isolation.level": "read_committed"}) as c, \
                AIOProducer({"bootstrap.servers": bootstrap, "transactional.id": _name("tx")}) as p:
            await c.subscribe([src])
            await p.init_transactions(30)
            records: list = []
            await wait_for_async(lambda: _poll_into(c, records, 10), 30, "10 source records")
            async with p.transaction():
                offsets = {}
                for r in records:
                    await p.send(dst, r.value.upper(), key=r.value)
                    offsets[TopicPartition(r.topic, r.partition)] = OffsetAndMetadata(r.offset + 1)
                await p.send_offsets_to_transaction(offsets, c.group_metadata())
            committed = await c.committed([TopicPartition(src, 0), TopicPartition(src, 1)])
            assert {tp.partition: om.offset for tp, om in committed.items()} == {0: 5, 1: 5}
        got = await read_all(bootstrap, dst, 2, "read_committed", 10)
        assert sorted(r.value for r in got) == sorted(f"S{i}".encode() for i in range(10))

    asyncio.run(main())


async def _poll_into(consumer: AIOConsumer, out: list, n: int) -> bool:
    out.extend(await consumer.poll(0.2))
    return len(out) >= n


def test_transaction_context_aborts_on_error_and_closes_when_fenced(cluster):
    bootstrap = cluster.bootstrap_servers

    async def main():
        topic = await create_topic(bootstrap, 1)
        tid = _name("tx")
        p = AIOProducer({"bootstrap.servers": bootstrap, "transactional.id": tid})
        await p.init_transactions(30)
        with pytest.raises(ValueError, match="bad purchase"):
            async with p.transaction():
                await p.send(topic, "doomed-1")
                p.send_nowait(topic, "doomed-2")
                raise ValueError("bad purchase")
        async with p.transaction():  # the abort left the producer usable
            await p.send(topic, "kept")

        # A second instance with the same transactional.id fences the first: fatal,
        # so the block's transaction is not aborted but the producer closed.
        async with AIOProducer({"bootstrap.servers": bootstrap, "transactional.id": tid}) as newer:
            await newer.init_transactions(30)
            with pytest.raises(errors.ProducerFencedError):
                async with p.transaction():
                    await p.send(topic, "zombie")
            with pytest.raises(errors.IllegalStateError, match="closed"):
                await p.send(topic, "after close")
            async with newer.transaction():
                await newer.send(topic, "newer")
        got = await read_all(bootstrap, topic, 1, "read_committed", 2)
        assert [r.value for r in got] == [b"kept", b"newer"]

    asyncio.run(main())


def test_read_committed_consumer_waits_for_the_open_transaction(cluster):
    """An open transaction holds back the LSO: a read_committed AIOConsumer sees a
    non-transactional record written after it only once it commits."""
    bootstrap = cluster.bootstrap_servers

    async def main():
        topic = await create_topic(bootstrap, 1)
        async with AIOProducer({"bootstrap.servers": bootstrap, "transactional.id": _name("tx")}) as txp, \
                AIOProducer({"bootstrap.servers": bootstrap}) as plain, \
                AIOConsumer({"bootstrap.servers": bootstrap, "isolation.level": "read_committed",
                             "enable.auto.commit": False, "fetch.max.wait.ms": 100}) as c:
            await txp.init_transactions(30)
            txp.begin_transaction()
            await txp.send(topic, "in-txn")
            await plain.send(topic, "after")
            tp = TopicPartition(topic, 0)
            await c.assign([tp])
            c.seek(tp, 0)
            assert await c.poll(1.0) == []
            await txp.commit_transaction(30)
            seen: list = []
            await wait_for_async(lambda: _poll_into(c, seen, 2), 30, "both records")
            assert [r.value for r in seen] == [b"in-txn", b"after"]

    asyncio.run(main())


# ---------------------------------------------------------------- consume-transform-produce


def _purchase(i: int) -> dict:
    return {"order_id": f"o{i // 3:05d}", "order_item_id": str(i % 3 + 1), "product_id": f"p{i % 11}",
            "seller_id": f"s{i % 5}", "shipping_limit_date": "2018-01-01 00:00:00",
            "price": f"{10 + i % 17}.{i % 100:02d}", "freight_value": f"{i % 9}.50"}


class _Worker:
    def __init__(self, bootstrap: str, tmp: pathlib.Path, name: str, hold_open_after: int | None = None):
        self.status_file = tmp / f"{name}.status"
        cmd = [sys.executable, "-m", "demo.pipeline_aio", "--bootstrap-servers", bootstrap,
               "--status-file", str(self.status_file), "--max-records", "50"]
        if hold_open_after is not None:
            cmd += ["--hold-open-after", str(hold_open_after)]
        self.log = open(tmp / f"{name}.log", "wb")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT)

    def state(self) -> str | None:
        assert self.proc.poll() is None, f"worker exited with {self.proc.returncode}; see {self.log.name}"
        try:
            return json.loads(self.status_file.read_text()).get("state")
        except (FileNotFoundError, json.JSONDecodeError):
            return None


def test_pipeline_worker_sigkilled_mid_transaction_copies_exactly_once(cluster, tmp_path):
    bootstrap = cluster.bootstrap_servers
    rows = [_purchase(i) for i in range(600)]

    async def setup():
        for t in (PURCHASES, INVOICES, SHIPMENTS):
            await create_topic(bootstrap, 3, name=t)
        async with AIOProducer({"bootstrap.servers": bootstrap, "linger.ms": 10}) as p:
            futures = [p.send_nowait(PURCHASES, json.dumps(r).encode(), key=r["order_id"].encode()) for r in rows]
            await asyncio.gather(*futures)

    asyncio.run(setup())
    first = _Worker(bootstrap, tmp_path, "worker-1", hold_open_after=200)
    second = None
    try:
        wait_for(lambda: first.state() == "holding", 120, "the worker to hold a transaction open")
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(30)
        second = _Worker(bootstrap, tmp_path, "worker-2")
        parts = [TopicPartition(PURCHASES, p) for p in range(3)]
        with Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP_ID, "enable.auto.commit": False}) as watch:
            def _copied() -> bool:
                assert second.proc.poll() is None, f"worker-2 exited; see {second.log.name}"
                return sum(om.offset for om in watch.committed(parts).values() if om is not None) == len(rows)

            wait_for(_copied, 180, "worker-2 to commit the offsets of every purchase")
        second.proc.send_signal(signal.SIGTERM)
        assert second.proc.wait(60) == 0
    finally:
        for w in (first, second):
            if w is not None and w.proc.poll() is None:
                w.proc.kill()
                w.proc.wait()

    committed = {t: read_topic(bootstrap, t, "read_committed") for t in (INVOICES, SHIPMENTS)}
    lines, ok = check_outputs(committed, {item_key(r): r for r in rows})
    assert ok, "\n".join(lines)
    aborted = sum(len(read_topic(bootstrap, t, "read_uncommitted")) - len(committed[t]) for t in (INVOICES, SHIPMENTS))
    assert aborted > 0  # the killed worker's open transaction was written, then aborted
