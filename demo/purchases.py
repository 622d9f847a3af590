"""The main job: the purchases pipeline on a dev cluster, with failures injected.

    python -m demo.purchases --dir DIR [--keep] [--replication-factor 1]
        [--txn-coordinators 1] [--group-coordinators 1] [--group-aware] [--aio]
        [--kafka-client confluent] [--postgres]

1. starts a dev cluster (ZooKeeper, 3 partition leaders, coordinators) in DIR;
   --replication-factor sets the replication factor of the internal topics and of
   the demo's topics (min.insync.replicas 2 from 2 up), --txn-coordinators and
   --group-coordinators how many coordinators share the internal topics;
2. loads the Olist order items into topic `purchases` (3 partitions) with an
   idempotent producer;
3. runs the purchases -> invoices + shipments worker (demo.pipeline); midway it
   SIGKILLs the worker inside an open transaction and restarts it with the same
   transactional.id, then SIGKILLs and restarts the transaction coordinator txn-0
   (with several coordinators another one takes its partitions over meanwhile) and,
   with a replication factor above 1, a partition leader;
   With --group-aware two workers share the consumer group, each with one
   group-aware producer (KIP-447 draft); the SIGKILLed one's partitions move to the
   other, and a new worker joins. With --aio the worker is demo.pipeline_aio, the
   same pipeline written with exactly.aio. With --kafka-client confluent the worker is
   demo.pipeline_confluent, written with confluent-kafka (librdkafka) against the
   Kafka protocol listeners;
   With --postgres the pipeline is demo.postgres_purchases instead: invoices go to a
   PostgreSQL table and shipments to Exactly atomically (exactly.postgres), and the
   worker is SIGKILLed at each of the four steps of its transactions;
4. reads both outputs with read_committed and prints a summary; exits 0 only if
   every item produced exactly one invoice and one shipment and the totals match
   (with --kafka-client, a librdkafka read_committed consumer must read exactly what
   the SDK reads).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import signal
import sys
import time
from typing import Iterable

from tqdm import tqdm

from exactly import AdminClient, Consumer, NewTopic, TopicPartition
from exactly_tools.devcluster import DevCluster, replication_props

from .common import (GROUP_ID, INVOICES, PURCHASES, SHIPMENTS, TRANSACTIONAL_ID, Worker, check_outputs,
                     fresh_run_dir, item_key, load_purchases, read_order_items, read_topic, stop_on_signals, take_down,
                     wait_gone)

PARTITIONS = 3


def say(msg: str) -> None:
    print(msg, flush=True)


def committed_total(consumer: Consumer, parts: list[TopicPartition]) -> int:
    return sum(om.offset for om in consumer.committed(parts).values() if om is not None)


def run(run_dir: pathlib.Path, keep: bool, replication_factor: int = 1, txn_coordinators: int = 1,
        group_coordinators: int = 1, group_aware: bool = False, aio: bool = False,
        kafka_client: str | None = None, security: bool = False) -> int:
    worker_module = "demo.pipeline_aio" if aio else "demo.pipeline_confluent" if kafka_client else "demo.pipeline"
    rows = read_order_items()
    expected = {item_key(r): r for r in rows}
    say(f"Starting a dev cluster in {run_dir} (ZooKeeper, 3 partition leaders, {txn_coordinators} transaction "
        f"coordinator(s), {group_coordinators} group coordinator(s), replication factor {replication_factor}) ...")
    fresh_run_dir(run_dir)
    cluster = DevCluster(run_dir, props=replication_props(replication_factor), security=security)
    try:
        cluster.up(partition_leaders=3, txn_coordinators=txn_coordinators, group_coordinators=group_coordinators)
        bootstrap = cluster.bootstrap_servers
        say(f"Cluster serving: bootstrap.servers={bootstrap}, zookeeper={cluster.zookeeper}, "
            f"Kafka protocol: {cluster.kafka_bootstrap_servers}")
        worker_bootstrap = cluster.kafka_bootstrap_servers if kafka_client else bootstrap
        sec = dict(cluster.client_config)  # the admin's TLS settings (empty without --security)
        worker_config = secure_worker(cluster) if security else None
        admin = AdminClient({"bootstrap.servers": bootstrap, **sec})
        configs = {"min.insync.replicas": str(min(2, replication_factor))}
        admin.create_topics([NewTopic(t, PARTITIONS, replication_factor, configs)
                             for t in (PURCHASES, INVOICES, SHIPMENTS)])
        admin.close()
        say(f"Created topics {PURCHASES}, {INVOICES}, {SHIPMENTS} ({PARTITIONS} partitions each, "
            f"replication factor {replication_factor})")

        say(f"Loading {len(rows):,} order items from data/olist/order_items.csv into '{PURCHASES}' ...")
        load_purchases(bootstrap, rows, sec)

        watcher = Consumer({"bootstrap.servers": bootstrap, **sec, "group.id": GROUP_ID, "enable.auto.commit": False})
        parts = [TopicPartition(PURCHASES, p) for p in range(PARTITIONS)]
        total = len(rows)
        hold_after = total // 4
        deadline = time.monotonic() + 600
        if group_aware:
            hold_after = group_hold_point(watcher.end_offsets(parts).values())
            say(f"Running the pipeline with two group-aware workers (one producer each, KIP-447 draft); "
                f"worker-1 will be SIGKILLed inside an open transaction after ~{hold_after:,} items")
            worker = Worker(bootstrap, run_dir, "worker-1", hold_open_after=hold_after,
                            group_aware_id=f"{TRANSACTIONAL_ID}-worker-1", cluster=cluster)
            wait_assigned(worker, deadline)
            others = [Worker(bootstrap, run_dir, "worker-b", group_aware_id=f"{TRANSACTIONAL_ID}-worker-b",
                             cluster=cluster)]
        else:
            say(f"Running the pipeline ({worker_module}); the worker will be SIGKILLed inside an open transaction "
                f"after ~{hold_after:,} items")
            worker = Worker(worker_bootstrap, run_dir, "worker-1", hold_open_after=hold_after, module=worker_module,
                            client_config=worker_config, cluster=cluster)
            others = []
        bar = tqdm(total=total, desc="records copied", unit="rec", file=sys.stdout, mininterval=0.5)
        done = 0

        def progress() -> int:
            nonlocal done
            now = committed_total(watcher, parts)
            bar.update(now - done)
            done = now
            return now

        while worker.status().get("state") != "holding":
            for w in [worker, *others]:
                w.check_alive()
            progress()
            if time.monotonic() > deadline:
                raise RuntimeError("worker did not reach the hold point")
            time.sleep(0.2)
        held = worker.status().get("open_records", 0)
        worker.proc.send_signal(signal.SIGKILL)
        worker.proc.wait()
        if group_aware:
            bar.write(f"SIGKILLed worker-1 (pid {worker.proc.pid}) inside an open transaction ({held} items sent, "
                      "not committed); worker-b takes its partitions over (its init_transactions_for_group aborts "
                      "the open transaction first), then a new worker-2 joins the group")
            worker = Worker(bootstrap, run_dir, "worker-2", group_aware_id=f"{TRANSACTIONAL_ID}-worker-2",
                            cluster=cluster)
        else:
            bar.write(f"SIGKILLed worker pid {worker.proc.pid} inside an open transaction "
                      f"({held} items sent, not committed); restarting it with transactional.id={TRANSACTIONAL_ID}")
            worker = Worker(worker_bootstrap, run_dir, "worker-2", module=worker_module,
                            client_config=worker_config, cluster=cluster)
        coordinator_killed = leader_killed = False
        while progress() < total:
            for w in [worker, *others]:
                w.check_alive()
            if not coordinator_killed and done >= total * 0.6:
                cluster.kill("txn-0")
                if txn_coordinators > 1:
                    bar.write("SIGKILLed the transaction coordinator txn-0; the others take over its "
                              "partitions of __transaction_state when its ZooKeeper session expires")
                    wait_gone(cluster, "txn-0", deadline)
                    bar.write("txn-0's partitions moved; restarting txn-0")
                else:
                    bar.write("SIGKILLed the transaction coordinator txn-0; restarting it")
                cluster.restart("txn-0")
                bar.write(f"txn-0 serving again (pid {cluster.services['txn-0'].pid})")
                coordinator_killed = True
            if replication_factor > 1 and not leader_killed and done >= total * 0.8:
                cluster.kill("pl-1")
                bar.write("SIGKILLed the partition leader pl-1; its partitions are led by other replicas "
                          "once its ZooKeeper session expires")
                wait_gone(cluster, "pl-1", deadline)
                cluster.restart("pl-1")
                bar.write(f"pl-1 serving again (pid {cluster.services['pl-1'].pid}) as a follower")
                leader_killed = True
            if time.monotonic() > deadline:
                raise RuntimeError(f"pipeline stalled at {done:,}/{total:,}")
            time.sleep(0.2)
        bar.close()
        for w in [worker, *others]:
            w.proc.send_signal(signal.SIGTERM)
        for w in [worker, *others]:
            w.proc.wait(timeout=60)
        watcher.close()

        if worker_config is not None:
            refused = worker_refused(bootstrap, worker_config)
            say(f"The worker's principal reading {INVOICES}: "
                f"{'refused (TopicAuthorizationFailedError), as its ACLs say' if refused else 'ALLOWED'}")
            if not refused:
                return 1
        say("Reading the outputs ...")
        return summarize(bootstrap, expected, cluster.kafka_bootstrap_servers if kafka_client else None, sec)
    finally:
        if not keep:
            take_down(cluster)


def group_hold_point(partition_sizes: Iterable[int], max_records: int = 200) -> int:
    """Items after which the group-aware demo holds worker-1 inside an open transaction:
    a quarter of the input, but no more than the smallest partition less two batches of
    `max_records` (demo.pipeline_group's default). worker-1 starts alone and owns every
    partition until worker-b joins, so each partition it keeps after that rebalance is
    copied by worker-1 alone: it always copies at least the smallest partition, and
    holds with a batch of it still to copy, whichever worker the group assigns what."""
    sizes = list(partition_sizes)
    return max(1, min(sum(sizes) // 4, min(sizes) - 2 * max_records))


def wait_assigned(worker: Worker, deadline: float) -> None:
    """Until `worker` (demo.pipeline_group) reports a generation of the group (its
    init_transactions_for_group returned for an assignment); raises RuntimeError if it
    exits or at `deadline` (time.monotonic())."""
    while worker.status().get("generation", -1) < 0 and worker.status().get("state") != "holding":
        worker.check_alive()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{worker.status_file.stem} was assigned no partitions")
        time.sleep(0.2)


def secure_worker(cluster: DevCluster) -> pathlib.Path:
    """A certificate for the pipeline worker (User:pipeline-worker) and only the ACLs
    it needs: Read on purchases and its group, Write on invoices, shipments and its
    transactional.id. Returns the JSON file of its client settings."""
    from exactly import AclBinding
    from exactly_tools.certs import CertificateAuthority
    cert = CertificateAuthority.load(cluster.dir / "certs").issue("pipeline-worker", client=True)
    who = "User:pipeline-worker"
    with AdminClient({"bootstrap.servers": cluster.bootstrap_servers, **cluster.client_config}) as admin:
        admin.create_acls([AclBinding(who, "Topic", PURCHASES, "Read"), AclBinding(who, "Group", GROUP_ID, "Read"),
                           AclBinding(who, "Topic", INVOICES, "Write"), AclBinding(who, "Topic", SHIPMENTS, "Write"),
                           AclBinding(who, "TransactionalId", TRANSACTIONAL_ID, "Write")])
    path = cluster.dir / "pipeline-worker.json"
    path.write_text(json.dumps({"security.protocol": "SSL", "ssl.ca.location": cluster.client_config["ssl.ca.location"],
                                "ssl.certificate.location": str(cert.certificate),
                                "ssl.key.location": str(cert.key)}))
    say(f"Secured: TLS with client certificates and ACLs; the worker is {who} with Read on {PURCHASES} and "
        f"its group, Write on {INVOICES}, {SHIPMENTS} and {TRANSACTIONAL_ID}")
    return path


def worker_refused(bootstrap: str, worker_config: pathlib.Path) -> bool:
    """Whether the worker's principal is refused reading the invoices (it may only
    write them)."""
    from exactly import errors
    conf = {"bootstrap.servers": bootstrap, **json.loads(worker_config.read_text()), "request.timeout.ms": 5000}
    tp = TopicPartition(INVOICES, 0)
    with Consumer(conf) as c:
        c.assign([tp])
        c.seek(tp, 0)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                if c.poll(0.5):
                    return False
            except errors.TopicAuthorizationFailedError:
                return True
    return False


def summarize(bootstrap: str, expected: dict[str, dict], kafka_bootstrap: str | None = None,
              security: dict | None = None) -> int:
    committed = {t: read_topic(bootstrap, t, "read_committed", security=security) for t in (INVOICES, SHIPMENTS)}
    uncommitted = {t: read_topic(bootstrap, t, "read_uncommitted", security=security) for t in (INVOICES, SHIPMENTS)}
    lines, ok = check_outputs(committed, expected)
    if kafka_bootstrap:
        from .common import read_topic_kafka
        for t in (INVOICES, SHIPMENTS):
            theirs = read_topic_kafka(kafka_bootstrap, t, "read_committed")
            same = sorted(theirs) == sorted((r.partition, r.offset, r.key, r.value) for r in committed[t])
            ok &= same
            lines.append(f"librdkafka read_committed consumer, {t}: {len(theirs):,} records, "
                         f"{'identical to' if same else 'DIFFERENT from'} the exactly SDK's")
    aborted = sum(len(uncommitted[t]) - len(committed[t]) for t in (INVOICES, SHIPMENTS))
    lines.insert(3, f"aborted records seen by read_uncommitted: {aborted:,}")
    ok &= aborted > 0
    say("\n=== Summary ===")
    for line in lines:
        say(line)
    say("RESULT: exactly once" if ok else "RESULT: FAILED")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo.purchases", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=pathlib.Path, default=pathlib.Path(".run/demo"))
    parser.add_argument("--keep", action="store_true", help="leave the cluster running afterwards")
    parser.add_argument("--replication-factor", type=int, default=1,
                        help="replication factor of the internal and the demo's topics (default 1)")
    parser.add_argument("--txn-coordinators", type=int, default=1, help="transaction coordinators (default 1)")
    parser.add_argument("--group-coordinators", type=int, default=1, help="group coordinators (default 1)")
    parser.add_argument("--group-aware", action="store_true",
                        help="two workers sharing the group, one group-aware producer each (KIP-447 draft)")
    parser.add_argument("--aio", action="store_true",
                        help="run the workers written with exactly.aio (demo.pipeline_aio)")
    parser.add_argument("--security", action="store_true",
                        help="TLS with client certificates and ACLs; the worker holds only the ACLs it needs")
    parser.add_argument("--kafka-client", choices=["confluent"],
                        help="run the worker written with this Kafka client against the Kafka protocol "
                             "listeners (demo.pipeline_confluent)")
    parser.add_argument("--postgres", action="store_true",
                        help="invoices as rows of a PostgreSQL table, shipments in Exactly, atomically "
                             "(exactly.postgres, demo.postgres_purchases)")
    args = parser.parse_args(argv)
    stop_on_signals()
    if not 1 <= args.replication_factor <= 3:
        parser.error("--replication-factor must be between 1 and 3 (the dev cluster has 3 partition leaders)")
    if args.txn_coordinators < 1 or args.group_coordinators < 1:
        parser.error("at least one coordinator of each kind is needed")
    if args.postgres:
        from .postgres_purchases import run as run_postgres
        return run_postgres(args.dir.resolve(), args.keep, args.replication_factor, say)
    return run(args.dir.resolve(), args.keep, args.replication_factor, args.txn_coordinators,
               args.group_coordinators, args.group_aware, args.aio, args.kafka_client, args.security)


if __name__ == "__main__":
    sys.exit(main())
