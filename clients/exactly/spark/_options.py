"""Options of the `exactly` Spark data source (pure parsing, no I/O, no pyspark).

Options follow Spark's own Kafka source and sink where they apply (`subscribe`,
`topic`, `startingOffsets`, `endingOffsets`, `maxOffsetsPerTrigger`,
`checkpointLocation`), and take Exactly / Kafka client settings by their Kafka
keys (`bootstrap.servers`, `isolation.level`, `transaction.timeout.ms`, ...), with
or without Spark's `kafka.` prefix. Spark hands options over with lower-cased
keys; every lookup here is case-insensitive.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Mapping

from exactly.config import ProducerSchema

EARLIEST = -2
LATEST = -1

READ_COMMITTED = "read_committed"
READ_UNCOMMITTED = "read_uncommitted"

DEFAULT_COMMITS_TOPIC = "_exactly_spark_commits"
DEFAULT_TRANSACTIONAL_ID_PREFIX = "spark-"

# Producer settings a writer passes through to its transactional producers.
PRODUCER_KEYS = ("linger.ms", "batch.size", "compression.type", "request.timeout.ms", "delivery.timeout.ms",
                 "max.block.ms", "buffer.memory", "max.request.size", "retry.backoff.ms", "retry.backoff.max.ms")

_TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
# transaction.timeout.ms unless given: the producer's default, from its schema.
_TRANSACTION_TIMEOUT_MS = ProducerSchema.model_fields["transaction_timeout_ms"].default


class OptionError(ValueError):
    """An invalid or missing option of the `exactly` data source."""


def normalize(options: Mapping[str, Any]) -> dict[str, str]:
    """Lower-cased keys, `kafka.` prefix removed (Spark's Kafka source style),
    values as str. The unprefixed key wins when both are given."""
    out: dict[str, str] = {}
    prefixed: dict[str, str] = {}
    for k, v in options.items():
        if v is None:
            continue
        key = str(k).strip().lower()
        if key.startswith("kafka."):
            prefixed[key[len("kafka."):]] = str(v)
        else:
            out[key] = str(v)
    return {**prefixed, **out}


def bootstrap_servers(opts: Mapping[str, str]) -> str:
    """The `bootstrap.servers` option ("host:port[,host:port]"). Raises OptionError."""
    value = opts.get("bootstrap.servers", "").strip()
    if not value:
        raise OptionError("option 'bootstrap.servers' is required (e.g. 127.0.0.1:9093)")
    return value


def topics(opts: Mapping[str, str]) -> list[str]:
    """Topics to read: `subscribe` (comma-separated) or `topic`. Raises OptionError
    when neither is given, both are, or a name is invalid."""
    sub, one = opts.get("subscribe", "").strip(), opts.get("topic", "").strip()
    if sub and one:
        raise OptionError("give either 'subscribe' or 'topic', not both")
    raw = sub or one
    if not raw:
        raise OptionError("option 'subscribe' (comma-separated topics) or 'topic' is required to read")
    names = [t.strip() for t in raw.split(",") if t.strip()]
    for name in names:
        if not _TOPIC_RE.match(name):
            raise OptionError(f"invalid topic name {name!r}")
    return sorted(set(names))


def isolation_level(opts: Mapping[str, str]) -> str:
    """`isolation.level`: read_committed (default) or read_uncommitted."""
    value = opts.get("isolation.level", READ_COMMITTED).strip().lower()
    if value not in (READ_COMMITTED, READ_UNCOMMITTED):
        raise OptionError(f"isolation.level must be {READ_COMMITTED} or {READ_UNCOMMITTED}, not {value!r}")
    return value


def poll_timeout_ms(opts: Mapping[str, str]) -> int:
    """`pollTimeoutMs` (Spark's `kafkaConsumer.pollTimeoutMs` too): ms a read task may go
    without progress before failing (120000). Raises OptionError."""
    try:
        return int(opts.get("polltimeoutms", opts.get("kafkaconsumer.polltimeoutms", "120000")))
    except ValueError:
        raise OptionError("pollTimeoutMs must be an integer (ms)") from None


@dataclass(frozen=True)
class OffsetSpec:
    """Where to start or end reading: `default` (EARLIEST = -2 or LATEST = -1) for
    every partition, overridden per (topic, partition) by `per_partition` (an
    offset >= 0, or -2 / -1)."""

    default: int
    per_partition: tuple[tuple[tuple[str, int], int], ...] = ()

    def offset_for(self, topic: str, partition: int) -> int:
        for tp, off in self.per_partition:
            if tp == (topic, partition):
                return off
        return self.default

    @property
    def topics(self) -> set[str]:
        return {tp[0] for tp, _ in self.per_partition}


def parse_offsets(value: str | None, default: int, name: str, allow_earliest: bool = True,
                  allow_latest: bool = True) -> OffsetSpec:
    """Parse `startingOffsets` / `endingOffsets` as Spark's Kafka source does:
    "earliest", "latest", or JSON {"topic": {"0": 23, "1": -2}} where -2 means
    earliest and -1 latest. Partitions a JSON form leaves out take `default`.
    Raises OptionError (bad JSON or value; earliest / latest where not allowed,
    e.g. endingOffsets=earliest)."""
    if value is None or not value.strip():
        return OffsetSpec(default)
    text = value.strip()
    if text.lower() in ("earliest", "latest"):
        off = EARLIEST if text.lower() == "earliest" else LATEST
        _check_allowed(off, name, allow_earliest, allow_latest)
        return OffsetSpec(off)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OptionError(f"{name} must be earliest, latest or JSON like "
                          f'{{"topic": {{"0": 23}}}}: {exc}') from None
    if not isinstance(doc, dict):
        raise OptionError(f"{name} JSON must map topic -> {{partition: offset}}")
    pairs = []
    for topic, parts in doc.items():
        if not isinstance(parts, dict):
            raise OptionError(f"{name}: topic {topic!r} must map partition -> offset")
        for p, off in parts.items():
            try:
                partition = int(p)
            except (TypeError, ValueError):
                raise OptionError(f"{name}: partition {p!r} of {topic!r} is not an integer") from None
            if isinstance(off, bool) or not isinstance(off, int) or off < EARLIEST:
                raise OptionError(f"{name}: offset {off!r} of {topic}-{partition} must be an integer >= -2")
            _check_allowed(off, name, allow_earliest, allow_latest)
            pairs.append(((str(topic), partition), off))
    return OffsetSpec(default, tuple(sorted(pairs)))


def _check_allowed(off: int, name: str, allow_earliest: bool, allow_latest: bool) -> None:
    if off == EARLIEST and not allow_earliest:
        raise OptionError(f"{name} cannot be earliest (-2)")
    if off == LATEST and not allow_latest:
        raise OptionError(f"{name} cannot be latest (-1)")


def max_offsets_per_trigger(opts: Mapping[str, str]) -> int | None:
    """`maxOffsetsPerTrigger`: offsets (records) per micro-batch over all
    partitions, None when unset. Raises OptionError unless a positive integer."""
    raw = opts.get("maxoffsetspertrigger")
    if raw is None or not raw.strip():
        return None
    try:
        n = int(raw)
    except ValueError:
        raise OptionError(f"maxOffsetsPerTrigger must be a positive integer, not {raw!r}") from None
    if n < 1:
        raise OptionError(f"maxOffsetsPerTrigger must be a positive integer, not {n}")
    return n


def rate_limit(start: Mapping[tuple[str, int], int], latest: Mapping[tuple[str, int], int],
               limit: int | None) -> dict[tuple[str, int], int]:
    """End offsets of a micro-batch, per (topic, partition) of `latest` (each must be
    in `start` too): `latest`, or, when more than `limit` records (offsets) are
    available, each partition advanced by its share of `limit` in proportion to its
    backlog (rounded down, at least one offset for a partition with a backlog), as
    Spark's Kafka source does. Never below the start offset."""
    backlog = {tp: max(end - start[tp], 0) for tp, end in latest.items()}
    total = sum(backlog.values())
    if limit is None or total <= limit:
        return {tp: max(end, start[tp]) for tp, end in latest.items()}
    out = {}
    for tp in latest:
        share = limit * backlog[tp] / total
        out[tp] = start[tp] + (min(backlog[tp], max(int(share), 1)) if backlog[tp] else 0)
    return out


def transactional_id(prefix: str, query_id: str, partition_id: int, attempt: int) -> str:
    """The transactional.id of one write task: `{prefix}{query_id}-{partition_id}-{attempt}`.
    Spark keeps the query id across restarts from the same checkpoint, so a
    restarted query finds the transactions of its earlier runs by the prefix
    `{prefix}{query_id}-`. Raises OptionError for an empty query id or negative
    numbers."""
    if not query_id:
        raise OptionError("the streaming query id is unknown (not a streaming write?)")
    if partition_id < 0 or attempt < 0:
        raise OptionError(f"invalid partition {partition_id} / attempt {attempt}")
    return f"{query_id_prefix(prefix, query_id)}{partition_id}-{attempt}"


def query_id_prefix(prefix: str, query_id: str) -> str:
    """Prefix of every transactional.id of the query: `{prefix}{query_id}-`."""
    return f"{prefix}{query_id}-"


@dataclass(frozen=True)
class FailTaskHook:
    """Test hook `exactly.test.fail.task` = "BATCH:PARTITION:ROWS": the first attempt
    of write task PARTITION of micro-batch BATCH raises after sending ROWS rows."""

    batch_id: int
    partition_id: int
    rows: int


@dataclass(frozen=True)
class HoldCommitHook:
    """Test hook `exactly.test.hold.commit` = "BATCH:COUNT:PATH": the driver's commit
    of micro-batch BATCH stops after completing COUNT transactions, creates file PATH
    and waits there (to be killed: a driver crash in the middle of a commit)."""

    batch_id: int
    completed: int
    path: str


def fail_task_hook(opts: Mapping[str, str]) -> FailTaskHook | None:
    raw = opts.get("exactly.test.fail.task")
    if not raw:
        return None
    try:
        b, p, r = (int(x) for x in raw.split(":"))
    except ValueError:
        raise OptionError(f"exactly.test.fail.task must be BATCH:PARTITION:ROWS, not {raw!r}") from None
    return FailTaskHook(b, p, r)


def hold_commit_hook(opts: Mapping[str, str]) -> HoldCommitHook | None:
    raw = opts.get("exactly.test.hold.commit")
    if not raw:
        return None
    parts = raw.split(":", 2)
    try:
        return HoldCommitHook(int(parts[0]), int(parts[1]), parts[2])
    except (ValueError, IndexError):
        raise OptionError(f"exactly.test.hold.commit must be BATCH:COUNT:PATH, not {raw!r}") from None


@dataclass(frozen=True)
class WriteOptions:
    """The sink's settings (see docs/spark.md)."""

    bootstrap_servers: str
    topic: str | None
    transactional_id_prefix: str
    transaction_timeout_ms: int
    commits_topic: str
    commits_topic_replication_factor: int
    producer: dict[str, str]
    fail_task: FailTaskHook | None = None
    hold_commit: HoldCommitHook | None = None

    def producer_conf(self, transactional_id: str) -> dict[str, str]:
        return {**self.producer, "bootstrap.servers": self.bootstrap_servers,
                "transactional.id": transactional_id,
                "transaction.timeout.ms": str(self.transaction_timeout_ms)}


def write_options(options: Mapping[str, Any]) -> WriteOptions:
    """Parse the sink options. Raises OptionError."""
    opts = normalize(options)
    topic = opts.get("topic", "").strip() or None
    if topic is not None and not _TOPIC_RE.match(topic):
        raise OptionError(f"invalid topic name {topic!r}")
    commits = opts.get("commits.topic", DEFAULT_COMMITS_TOPIC).strip()
    if not _TOPIC_RE.match(commits) or commits.startswith("__"):
        raise OptionError(f"invalid commits.topic {commits!r}")
    prefix = opts.get("transactional.id.prefix", DEFAULT_TRANSACTIONAL_ID_PREFIX)
    try:
        timeout_ms = int(opts.get("transaction.timeout.ms", _TRANSACTION_TIMEOUT_MS))
        rf = int(opts.get("commits.topic.replication.factor", "1"))
    except ValueError as exc:
        raise OptionError(f"invalid number: {exc}") from None
    if timeout_ms <= 0 or rf <= 0:
        raise OptionError("transaction.timeout.ms and commits.topic.replication.factor must be positive")
    return WriteOptions(
        bootstrap_servers=bootstrap_servers(opts), topic=topic, transactional_id_prefix=prefix,
        transaction_timeout_ms=timeout_ms, commits_topic=commits, commits_topic_replication_factor=rf,
        producer={k: opts[k] for k in PRODUCER_KEYS if k in opts},
        fail_task=fail_task_hook(opts), hold_commit=hold_commit_hook(opts))
