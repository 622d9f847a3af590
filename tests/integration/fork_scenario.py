"""A parent process with open SDK clients (sync and asyncio) forks children that each
build their own Producer and Consumer and complete a transaction: run by
test_fork.py in a fresh interpreter, so that a hang fails the test, not pytest.

    python fork_scenario.py BOOTSTRAP TOPIC CHILDREN POOL_CHILDREN BUSY

Prints one JSON line: {"ok": [k, ...], "failed": {k: why}, "parent_calls": n}.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import multiprocessing
import sys
import threading
import time

import exactly
from exactly import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from exactly.aio import AIOProducer

CHILD_TIMEOUT_S = 60.0


def child_work(bootstrap: str, topic: str, k: int, use_aio: bool) -> int:
    """In the forked child: a transaction with record `child-k`, then a read_committed
    consumer of its partition that must see it. Returns k."""
    value = f"child-{k}".encode()
    conf = {"bootstrap.servers": bootstrap, "transactional.id": f"fork-child-{k}",
            "max.block.ms": 20000, "request.timeout.ms": 10000}
    if use_aio:
        async def _produce() -> None:
            p = AIOProducer(conf)
            await p.init_transactions()
            p.begin_transaction()
            await p.send(topic, value, partition=k % 3)
            await p.commit_transaction()
            await p.close()
        asyncio.run(_produce())
    else:
        p = Producer(conf)
        p.init_transactions()
        with p.transaction():
            p.send(topic, value, partition=k % 3)
        p.close()
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"fork-child-{k}",
                  "isolation.level": "read_committed", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.assign([TopicPartition(topic, k % 3)])
    deadline = time.monotonic() + 20
    try:
        while time.monotonic() < deadline:
            if any(r.value == value for r in c.poll(0.5)):
                return k
        raise AssertionError(f"child {k} did not read its committed record back")
    finally:
        c.close()


def _child_main(bootstrap: str, topic: str, k: int, use_aio: bool) -> None:
    child_work(bootstrap, topic, k, use_aio)


def main() -> None:
    bootstrap, topic = sys.argv[1], sys.argv[2]
    children, pool_children, busy = int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "busy"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 3)])

    # The parent's own clients, open for the whole run: a sync transactional producer,
    # a sync consumer, and an asyncio producer on a loop in another thread.
    parent = Producer({"bootstrap.servers": bootstrap, "transactional.id": "fork-parent"})
    parent.init_transactions()
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "fork-parent",
                         "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
    consumer.subscribe([topic])
    consumer.poll(0.5)
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    async def _aio_open() -> AIOProducer:
        p = AIOProducer({"bootstrap.servers": bootstrap})
        await p.send(topic, b"parent-aio", partition=0)
        return p
    aio_parent = asyncio.run_coroutine_threadsafe(_aio_open(), loop).result(30)

    stop = threading.Event()
    calls = [0]

    def _sync_load() -> None:  # transactions and polls in flight while the children fork
        while not stop.is_set():
            with parent.transaction():
                parent.send(topic, b"parent")
            consumer.poll(0.05)
            calls[0] += 1

    async def _aio_load() -> None:
        while not stop.is_set():
            await aio_parent.send(topic, b"parent-aio")
            calls[0] += 1

    loads = []
    if busy:
        loads.append(threading.Thread(target=_sync_load, daemon=True))
        loads[0].start()
        aio_load = asyncio.run_coroutine_threadsafe(_aio_load(), loop)
        while calls[0] < 5:
            time.sleep(0.01)

    ok: list[int] = []
    failed: dict[int, str] = {}
    for k in range(children):  # multiprocessing's default start method (fork on Linux)
        proc = multiprocessing.Process(target=_child_main, args=(bootstrap, topic, k, k % 2 == 1))
        proc.start()
        proc.join(CHILD_TIMEOUT_S)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
            failed[k] = f"hung for {CHILD_TIMEOUT_S} s"
            break
        if proc.exitcode != 0:
            failed[k] = f"exit code {proc.exitcode}"
            break
        ok.append(k)
    if not failed and pool_children:
        with concurrent.futures.ProcessPoolExecutor(max_workers=2) as pool:
            futs = {pool.submit(child_work, bootstrap, topic, k, False): k
                    for k in range(children, children + pool_children)}
            for fut, k in futs.items():
                try:
                    ok.append(fut.result(timeout=CHILD_TIMEOUT_S))
                except Exception as exc:  # noqa: BLE001 - reported
                    failed[k] = repr(exc)
    stop.set()
    for t in loads:
        t.join(30)
    if busy:
        aio_load.result(30)
    asyncio.run_coroutine_threadsafe(aio_parent.close(), loop).result(30)
    parent.close()
    consumer.close()
    admin.close()
    print(json.dumps({"ok": ok, "failed": failed, "parent_calls": calls[0]}), flush=True)


if __name__ == "__main__":
    assert multiprocessing.get_start_method() == "fork", multiprocessing.get_start_method()
    main()
