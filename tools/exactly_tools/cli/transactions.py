"""`exactly transactions`: list, describe, describe-producers, find-hanging, abort
(kafka-transactions, KIP-664), and commit-prepared / abort-prepared, the operator's
decision of a prepared transaction (KIP-939), which no coordinator takes by itself."""
from __future__ import annotations

import time

import click

from exactly import PreparedTxnState, TopicPartition, decide_prepared_transaction, errors

from .common import admin_client, connection_options, emit, options, print_table


@click.group()
def transactions() -> None:
    """Inspect transactions and producers; find and abort hanging transactions (KIP-664);
    commit or abort a prepared transaction (KIP-939)."""


def _age(start_ms: int, now_ms: int) -> int | None:
    return None if start_ms < 0 else max(now_ms - start_ms, 0)


def _prepared_fields(t, now: int) -> dict:
    """prepared_time_ms, prepared_age_ms and prepared_state (the PreparedTxnState
    string a commit needs) of a listed or described transaction; None when it is not
    prepared (state PrepareTxn)."""
    state = t.prepared_state
    return {"prepared_time_ms": t.prepared_time_ms if state else None,
            "prepared_age_ms": _age(t.prepared_time_ms, now) if state else None,
            "prepared_state": state.serialize() if state else None}


@transactions.command("list")
@click.option("--state", "states", multiple=True, metavar="STATE",
              help="Only transactions in this state (Ongoing, PrepareTxn, PrepareCommit, Empty, ...; repeatable).")
@click.option("--producer-id", "producer_ids", multiple=True, type=int, metavar="PID", help="Only this PID (repeatable).")
@click.option("--duration-ms", type=click.IntRange(min=0), default=0,
              help="Only transactions running at least this many ms (KIP-994).")
@connection_options
def list_transactions(states: tuple[str, ...], producer_ids: tuple[int, ...], duration_ms: int) -> None:
    """Transactional ids every transaction coordinator knows, with state and age; a
    prepared transaction (state PrepareTxn) with how long it has waited for its
    decision and its state string (PreparedTxnState)."""
    now = int(time.time() * 1000)
    with admin_client() as admin:
        found = admin.list_transactions(states, producer_ids, duration_ms)
    data = [{"transactional_id": t.transactional_id, "producer_id": t.producer_id, "producer_epoch": t.producer_epoch,
             "state": t.state, "transaction_start_time_ms": t.transaction_start_time_ms,
             "duration_ms": _age(t.transaction_start_time_ms, now) if t.state != "Empty" else None,
             **_prepared_fields(t, now)} for t in found]
    emit(data, lambda: print_table(
        ["TRANSACTIONAL-ID", "PRODUCER-ID", "EPOCH", "STATE", "DURATION-MS", "PREPARED-AGE-MS", "PREPARED-STATE"],
        [(d["transactional_id"], d["producer_id"], d["producer_epoch"], d["state"], d["duration_ms"],
          d["prepared_age_ms"], d["prepared_state"] or "-") for d in data],
        empty="(no transactions)"))


@transactions.command("describe")
@click.option("--transactional-id", "tids", multiple=True, required=True, metavar="ID", help="Repeatable.")
@connection_options
def describe(tids: tuple[str, ...]) -> None:
    """State, producer id and epoch, timeout, start time and partitions of transactions;
    for a prepared one (state PrepareTxn) its prepare time, how long it has waited for
    its decision and its state string (PreparedTxnState)."""
    now = int(time.time() * 1000)
    with admin_client() as admin:
        found = admin.describe_transactions(list(tids))
    data = [{"transactional_id": d.transactional_id, "state": d.state, "producer_id": d.producer_id,
             "producer_epoch": d.producer_epoch, "transaction_timeout_ms": d.transaction_timeout_ms,
             "transaction_start_time_ms": d.transaction_start_time_ms,
             "duration_ms": _age(d.transaction_start_time_ms, now),
             "partitions": [f"{t}-{p}" for t, p in d.partitions], **_prepared_fields(d, now)} for d in found.values()]
    emit(data, lambda: print_table(
        ["TRANSACTIONAL-ID", "STATE", "PRODUCER-ID", "EPOCH", "TIMEOUT-MS", "DURATION-MS", "PARTITIONS",
         "PREPARED-TIME-MS", "PREPARED-AGE-MS", "PREPARED-STATE"],
        [(d["transactional_id"], d["state"], d["producer_id"], d["producer_epoch"], d["transaction_timeout_ms"],
          d["duration_ms"], ",".join(d["partitions"]) or "-", d["prepared_time_ms"], d["prepared_age_ms"],
          d["prepared_state"] or "-") for d in data]))


def _partitions(admin, topic: str | None, partition: int | None) -> list[TopicPartition] | None:
    if topic is None:
        if partition is not None:
            raise click.UsageError("--partition needs --topic")
        return None
    parts = sorted(admin.describe_topics([topic])[topic].partitions)
    if partition is not None:
        if partition not in parts:
            raise errors.UnknownTopicOrPartitionError(f"unknown partition {topic}-{partition}")
        parts = [partition]
    return [TopicPartition(topic, p) for p in parts]


def _producer_row(tp: TopicPartition, s, now: int) -> dict:
    return {"topic": tp.topic, "partition": tp.partition, "producer_id": s.producer_id,
            "producer_epoch": s.producer_epoch, "last_sequence": s.last_sequence, "last_timestamp": s.last_timestamp,
            "coordinator_epoch": s.coordinator_epoch,
            "current_transaction_start_offset": s.current_transaction_start_offset,
            "last_write_age_ms": _age(s.last_timestamp, now)}


@transactions.command("describe-producers")
@click.option("--topic", required=True)
@click.option("--partition", type=click.IntRange(min=0), help="One partition (default: all of the topic).")
@connection_options
def describe_producers(topic: str, partition: int | None) -> None:
    """The producer state each partition leader keeps: PID, epoch, last sequence,
    last timestamp, coordinator epoch, start offset of the open transaction."""
    now = int(time.time() * 1000)
    with admin_client() as admin:
        found = admin.describe_producers(_partitions(admin, topic, partition))
    data = [_producer_row(tp, s, now) for tp, states in sorted(found.items()) for s in states]
    emit(data, lambda: print_table(
        ["TOPIC", "PARTITION", "PRODUCER-ID", "EPOCH", "LAST-SEQUENCE", "LAST-TIMESTAMP", "COORDINATOR-EPOCH",
         "CURRENT-TXN-START-OFFSET"],
        [(d["topic"], d["partition"], d["producer_id"], d["producer_epoch"], d["last_sequence"],
          d["last_timestamp"], d["coordinator_epoch"], d["current_transaction_start_offset"]) for d in data],
        empty="(no producers)"))


@transactions.command("find-hanging")
@click.option("--topic", help="Only this topic (default: every topic).")
@click.option("--partition", type=click.IntRange(min=0), help="Only this partition of --topic.")
@click.option("--broker-id", metavar="NODE", help="Only partitions led by this partition leader (node id).")
@click.option("--max-transaction-timeout", type=click.IntRange(min=0), default=15, show_default=True,
              metavar="MINUTES", help="The cluster's transaction.max.timeout.ms, in minutes (Kafka's flag).")
@click.option("--max-transaction-timeout-ms", type=click.IntRange(min=0), metavar="MS",
              help="The same in ms (overrides --max-transaction-timeout).")
@connection_options
def find_hanging(topic: str | None, partition: int | None, broker_id: str | None, max_transaction_timeout: int,
                 max_transaction_timeout_ms: int | None) -> None:
    """Open transactions older than the maximum transaction timeout that their
    transaction coordinator does not know as ongoing (KIP-664): abort them with
    `exactly transactions abort`. Also prepared transactions (KIP-939) waiting for
    their decision longer than their transaction.timeout.ms, which no coordinator
    decides: decide them with `exactly transactions commit-prepared` (the state their
    database holds) or `abort-prepared`, never with `abort`."""
    timeout_ms = max_transaction_timeout_ms if max_transaction_timeout_ms is not None \
        else max_transaction_timeout * 60_000
    with admin_client() as admin:
        found = admin.find_hanging(_partitions(admin, topic, partition), broker=broker_id,
                                   max_transaction_timeout_ms=timeout_ms)
    data = [h._asdict() for h in found]
    emit(data, lambda: print_table(
        ["TOPIC", "PARTITION", "PRODUCER-ID", "EPOCH", "COORDINATOR-EPOCH", "START-OFFSET", "DURATION-MS",
         "TRANSACTIONAL-ID", "PREPARED-STATE", "REASON"],
        [(h.topic or "-", h.partition, h.producer_id, h.producer_epoch, h.coordinator_epoch, h.start_offset,
          h.duration_ms, h.transactional_id, h.prepared_state or "-", h.reason) for h in found],
        empty="(no hanging transactions)"))


@transactions.command("abort")
@click.option("--topic", required=True)
@click.option("--partition", type=click.IntRange(min=0), required=True)
@click.option("--start-offset", type=click.IntRange(min=0),
              help="First offset of the hanging transaction (looks up its producer id and epochs).")
@click.option("--producer-id", type=int, help="With --producer-epoch and --coordinator-epoch instead of --start-offset.")
@click.option("--producer-epoch", type=int)
@click.option("--coordinator-epoch", type=int)
@connection_options
def abort(topic: str, partition: int, start_offset: int | None, producer_id: int | None,
          producer_epoch: int | None, coordinator_epoch: int | None) -> None:
    """Write an ABORT marker for one partition's open transaction: the LSO moves past
    it and read_committed consumers skip its records."""
    with admin_client() as admin:
        if start_offset is not None:
            if producer_id is not None:
                raise click.UsageError("give --start-offset or --producer-id, not both")
            tp = TopicPartition(topic, partition)
            states = admin.describe_producers([tp])[tp]
            match = [s for s in states if s.current_transaction_start_offset == start_offset]
            if not match:
                raise click.ClickException(f"no open transaction starts at offset {start_offset} of {topic}-{partition}")
            s = match[0]
            producer_id, producer_epoch, coordinator_epoch = s.producer_id, s.producer_epoch, s.coordinator_epoch
        elif producer_id is None or producer_epoch is None or coordinator_epoch is None:
            raise click.UsageError("give --start-offset, or --producer-id with --producer-epoch and --coordinator-epoch")
        admin.abort_transaction(topic, partition, producer_id, producer_epoch, coordinator_epoch)
    data = {"topic": topic, "partition": partition, "producer_id": producer_id, "producer_epoch": producer_epoch,
            "coordinator_epoch": coordinator_epoch, "aborted": True}
    emit(data, lambda: click.echo(f"Aborted the transaction of producer {producer_id} (epoch {producer_epoch}) "
                                  f"on {topic}-{partition}."))


def _decide(transactional_id: str, commit: bool, state: str | None) -> None:
    """commit-prepared / abort-prepared: refuse, touching nothing, unless the id's
    transaction is prepared (and, with `state`, is that one), then decide it with
    decide_prepared_transaction (which checks again, after fencing every instance)."""
    if state is not None:
        try:
            state = PreparedTxnState.deserialize(state).serialize()
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--state") from None
    with admin_client() as admin:
        d = admin.describe_transactions([transactional_id])[transactional_id]
    if d.prepared_state is None:
        raise click.ClickException(f"{transactional_id!r} has no prepared transaction (state {d.state}): "
                                   "nothing decided")
    if state is not None and state != d.prepared_state.serialize():
        raise click.ClickException(f"the prepared transaction of {transactional_id!r} is "
                                   f"{d.prepared_state.serialize()!r}, not {state!r}: nothing decided")
    decided = decide_prepared_transaction(transactional_id, options().conf("producer"), commit, state)
    data = {"transactional_id": transactional_id, "prepared_state": decided.serialize(),
            "outcome": "committed" if commit else "aborted"}
    emit(data, lambda: click.echo(f"{'Committed' if commit else 'Aborted'} the prepared transaction "
                                  f"{decided.serialize()} of {transactional_id!r}."))


@transactions.command("commit-prepared")
@click.option("--transactional-id", "tid", required=True, metavar="ID")
@click.option("--state", required=True, metavar="STATE",
              help="The state string (PreparedTxnState, '<producer-id>:<epoch>:<transactional-id>') the "
                   "application's database holds for this transactional.id.")
@connection_options
def commit_prepared(tid: str, state: str) -> None:
    """Commit a prepared transaction (KIP-939) whose application does not come back to
    decide it: only when STATE -- what its database holds, i.e. the database
    committed its side -- is the prepared transaction's; refused otherwise. Fences
    every instance of the transactional.id (a new epoch) first: stop the application
    before."""
    _decide(tid, True, state)


@transactions.command("abort-prepared")
@click.option("--transactional-id", "tid", required=True, metavar="ID")
@click.option("--state", metavar="STATE", help="Abort only this prepared transaction (PreparedTxnState string).")
@connection_options
def abort_prepared(tid: str, state: str | None) -> None:
    """Abort a prepared transaction (KIP-939) whose application does not come back to
    decide it: only right when its database did not commit its side (holds another
    state, or none). Fences every instance of the transactional.id (a new epoch)
    first: stop the application before."""
    _decide(tid, False, state)
