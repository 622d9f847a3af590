"""Recovery costs: a partition leader's restart with and without its producer-state
snapshot, and the transaction coordinator's load time and memory per
transactional id.

The restarted partition (1,000,000 one-record batches, then the same partition
grown to 10,000,000) is written in the leader's data directory while the leader
is stopped, through the partition leader's own `Log.append` and producer state
(`build_partition`), then closed as the leader closes it (flush, producer-state
snapshot into the leader's RocksDB): the files are those the leader itself would
have written, without millions of Produce round trips through one Python process
(an hour on two cores)."""
from __future__ import annotations

import asyncio
import pathlib
import re
import struct
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from crc32c import crc32c as crc32c_fn
from exactly_wire import records
from exactly_wire.v1 import exactly_pb2 as pb, exactly_pb2_grpc as pbg
from exactly_tools.devcluster import DevCluster

from .common import cpu_seconds, create_topic, rss_bytes, wait_until

# Reconnect at once to a service that is coming back, instead of gRPC's backoff of 1 s and more.
FAST_RECONNECT = [("grpc.initial_reconnect_backoff_ms", 20), ("grpc.min_reconnect_backoff_ms", 20),
                  ("grpc.max_reconnect_backoff_ms", 50)]


def _latest_offset(address: str, topic: str, partition: int) -> int | None:
    with grpc.insecure_channel(address, options=FAST_RECONNECT) as ch:
        stub = pbg.PartitionLeaderStub(ch)
        try:
            r = stub.ListOffsets(pb.ListOffsetsRequest(topics=[pb.ListOffsetsTopic(
                name=topic, partitions=[pb.ListOffsetsPartition(partition=partition, timestamp=-1)])]), timeout=1)
        except grpc.RpcError:
            return None
    p = r.topics[0].partitions[0]
    return p.offset if p.error_code == 0 else None


def _respawn(cluster: DevCluster, name: str) -> None:
    """Start a killed service again with its data and ports (DevCluster.restart without
    its health wait, which polls at a coarser grain than what is measured here)."""
    cluster._spawn(cluster.services[name])  # noqa: SLF001 - the dev cluster's own start
    cluster.save()


def _log_tail(path: pathlib.Path, since: int) -> str:
    with open(path, "rb") as f:
        f.seek(since)
        return f.read().decode(errors="replace")


# ---------------------------------------------------------------- partition leader restart

# Byte offsets in a record batch v2 header (records.HEADER_SIZE = 61): the CRC32C, the
# attributes (where the CRC starts) and producer id, epoch, base sequence (contiguous).
_CRC_OFFSET, _ATTR_OFFSET, _PID_OFFSET = 17, 21, 43


def build_partition(data_dir: pathlib.Path, topic: str, batches: int, producers: int) -> dict:
    """Grow `topic`-0 under `data_dir` (the partition leader's data directory, the
    leader stopped) to `batches` one-record idempotent batches from `producers`
    producer ids (round robin: batch i is producer i % producers' sequence
    i // producers), then close it (flush, producer-state snapshot). A partition
    already holding some of them is extended, so the 1M partition becomes the 10M
    one without writing its first million again.

    The first batch is encoded by the client's encoder (`records.encode_batch`); the
    others are that batch with the producer id, sequence, value digits and CRC32C
    rewritten (the same bytes the encoder would produce, a few times faster). Each is
    written the way `Partition.append` writes it after its checks: `Log.append`
    (offset and leader epoch assigned, offset index, segment rolls). The producer
    state is fed (`ProducerStateManager.on_append`) the last 5 batches of each
    producer id, the ones it keeps (the earlier ones leave no trace in it). The
    produce path's CRC and sequence checks are left out: a full-scan restart checks
    every batch's CRC32C and offsets and rebuilds the producer state from the log,
    and the bench checks the producer count it finds. Returns sizes and the build
    time (s)."""
    from services.partition_leader.partition import Partition, PartitionConfig
    from services.partition_leader.snapshot_store import SnapshotStore
    store = SnapshotStore(data_dir / "producer-state")
    p = Partition.open(topic, 0, data_dir, PartitionConfig(), store)
    p.leader_epoch = max(p.epochs.latest_epoch, 0)
    p._note_epoch(p.leader_epoch, p.log_end_offset)  # noqa: SLF001 - as Partition.append does
    now = int(time.time() * 1000)
    base_pid = 10_000_000
    first = p.log_end_offset
    template = bytearray(records.encode_batch([(None, b"v%09d" % 0, (), now)], producer_id=base_pid, producer_epoch=0,
                                              base_sequence=0))
    header = records.parse_header(template)
    size = header.size
    # The batches the producer state keeps, from a whole round (producer ids in order).
    tracked_from = (batches - 5 * producers) // producers * producers
    append, on_append, epoch = p.log.append, p.producers.on_append, p.leader_epoch
    pack_into, crc32c = struct.pack_into, crc32c_fn
    start = time.perf_counter()
    for i in range(first, batches):
        pid, seq = base_pid + i % producers, i // producers
        batch = bytearray(template)
        pack_into(">qhi", batch, _PID_OFFSET, pid, 0, seq)
        batch[size - 10:size - 1] = b"%09d" % i
        crc = crc32c(memoryview(batch)[_ATTR_OFFSET:])
        pack_into(">I", batch, _CRC_OFFSET, crc)
        h = header._replace(crc=crc, producer_id=pid, base_sequence=seq)
        info = append(batch, h, epoch)
        if i >= tracked_from:
            on_append(h._replace(base_offset=info.base_offset))
    p.maybe_advance_high_watermark()
    end = p.log_end_offset
    size = p.log.size_bytes
    p.close()
    store.close()
    return {"batches": batches, "producers": producers, "log_end_offset": end, "log_bytes": size,
            "appended": end - first, "build_s": time.perf_counter() - start}


def _delete_snapshots(data_dir: pathlib.Path, topic: str) -> int:
    from services.partition_leader.snapshot_store import SnapshotStore
    store = SnapshotStore(data_dir / "producer-state")
    try:
        offsets = store.offsets(topic, 0)
        for off in offsets:
            store.delete(topic, 0, off)
    finally:
        store.close()
    return len(offsets)


def _timed_leader_restart(cluster: DevCluster, name: str, topic: str, end: int, timeout_s: float = 300) -> dict:
    """SIGKILL was sent; start the leader and time until ListOffsets answers the log
    end: "seconds" (wall clock) and "cpu_s" (the leader's CPU time by then, steadier
    than the wall clock on a busy machine)."""
    svc = cluster.services[name]
    log_path = cluster.dir / "logs" / f"{name}.log"
    mark = log_path.stat().st_size
    start = time.perf_counter()
    _respawn(cluster, name)
    wait_until(lambda: _latest_offset(svc.address, topic, 0) == end, timeout_s, 0.01, f"{name} to serve {topic}-0")
    elapsed = time.perf_counter() - start
    cpu = cpu_seconds(cluster.services[name].pid)
    m = re.search(rf"opened {re.escape(topic)}-0: .*?(\d+) producers \(snapshot at (\w+)\)", _log_tail(log_path, mark))
    return {"seconds": elapsed, "cpu_s": cpu, "producers_loaded": int(m.group(1)) if m else None,
            "snapshot_at": m.group(2) if m else None}


def _restart_size(cluster: DevCluster, name: str, topic: str, data_dir: pathlib.Path, batches: int, producers: int,
                  reps: int) -> dict:
    """With the leader down: grow the partition to `batches`, start the leader, then
    time `reps` restarts with the snapshot, `reps` with it deleted (full log scan) and
    `Partition.open` alone, in this process, both ways. Leaves the leader down."""
    from services.partition_leader.partition import Partition, PartitionConfig
    from services.partition_leader.snapshot_store import SnapshotStore
    svc = cluster.services[name]
    built = build_partition(data_dir, topic, batches, producers)
    end = built["log_end_offset"]
    _respawn(cluster, name)
    wait_until(lambda: _latest_offset(svc.address, topic, 0) == end, 600, 0.05, f"{name} to serve {topic}-0")
    with_snapshot, scan = [], []
    for _ in range(reps):
        cluster.kill(name)
        with_snapshot.append(_timed_leader_restart(cluster, name, topic, end))
    for _ in range(reps):
        cluster.kill(name)
        _delete_snapshots(data_dir, topic)
        scan.append(_timed_leader_restart(cluster, name, topic, end, timeout_s=900))
    # The load alone (log recovery + producer state), without process start and ZooKeeper.
    cluster.kill(name)
    open_scan, open_snapshot = [], []
    for bucket, keep_snapshot in ((open_scan, False), (open_snapshot, True)):
        for _ in range(reps):
            if not keep_snapshot:
                _delete_snapshots(data_dir, topic)
            store = SnapshotStore(data_dir / "producer-state")
            t0 = time.perf_counter()
            p = Partition.open(topic, 0, data_dir, PartitionConfig(), store, single_replica=False, leader_epoch=-1)
            bucket.append(time.perf_counter() - t0)
            loaded_from = p.snapshot_loaded_from
            if keep_snapshot:
                p.log.close()
            else:
                p.close()  # writes the snapshot the next (snapshot) round loads
            store.close()
            if keep_snapshot and loaded_from != end:
                raise RuntimeError(f"Partition.open did not load the snapshot at {end} (got {loaded_from})")
    return {**built, "restart_snapshot": with_snapshot, "restart_scan": scan,
            "open_snapshot_s": open_snapshot, "open_scan_s": open_scan}


def leader_restart(cluster: DevCluster, sizes: list[int], producers: int, reps: int) -> dict:
    """The restart figures on a 1-leader cluster for each partition size in `sizes`
    (one-record batches, ascending; the partition is grown from one size to the
    next): SIGKILL + start with the producer-state snapshot, then with it deleted
    (full log scan), timed until ListOffsets answers the log end; plus
    `Partition.open` alone, in this process. Returns {"runs": [one dict per size]}."""
    topic = "bench-restart"
    name = "pl-0"
    create_topic(cluster, topic, 1)
    svc = cluster.services[name]
    wait_until(lambda: _latest_offset(svc.address, topic, 0) == 0, 60, 0.05, f"{topic}-0 to be led")
    cluster.stop(name)
    return {"runs": [_restart_size(cluster, name, topic, cluster.dir / name, batches, producers, reps)
                     for batches in sorted(sizes)]}


# ---------------------------------------------------------------- transaction coordinator load

async def _init_ids(address: str, first: int, last: int, concurrency: int) -> int:
    retries = 0
    async with grpc.aio.insecure_channel(address) as ch:
        stub = pbg.TransactionCoordinatorStub(ch)
        ids = iter(range(first, last))

        async def worker() -> None:
            nonlocal retries
            for i in ids:
                for _ in range(1000):
                    r = await stub.InitProducerId(pb.InitProducerIdRequest(
                        transactional_id=f"bench-load-{i:07d}", transaction_timeout_ms=60000), timeout=60)
                    if r.error_code == 0:
                        break
                    retries += 1
                    await asyncio.sleep(0.02)
                else:
                    raise RuntimeError(f"InitProducerId bench-load-{i} kept failing: error {r.error_code}")
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return retries


def _init_ids_process(address: str, first: int, last: int, concurrency: int, out) -> None:
    try:
        out.put(("ok", asyncio.run(_init_ids(address, first, last, concurrency))))
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        out.put(("error", repr(exc)))


def create_transactional_ids(address: str, count: int, processes: int = 2, concurrency: int = 128) -> dict:
    """InitProducerId of `count` new transactional ids through raw gRPC stubs, from
    `processes` worker processes with `concurrency` requests in flight each."""
    from .transactions import worker_context
    ctx = worker_context()
    out = ctx.Queue()
    step = (count + processes - 1) // processes
    procs = [ctx.Process(target=_init_ids_process, args=(address, i * step, min(count, (i + 1) * step),
                                                          concurrency, out), daemon=True)
             for i in range(processes)]
    start = time.perf_counter()
    for proc in procs:
        proc.start()
    answers = [out.get(timeout=3600) for _ in procs]
    elapsed = time.perf_counter() - start
    for proc in procs:
        proc.join(timeout=30)
    errors = [a[1] for a in answers if a[0] == "error"]
    if errors:
        raise RuntimeError(f"creating transactional ids failed: {errors[0]}")
    return {"ids": count, "seconds": elapsed, "ids_per_s": count / elapsed, "retries": sum(a[1] for a in answers)}


def _serving(address: str) -> bool:
    with grpc.insecure_channel(address, options=FAST_RECONNECT) as ch:
        try:
            r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
        except grpc.RpcError:
            return False
    return r.status == health_pb2.HealthCheckResponse.SERVING


_LOADED = re.compile(r"loaded __transaction_state-(\d+) \(coordinator epoch \d+\): (\d+) transactional ids, "
                     r".*? in (\d+) ms")


def coordinator_load(cluster: DevCluster, ids: int, reps: int, settle_s: float = 1.0) -> dict:
    """RSS of the fresh coordinator, `ids` transactional ids created, then per
    repetition: SIGKILL, start, time until every __transaction_state partition is
    loaded (its log lines) and it serves; RSS after loading."""
    name = "txn-0"
    svc = cluster.services[name]
    partitions = int(cluster.props.get("transaction.state.log.num.partitions", 50))
    time.sleep(settle_s)
    rss_before = rss_bytes(svc.pid)
    created = create_transactional_ids(svc.address, ids)
    rss_live = rss_bytes(svc.pid)
    log_path = cluster.dir / "logs" / f"{name}.log"
    rows = []
    for _ in range(reps):
        cluster.kill(name)
        mark = log_path.stat().st_size
        start = time.perf_counter()
        _respawn(cluster, name)
        loaded: dict[int, tuple[int, int]] = {}

        def all_loaded() -> bool:
            for m in _LOADED.finditer(_log_tail(log_path, mark)):
                loaded[int(m.group(1))] = (int(m.group(2)), int(m.group(3)))
            return len(loaded) >= partitions
        wait_until(all_loaded, 600, 0.01, f"{name} to load __transaction_state")
        loaded_s = time.perf_counter() - start
        wait_until(lambda: _serving(svc.address), 120, 0.01, f"{name} to serve")
        serving_s = time.perf_counter() - start
        time.sleep(settle_s)
        rss_after = rss_bytes(cluster.services[name].pid)
        total_ids = sum(v[0] for v in loaded.values())
        rows.append({"loaded_s": loaded_s, "serving_s": serving_s,
                     "logged_load_ms_max": max(v[1] for v in loaded.values()),
                     "logged_load_ms_sum": sum(v[1] for v in loaded.values()),
                     "ids_loaded": total_ids, "rss_after": rss_after,
                     "bytes_per_id": (rss_after - rss_before) / max(ids, 1)})
        if total_ids < ids:
            raise RuntimeError(f"{name} loaded {total_ids} transactional ids, expected at least {ids}")
    return {"creation": created, "rss_before": rss_before, "rss_live_after_creation": rss_live, "restarts": rows}
