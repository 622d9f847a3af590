"""The `exactly` PySpark data source (Python Data Source API, pyspark >= 4.0).

    from exactly.spark import ExactlyDataSource
    spark.dataSource.register(ExactlyDataSource)
    df = spark.read.format("exactly").option("bootstrap.servers", bootstrap).option("subscribe", "t").load()

Read (batch and streaming): columns `topic string, partition int, offset long,
key binary, value binary, timestamp timestamp, headers array<struct<key:string,
value:binary>>`, one Spark partition per topic partition. Under read_committed
(the default) a range never goes past the LSO, so it is stable: a micro-batch
replayed from its start and end offsets yields the same rows.

Streaming write, exactly once: each write task sends its rows inside its own
transaction (transactional.id `{prefix}{query id}-{partition}-{attempt}`), adds a
task record to the commits topic in the same transaction, seals it with
`Producer.prepare_transaction()` and returns (transactional.id, PID, epoch) in its
commit message. The driver's `commit(messages, batch_id)` first resolves the
query's transactions left open by a crashed driver or a failed attempt (roll
forward those listed in a decision, abort the others), then, unless `batch_id`
was committed before (a replay after a driver restart: the replay is aborted),
appends its decision to the commits topic and completes every transaction with
`exactly.complete_transaction`. `abort(messages, batch_id)` aborts them (or rolls
them forward when a decision lists them). See `_commit_log` for the records.

Options: docs/spark.md; parsing in `_options`.
"""
from __future__ import annotations

import datetime as _dt
import logging
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

from pyspark import TaskContext
from pyspark.sql.datasource import (DataSource, DataSourceReader, DataSourceStreamReader, DataSourceStreamWriter,
                                    InputPartition, WriterCommitMessage)
from pyspark.sql.types import StructType

from exactly import Producer

from . import _io
from ._commit_log import Decision, TaskRecord, TxnRef, already_committed, recovery_plan
from ._options import (EARLIEST, LATEST, OptionError, OffsetSpec, bootstrap_servers, isolation_level,
                       max_offsets_per_trigger, normalize, parse_offsets, poll_timeout_ms, query_id_prefix, rate_limit,
                       topics, transactional_id, write_options)

try:  # pyspark >= 4.2: admission control and Trigger.AvailableNow for Python sources
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow
except ImportError:  # pragma: no cover - older pyspark 4.x
    ReadAllAvailable = ReadMaxRows = None

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass

log = logging.getLogger(__name__)

SCHEMA = ("topic string, partition int, offset long, key binary, value binary, timestamp timestamp, "
          "headers array<struct<key:string,value:binary>>")

_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)


class ExactlyDataSource(DataSource):
    """The `exactly` data source: batch read, streaming read, streaming write
    (exactly once). Register it with `spark.dataSource.register(ExactlyDataSource)`."""

    @classmethod
    def name(cls) -> str:
        return "exactly"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> "ExactlyBatchReader":
        return ExactlyBatchReader(self.options)

    def streamReader(self, schema: StructType) -> "ExactlyStreamReader":
        return ExactlyStreamReader(self.options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> "ExactlyStreamWriter":
        return ExactlyStreamWriter(self.options, schema)


# ---------------------------------------------------------------- reading

@dataclass(frozen=True)
class OffsetRange(InputPartition):
    """One Spark partition: offsets [start, end) of one topic partition."""

    topic: str
    partition: int
    start: int
    end: int


@dataclass(frozen=True)
class _ReadConf:
    bootstrap: str
    topics: tuple[str, ...]
    isolation: str
    poll_timeout_s: float

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> "_ReadConf":
        opts = normalize(options)
        return cls(bootstrap_servers(opts), tuple(topics(opts)), isolation_level(opts), poll_timeout_ms(opts) / 1000.0)


def _read(conf: _ReadConf, part: OffsetRange) -> Iterator[tuple]:
    for r in _io.read_range(conf.bootstrap, part.topic, part.partition, part.start, part.end, conf.isolation,
                            conf.poll_timeout_s):
        yield (r.topic, r.partition, r.offset, r.key, r.value,
               _EPOCH + _dt.timedelta(milliseconds=r.timestamp), [(k, v) for k, v in r.headers])


def _resolve(conf: _ReadConf, tps: Sequence[tuple[str, int]], spec: OffsetSpec) -> dict[tuple[str, int], int]:
    """Concrete offsets of `spec` for `tps` (earliest / latest looked up)."""
    unknown = spec.topics - set(conf.topics)
    if unknown:
        raise OptionError(f"offsets given for topics that are not read: {sorted(unknown)}")
    wanted = {tp: spec.offset_for(*tp) for tp in tps}
    out = {tp: off for tp, off in wanted.items() if off >= 0}
    for which in (EARLIEST, LATEST):
        todo = [tp for tp, off in wanted.items() if off == which]
        out.update(_io.log_offsets(conf.bootstrap, todo, which, conf.isolation))
    return out


def _to_offset(offsets: Mapping[tuple[str, int], int]) -> dict:
    """Spark offset (JSON-able dict): {"topic": {"partition": offset}} as Spark's Kafka source."""
    out: dict[str, dict[str, int]] = {}
    for (t, p), off in sorted(offsets.items()):
        out.setdefault(t, {})[str(p)] = int(off)
    return out


def _from_offset(offset: Mapping | None) -> dict[tuple[str, int], int]:
    return {(t, int(p)): int(off) for t, parts in (offset or {}).items() for p, off in parts.items()}


class ExactlyBatchReader(DataSourceReader):
    """Batch read of `subscribe` / `topic` from `startingOffsets` (default earliest)
    to `endingOffsets` (default latest: the LSO under read_committed, the high
    watermark under read_uncommitted). Raises OptionError for bad options,
    errors.UnknownTopicOrPartitionError for an unknown topic."""

    def __init__(self, options: Mapping[str, Any]):
        opts = normalize(options)
        self.conf = _ReadConf.of(opts)
        self.starting = parse_offsets(opts.get("startingoffsets"), EARLIEST, "startingOffsets")
        self.ending = parse_offsets(opts.get("endingoffsets"), LATEST, "endingOffsets", allow_earliest=False)

    def partitions(self) -> list[OffsetRange]:
        tps = _io.partitions_of(self.conf.bootstrap, self.conf.topics)
        start = _resolve(self.conf, tps, self.starting)
        end = _resolve(self.conf, tps, self.ending)
        return [OffsetRange(t, p, start[(t, p)], max(end[(t, p)], start[(t, p)])) for t, p in tps]

    def read(self, partition: OffsetRange) -> Iterator[tuple]:
        return _read(self.conf, partition)


class ExactlyStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Streaming read. The Spark offset is {"topic": {"partition": next offset}};
    `startingOffsets` (default latest) applies to a new query only, a restarted one
    continues from its checkpoint. A micro-batch ends at the LSO under
    read_committed (the high watermark under read_uncommitted), at most
    `maxOffsetsPerTrigger` offsets after its start when set. Partitions added to a
    topic later are read from offset 0."""

    def __init__(self, options: Mapping[str, Any]):
        opts = normalize(options)
        self.conf = _ReadConf.of(opts)
        self.starting = parse_offsets(opts.get("startingoffsets"), LATEST, "startingOffsets")
        self.max_offsets = max_offsets_per_trigger(opts)
        self._target: dict[tuple[str, int], int] | None = None

    def initialOffset(self) -> dict:
        tps = _io.partitions_of(self.conf.bootstrap, self.conf.topics)
        return _to_offset(_resolve(self.conf, tps, self.starting))

    def getDefaultReadLimit(self):
        if self.max_offsets is not None and ReadMaxRows is not None:
            return ReadMaxRows(self.max_offsets)
        return ReadAllAvailable() if ReadAllAvailable is not None else None

    def prepareForTriggerAvailableNow(self) -> None:
        tps = _io.partitions_of(self.conf.bootstrap, self.conf.topics)
        self._target = _io.log_offsets(self.conf.bootstrap, tps, LATEST, self.conf.isolation)

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        tps = _io.partitions_of(self.conf.bootstrap, self.conf.topics)
        latest = _io.log_offsets(self.conf.bootstrap, tps, LATEST, self.conf.isolation)
        if self._target is not None:
            latest = {tp: min(off, self._target.get(tp, 0)) for tp, off in latest.items()}
        if start is None:
            return _to_offset(latest)
        begin = {tp: 0 for tp in latest}
        begin.update(_from_offset(start))
        max_rows = getattr(limit, "max_rows", None)
        if max_rows is None and limit is None:
            max_rows = self.max_offsets
        latest = {tp: max(off, begin[tp]) for tp, off in latest.items()}
        return _to_offset(rate_limit(begin, latest, max_rows))

    def partitions(self, start: dict, end: dict) -> list[OffsetRange]:
        begin = _from_offset(start)
        return [OffsetRange(t, p, begin.get((t, p), 0), off) for (t, p), off in sorted(_from_offset(end).items())
                if off > begin.get((t, p), 0)]

    def read(self, partition: OffsetRange) -> Iterator[tuple]:
        return _read(self.conf, partition)

    def commit(self, end: dict) -> None:
        """Nothing to do: offsets live in Spark's checkpoint."""


# ---------------------------------------------------------------- streaming write

@dataclass(frozen=True)
class ExactlyCommitMessage(WriterCommitMessage):
    """What a write task hands to the driver: its prepared transaction
    (transactional.id, producer id, epoch) and where it belongs."""

    transactional_id: str
    producer_id: int
    epoch: int
    query_id: str
    batch_id: int
    write_id: str
    partition_id: int
    attempt: int
    rows: int

    @property
    def txn(self) -> TxnRef:
        return (self.transactional_id, self.producer_id, self.epoch)


class InjectedTaskFailure(RuntimeError):
    """Raised by the `exactly.test.fail.task` hook."""


def _as_bytes(v: Any, what: str) -> bytes | None:
    if v is None or isinstance(v, bytes):
        return v
    if isinstance(v, (bytearray, memoryview)):
        return bytes(v)
    if isinstance(v, str):
        return v.encode("utf-8")
    raise TypeError(f"column {what} must be binary or string, not {type(v).__name__}")


def _headers(v: Any) -> list[tuple[str, bytes | None]]:
    if not v:
        return []
    items = v.items() if isinstance(v, Mapping) else v
    out = []
    for h in items:
        k, val = (h["key"], h["value"]) if hasattr(h, "asDict") or isinstance(h, Mapping) else h
        out.append((str(k), _as_bytes(val, "headers.value")))
    return out


class ExactlyStreamWriter(DataSourceStreamWriter):
    """Exactly-once streaming sink. Input columns (as Spark's Kafka sink): `value`
    (binary or string, required), `key` (binary or string), `topic` (string; else
    the `topic` option), `partition` (int; else the key's hash), `headers`
    (array<struct<key:string,value:binary>>). Raises OptionError at query start for
    bad options or a missing `value` / topic."""

    def __init__(self, options: Mapping[str, Any], schema: StructType):
        self.conf = write_options(options)
        # Column names are case-insensitive, as in Spark: lower-cased name -> actual name.
        self.fields = {f.lower(): f for f in schema.fieldNames()}
        if "value" not in self.fields:
            raise OptionError("the exactly sink needs a 'value' column")
        if "topic" not in self.fields and self.conf.topic is None:
            raise OptionError("the exactly sink needs a 'topic' column or the 'topic' option")
        # One write id per planning of a micro-batch: a replay gets a new one.
        self.write_id = uuid.uuid4().hex[:12]
        _io.ensure_topic(self.conf.bootstrap_servers, self.conf.commits_topic,
                         self.conf.commits_topic_replication_factor)

    # ------------------------------------------------------------ tasks
    def write(self, iterator: Iterator) -> ExactlyCommitMessage:
        """One task: send every row in one transaction and prepare it. Raises the
        producer's errors (the transaction is then aborted and Spark retries the task)."""
        ctx = TaskContext.get()
        if ctx is None:
            raise RuntimeError("ExactlyStreamWriter.write runs inside a Spark task")
        conf = self.conf
        query_id = ctx.getLocalProperty("sql.streaming.queryId") or ""
        batch_id = int(ctx.getLocalProperty("streaming.sql.batchId") or -1)
        partition_id, attempt = ctx.partitionId(), ctx.attemptNumber()
        tid = transactional_id(conf.transactional_id_prefix, query_id, partition_id, attempt)
        commits_partition = _io.commits_partition(conf.bootstrap_servers, conf.commits_topic, query_id)
        self._resolve_left_open(tid, query_id, commits_partition)
        producer = Producer(conf.producer_conf(tid))
        try:
            producer.init_transactions()
            producer.begin_transaction()
            rows = self._send_rows(producer, iterator, batch_id, partition_id, attempt)
            key, value, headers = TaskRecord(query_id, batch_id, self.write_id, tid, partition_id, attempt,
                                             rows).encode()
            producer.send(conf.commits_topic, value, key=key, partition=commits_partition, headers=headers)
            prepared = producer.prepare_transaction()
        except BaseException:
            try:
                producer.abort_transaction(30)
            except Exception:  # noqa: BLE001 - the original error matters; the driver aborts leftovers
                log.warning("aborting the transaction of %s failed", tid, exc_info=True)
            raise
        finally:
            producer.close()
        return ExactlyCommitMessage(tid, prepared.producer_id, prepared.epoch, query_id, batch_id, self.write_id,
                                    partition_id, attempt, rows)

    def _send_rows(self, producer: Producer, iterator: Iterator, batch_id: int, partition_id: int,
                   attempt: int) -> int:
        default_topic = self.conf.topic
        value_col = self.fields["value"]
        key_col, topic_col, partition_col, headers_col = (self.fields.get(n) for n in
                                                          ("key", "topic", "partition", "headers"))
        hook = self.conf.fail_task
        fail_at = hook.rows if hook and attempt == 0 and (hook.batch_id, hook.partition_id) == (
            batch_id, partition_id) else None
        rows = 0
        for row in iterator:
            topic = (row[topic_col] if topic_col else None) or default_topic
            if topic is None:
                raise ValueError("a row has no topic and the 'topic' option is not set")
            producer.send(topic, _as_bytes(row[value_col], "value"),
                          key=_as_bytes(row[key_col], "key") if key_col else None,
                          partition=row[partition_col] if partition_col else None,
                          headers=_headers(row[headers_col]) if headers_col else None)
            rows += 1
            if rows == fail_at:
                producer.flush()
                raise InjectedTaskFailure(f"exactly.test.fail.task: attempt 0 of task {partition_id} of "
                                          f"micro-batch {batch_id} fails after {rows} rows")
        return rows

    def _resolve_left_open(self, tid: str, query_id: str, commits_partition: int) -> None:
        """A transaction of this transactional.id left open by a crashed driver would be
        aborted by init_transactions(): decide it first, as the driver's recovery does."""
        conf = self.conf
        txn = _io.ongoing_transaction(conf.bootstrap_servers, tid)
        if txn is None:
            return
        state = _io.scan_commit_log(conf.bootstrap_servers, conf.commits_topic, commits_partition)
        for t, commit in recovery_plan(state, query_id, [txn]):
            log.warning("%s transaction %s left open by an earlier run", "committing" if commit else "aborting", t)
            _io.complete(conf.bootstrap_servers, t, commit)

    # ------------------------------------------------------------ driver
    def commit(self, messages: list[ExactlyCommitMessage | None], batchId: int) -> None:
        """Complete micro-batch `batchId`: resolve the query's leftovers, then commit
        every task's transaction, or abort them when the micro-batch was committed
        before (a replay after a driver restart). Raises the SDK's errors (e.g.
        errors.ProducerFencedError when a decided transaction was aborted meanwhile,
        by a new producer of its transactional.id or an operator's abort-prepared)."""
        msgs = [m for m in messages if m is not None]
        if not msgs:
            return
        conf = self.conf
        bootstrap, query_id = conf.bootstrap_servers, msgs[0].query_id
        partition = _io.commits_partition(bootstrap, conf.commits_topic, query_id)
        state = _io.scan_commit_log(bootstrap, conf.commits_topic, partition)
        keep = [m.txn for m in msgs]
        ongoing = _io.ongoing_transactions(bootstrap, query_id_prefix(conf.transactional_id_prefix, query_id))
        for txn, commit in recovery_plan(state, query_id, ongoing, keep):
            log.warning("%s transaction %s left open by an earlier run or attempt",
                        "committing" if commit else "aborting", txn)
            _io.complete(bootstrap, txn, commit)
        lost = state.lost(query_id)
        if lost:
            raise RuntimeError(f"transactions {lost} of micro-batch {state.decided_batch[query_id]} of query "
                               f"{query_id} were decided committed but ended aborted (aborted by an operator "
                               "or another producer while the driver was down?); their rows are lost")
        if already_committed(state, query_id, batchId):
            log.warning("micro-batch %d of query %s was committed before; aborting its replay (%d transactions)",
                        batchId, query_id, len(msgs))
            for m in msgs:
                _io.complete(bootstrap, m.txn, False)
            return
        _io.write_decision(bootstrap, conf.commits_topic, partition,
                           Decision(query_id, batchId, msgs[0].write_id, tuple(sorted(keep))))
        hold = conf.hold_commit
        for i, m in enumerate(sorted(msgs, key=lambda m: m.partition_id)):
            _io.complete(bootstrap, m.txn, True)
            if hold is not None and hold.batch_id == batchId and hold.completed == i + 1:
                _hold(hold.path)

    def abort(self, messages: list[ExactlyCommitMessage | None], batchId: int) -> None:
        """Spark gave up micro-batch `batchId`: abort the transactions of its tasks
        (rolled forward instead if a decision lists them: their micro-batch is
        committed)."""
        msgs = [m for m in messages if m is not None]
        if not msgs:
            return
        conf = self.conf
        query_id = msgs[0].query_id
        partition = _io.commits_partition(conf.bootstrap_servers, conf.commits_topic, query_id)
        state = _io.scan_commit_log(conf.bootstrap_servers, conf.commits_topic, partition)
        for m in msgs:
            _io.complete(conf.bootstrap_servers, m.txn, state.is_decided(query_id, m.txn))


def _hold(path: str) -> None:
    with open(path, "w") as f:
        f.write(str(os.getpid()))
    while True:  # until the driver is killed
        time.sleep(1)


__all__ = ["ExactlyDataSource", "ExactlyBatchReader", "ExactlyStreamReader", "ExactlyStreamWriter",
           "ExactlyCommitMessage", "OffsetRange", "InjectedTaskFailure", "SCHEMA"]
