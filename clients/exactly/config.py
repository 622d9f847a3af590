"""The configuration schemas of the SDK's clients: producer, consumer and admin
client, with Kafka's names and defaults, on the shared machinery of
`exactly_wire.config` (validation, allowed values in words, the tables of
docs/reference/configuration.md).
`parse(ProducerSchema, conf)` raises `errors.ConfigurationError` naming the key,
the value and what is allowed (docs/design.md, "SDK")."""
from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import field_validator

from exactly_wire.config import HIGH, LOW, MEDIUM, Bool, allowed, keys, markdown_table, parse, setting

from exactly_wire.security import SecuritySettings

from .errors import ConfigurationError

INT32_MAX = 2147483647


# ---------------------------------------------------------------- clients

_CLIENT_UNSUPPORTED = {
    "key.serializer": "the SDK takes bytes or str; serialize in the application",
    "value.serializer": "the SDK takes bytes or str; serialize in the application",
    "key.deserializer": "the SDK returns bytes; deserialize in the application",
    "value.deserializer": "the SDK returns bytes; deserialize in the application",
    "interceptor.classes": "Java interceptors have no Python counterpart; wrap send()/poll() instead",
    "metric.reporters": "Java metric reporters have no Python counterpart",
}


class ClientSchema(SecuritySettings):
    """Settings every client (producer, consumer, admin) has."""

    UNSUPPORTED: ClassVar[dict[str, str]] = _CLIENT_UNSUPPORTED
    ERROR: ClassVar[type[ConfigurationError]] = ConfigurationError

    bootstrap_servers: str = setting(
        "bootstrap.servers", ..., "Comma-separated host:port list of any services of the cluster, "
        "used to fetch the first metadata.", HIGH, min_length=1)
    client_id: str = setting("client.id", "", "Name of this client, sent as the gRPC user agent (for logs).", LOW)
    request_timeout_ms: int = setting("request.timeout.ms", 30000, "ms to wait for the answer to one request.",
                                      MEDIUM, ge=1)
    retry_backoff_ms: int = setting("retry.backoff.ms", 100, "ms to wait before the first retry of a failed "
                                    "request; doubles per retry.", LOW, ge=0)
    retry_backoff_max_ms: int = setting("retry.backoff.max.ms", 1000, "Largest ms between retries.", LOW, ge=0)
    metadata_max_age_ms: int = setting("metadata.max.age.ms", 300000, "ms after which metadata is refreshed "
                                       "even without an error.", LOW, ge=0)

    @field_validator("bootstrap_servers")
    @classmethod
    def _host_port_list(cls, value: str) -> str:
        """Every comma-separated entry is host:port (blanks and empty entries dropped)."""
        entries = [s.strip() for s in value.split(",") if s.strip()]
        for addr in entries:
            host, sep, port = addr.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(f"entry {addr!r} is not host:port")
        if not entries:
            raise ValueError("no host:port given")
        return ",".join(entries)

    @property
    def bootstrap_addresses(self) -> list[str]:
        """bootstrap.servers as a list of 'host:port'."""
        return self.bootstrap_servers.split(",")


class ProducerSchema(ClientSchema):
    """Producer settings (KIP-98 design document, "Added Configurations")."""

    ROLE: ClassVar[str] = "producer"
    UNSUPPORTED: ClassVar[dict[str, str]] = {
        **_CLIENT_UNSUPPORTED,
        "partitioner.class": "the partitioner is Kafka's default (murmur2 of the key, sticky without one); "
                             "pass partition= to send() to choose",
        "transaction.two.phase.commit.enable": "use prepare_transaction() / complete_transaction()",
    }

    transactional_id: str | None = setting(
        "transactional.id", None, "Enables transactions; the same id across restarts fences older instances.",
        HIGH, min_length=1)
    enable_idempotence: Bool = setting("enable.idempotence", True, "Producer id and sequences, so retries "
                                       "never duplicate (needs acks=all).", HIGH)
    acks: Literal["all", "-1", "0", "1"] = setting("acks", "all", "Replicas that must confirm a write: 0, 1 or "
                                                   "all (the in-sync replicas).", HIGH)
    linger_ms: float = setting("linger.ms", 5, "ms a non-full batch waits for more records.", MEDIUM, ge=0)
    batch_size: int = setting("batch.size", 16384, "Bytes per partition batch.", MEDIUM, ge=1)
    buffer_memory: int = setting("buffer.memory", 33554432, "Bytes of unsent records before send() blocks.",
                                 MEDIUM, ge=1)
    compression_type: Literal["none", "gzip", "snappy", "lz4", "zstd"] = setting(
        "compression.type", "none", "Codec of the record batches.", HIGH)
    max_request_size: int = setting("max.request.size", 1048576, "Largest record batch in bytes.", MEDIUM, ge=1)
    retries: int = setting("retries", INT32_MAX, "Tries per batch after the first.", LOW, ge=0)
    max_in_flight_requests_per_connection: int = setting(
        "max.in.flight.requests.per.connection", 5, "Batches in flight per partition (1-5 with idempotence).",
        LOW, ge=1)
    delivery_timeout_ms: int = setting("delivery.timeout.ms", 120000, "ms a record may take from send() to "
                                       "its outcome.", MEDIUM, ge=1)
    max_block_ms: int = setting("max.block.ms", 60000, "ms send(), flush() and the transaction calls may block.",
                                MEDIUM, ge=0)
    transaction_timeout_ms: int = setting("transaction.timeout.ms", 60000, "ms after which the coordinator "
                                          "aborts an open transaction.", MEDIUM, ge=1)

    @field_validator("acks", mode="before")
    @classmethod
    def _acks_as_text(cls, value: Any) -> Any:
        return str(value).strip().lower() if isinstance(value, int) and not isinstance(value, bool) else value


class ConsumerSchema(ClientSchema):
    """Consumer settings (KIP-98 design document, "Consumer": isolation.level)."""

    ROLE: ClassVar[str] = "consumer"
    UNSUPPORTED: ClassVar[dict[str, str]] = {
        **_CLIENT_UNSUPPORTED,
        "partition.assignment.strategy": "the group uses the range assignor",
        "enable.partition.eof": "poll() returns an empty list at the end of the partitions",
        "exclude.internal.topics": "internal topics are never returned to consumers",
    }

    group_id: str | None = setting("group.id", None, "Consumer group; needed for subscribe() and commits.",
                                   HIGH, min_length=1)
    group_instance_id: str | None = setting("group.instance.id", None, "Static member id (KIP-345): a member "
                                            "restarted within session.timeout.ms keeps its partitions.", MEDIUM,
                                            min_length=1)
    isolation_level: Literal["read_uncommitted", "read_committed"] = setting(
        "isolation.level", "read_uncommitted", "read_committed returns only committed transactional records, "
        "up to the last stable offset.", HIGH)
    auto_offset_reset: Literal["earliest", "latest", "none"] = setting(
        "auto.offset.reset", "latest", "Where to start without a committed offset, or after "
        "OFFSET_OUT_OF_RANGE.", HIGH)
    enable_auto_commit: Bool = setting("enable.auto.commit", True, "Commit positions every "
                                       "auto.commit.interval.ms from poll().", MEDIUM)
    auto_commit_interval_ms: int = setting("auto.commit.interval.ms", 5000, "ms between automatic commits.",
                                           LOW, ge=0)
    session_timeout_ms: int = setting("session.timeout.ms", 10000, "ms without a heartbeat after which the "
                                      "member is removed from the group.", HIGH, ge=1)
    heartbeat_interval_ms: int = setting("heartbeat.interval.ms", 3000, "ms between heartbeats.", LOW, ge=1)
    max_poll_interval_ms: int = setting("max.poll.interval.ms", 300000, "Largest ms between poll() calls "
                                        "before the member leaves the group (rebalance timeout).", MEDIUM, ge=1)
    max_poll_records: int = setting("max.poll.records", 500, "Largest number of records one poll() returns.",
                                    MEDIUM, ge=1)
    fetch_max_wait_ms: int = setting("fetch.max.wait.ms", 500, "ms a fetch waits for fetch.min.bytes.", LOW,
                                     ge=0)
    fetch_min_bytes: int = setting("fetch.min.bytes", 1, "Bytes a fetch waits for before answering.", LOW, ge=0)
    fetch_max_bytes: int = setting("fetch.max.bytes", 52428800, "Largest bytes per fetch response.", LOW, ge=1)
    max_partition_fetch_bytes: int = setting("max.partition.fetch.bytes", 1048576, "Largest bytes per "
                                             "partition per fetch.", LOW, ge=1)
    check_crcs: Bool = setting("check.crcs", True, "Verify the CRC32C of every fetched batch.", LOW)
    default_api_timeout_ms: int = setting("default.api.timeout.ms", 60000, "ms the blocking calls (committed, "
                                          "offsets lookups, commit) wait by default.", MEDIUM, ge=0)

    @field_validator("auto_offset_reset", mode="before")
    @classmethod
    def _reset_aliases(cls, value: Any) -> Any:
        """Kafka's old names smallest / largest."""
        if isinstance(value, str):
            return {"smallest": "earliest", "largest": "latest"}.get(value.strip().lower(), value)
        return value


class AdminSchema(ClientSchema):
    """AdminClient settings."""

    ROLE: ClassVar[str] = "admin client"


CLIENT_SCHEMAS: dict[str, type[ClientSchema]] = {
    "producer": ProducerSchema, "consumer": ConsumerSchema, "admin": AdminSchema}

__all__ = ["ClientSchema", "ProducerSchema", "ConsumerSchema", "AdminSchema", "CLIENT_SCHEMAS", "parse", "keys",
           "allowed", "markdown_table"]
