"""The settings schema of each service role, on the SDK's configuration machinery
(`exactly_wire.config`: key, type, default, allowed values, importance, documentation).

`--set key=value` and `--config FILE` (a Java properties file) of every service are
validated against its role's schema before the process starts: an unknown key, a key
of another role, or a wrong value stops the process with a ConfigurationError
naming the key, the value and what is allowed. Names and defaults are Kafka's broker
settings where Kafka has one; `exactly.*` keys are Exactly's own (docs/design.md,
"Decisions"). The service tables of docs/reference/configuration.md ("Partition leader",
"Transaction coordinator", "Group coordinator") are generated from these classes.
"""
from __future__ import annotations

import difflib
from typing import Annotated, ClassVar, Literal, Mapping, TypeVar

from pydantic import AfterValidator

from exactly_wire.config import HIGH, LOW, MEDIUM, Bool, ConfigSchema, ConfigurationError, keys, parse, setting
from exactly_wire.keepalive import KEEPALIVE_TIME_MS
from exactly_wire.security import SecuritySettings

from .protocol import CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC
from .topic_config import DEFAULTS as _TOPIC_DEFAULTS

S = TypeVar("S", bound=ConfigSchema)

# Default of transaction.max.timeout.ms, whose schema default is unset so that its
# older name max.transaction.timeout.ms can give it (TxnCoordinatorSchema.max_timeout_ms).
DEFAULT_TRANSACTION_MAX_TIMEOUT_MS = 900000

_SERVICE_UNSUPPORTED = {
    "ssl.keystore.": "give PEM files: ssl.certificate.location and ssl.key.location",
    "ssl.truststore.": "give a PEM file: ssl.ca.location",
    "listeners": "use --host, --port and --advertised-host",
    "advertised.listeners": "use --advertised-host",
    "broker.id": "use --node-id",
    "log.dirs": "use --data-dir",
    "zookeeper.connect": "use --zookeeper",
    "authorizer.class.name": "set authorizer=acl",
    "zookeeper.clientCnxnSocket": "not needed for TLS: set zookeeper.ssl.client.enable=true",
}


def _principal_mapping_rules(value: str) -> str:
    """ssl.principal.mapping.rules parse (services.common.security.auth.PrincipalMapper), so a
    malformed rule stops the process naming the key."""
    from .security.auth import PrincipalMapper
    PrincipalMapper(value)
    return value


PrincipalMappingRules = Annotated[str, AfterValidator(_principal_mapping_rules)]


def _per_ip_overrides(value: str) -> str:
    """max.connections.per.ip.overrides parse (services.common.transport.peer_addresses.parse_overrides)."""
    from .transport.peer_addresses import parse_overrides
    parse_overrides(value)
    return value


PerIpOverrides = Annotated[str, AfterValidator(_per_ip_overrides)]

def _sasl_mechanisms(value: str) -> str:
    """sasl.enabled.mechanisms parse (services.common.security.sasl.parse_mechanisms)."""
    from .security.sasl import parse_mechanisms
    parse_mechanisms(value)
    return value


SaslMechanisms = Annotated[str, AfterValidator(_sasl_mechanisms)]


def _producer_id_expiration_ms():
    """producer.id.expiration.ms, one definition for the roles that use it: partition
    leaders (producer state), transaction coordinators (producer-id bindings) and
    group coordinators (which check bindings as leaders do)."""
    return setting("producer.id.expiration.ms", _TOPIC_DEFAULTS.producer_id_expiration_ms,
                   "ms after its last use after which an idle producer id is forgotten: a partition leader drops "
                   "its producer state (topic config producer.id.expiration.ms overrides it per topic), a "
                   "transaction coordinator its producer-id binding (authorizer=acl; "
                   "docs/design.md, \"Producer-id bindings\"), which partition leaders and group coordinators check "
                   "again every quarter of it. Give every service the same value.", MEDIUM, ge=1)


def _producer_id_expiration_check_interval_ms():
    """producer.id.expiration.check.interval.ms, one definition for partition leaders
    and transaction coordinators."""
    return setting("producer.id.expiration.check.interval.ms", 600000, "ms between producer-id expiration "
                   "scans (partition leaders: producer state; transaction coordinators: producer-id bindings).",
                   LOW, ge=1)


class ServiceSchema(SecuritySettings):
    """Settings every service process has. The security keys (SecuritySettings) set
    the process's listeners (security.protocol; ssl.certificate.location and
    ssl.key.location are its identity) and its channels to the other services (TLS
    with the same certificate); docs/design.md, "Security"."""

    ROLE: ClassVar[str] = "service"
    UNSUPPORTED: ClassVar[dict[str, str]] = _SERVICE_UNSUPPORTED

    zookeeper_session_timeout_ms: int = setting(
        "zookeeper.session.timeout.ms", 10000, "ZooKeeper session timeout in ms; leadership leases and "
        "coordinator ownership last 2/3 of it.", HIGH, ge=1000)
    zookeeper_set_acl: Bool = setting(
        "zookeeper.set.acl", False, "Create every znode with an ACL: the cluster's digest identity may do "
        "everything, others only read (SCRAM credentials not even that). Needs zookeeper.digest.username and "
        "zookeeper.digest.password.", HIGH)
    zookeeper_digest_username: str | None = setting(
        "zookeeper.digest.username", None, "The services' ZooKeeper identity (digest authentication); the "
        "same on every service of a cluster.", HIGH)
    zookeeper_digest_password: str | None = setting(
        "zookeeper.digest.password", None, "Password of zookeeper.digest.username. Prefer --config FILE "
        "(mode 0600) to --set, which other local users can see in the process list.", HIGH)
    # ZooKeeper over TLS (KIP-515 names; PEM files only): services/common/security/zk_tls.py.
    zookeeper_ssl_client_enable: Bool = setting(
        "zookeeper.ssl.client.enable", False, "Connect to ZooKeeper with TLS (the connect string names the "
        "servers' secureClientPort).", HIGH)
    zookeeper_ssl_keystore_location: str | None = setting(
        "zookeeper.ssl.keystore.location", None, "PEM file of the client certificate and its private key "
        "presented to ZooKeeper (unset: ssl.certificate.location and ssl.key.location).", MEDIUM)
    zookeeper_ssl_keystore_password: str | None = setting(
        "zookeeper.ssl.keystore.password", None, "Password of an encrypted key in "
        "zookeeper.ssl.keystore.location.", LOW)
    zookeeper_ssl_keystore_type: Literal["PEM"] = setting(
        "zookeeper.ssl.keystore.type", "PEM", "Format of zookeeper.ssl.keystore.location: PEM only.", LOW)
    zookeeper_ssl_truststore_location: str | None = setting(
        "zookeeper.ssl.truststore.location", None, "PEM file of the CA certificates that sign ZooKeeper's "
        "server certificates (unset: ssl.ca.location; both unset: the system's CAs).", MEDIUM)
    zookeeper_ssl_truststore_type: Literal["PEM"] = setting(
        "zookeeper.ssl.truststore.type", "PEM", "Format of zookeeper.ssl.truststore.location: PEM only.", LOW)
    zookeeper_ssl_endpoint_identification_algorithm: Literal["HTTPS", "https", ""] = setting(
        "zookeeper.ssl.endpoint.identification.algorithm", "HTTPS", "HTTPS: ZooKeeper's certificate must name "
        "the host of the connect string; empty: no host name check (the CA is still verified).", LOW)
    metrics_port: int = setting("metrics.port", 0, "Port of the Prometheus /metrics endpoint (0: a free port).",
                                MEDIUM, ge=0, le=65535)
    metrics_bind_address: str | None = setting("metrics.bind.address", None, "Address the /metrics endpoint "
                                               "binds (unset: --host).", LOW)
    event_loop: Literal["uvloop", "asyncio"] = setting(
        "exactly.event.loop", "uvloop", "The service's asyncio event loop: uvloop (libuv; less CPU per call, used "
        "when the uvloop package is installed, else asyncio with a warning) or asyncio (the standard library's).",
        LOW)
    health_poll_ms: int = setting("exactly.health.poll.ms", 100, "ms between updates of the gRPC health status.",
                                  LOW, ge=10)
    socket_request_max_bytes: int = setting(
        "socket.request.max.bytes", 104857600, "Largest request the gRPC server receives (bytes); a larger one "
        "is refused with RESOURCE_EXHAUSTED before it is parsed.", MEDIUM, ge=1024, le=2147483647)
    max_concurrent_streams: int = setting("exactly.max.concurrent.streams", 1000, "Calls in flight per "
                                          "connection; more wait for one to finish.", LOW, ge=1)
    keepalive_time_ms: int = setting(
        "exactly.keepalive.time.ms", KEEPALIVE_TIME_MS, "ms without reads after which the service's gRPC channel "
        "to another service, with a call open, pings it (no answer in 20 s closes the connection). The gRPC "
        "server accepts a client's pings every half of this or of the SDK's 10000 ms, whichever is shorter.",
        LOW, ge=100)
    connections_max_idle_ms: int = setting(
        "connections.max.idle.ms", 600000, "A connection with no request in progress for this many ms is closed "
        "(gRPC: an HTTP/2 GOAWAY; Kafka port: also a response left unread that long).", MEDIUM, ge=1)
    ssl_handshake_timeout_ms: int = setting(
        "exactly.ssl.handshake.timeout.ms", 10000, "ms a new connection may take to finish its TLS handshake "
        "(gRPC: also the HTTP/2 preface, with or without TLS); then it is closed.", MEDIUM, ge=1)
    max_connections: int = setting(
        "max.connections", 2147483647, "Connections each listener (gRPC port, Kafka port) holds at once; more "
        "are refused at accept. Never above (RLIMIT_NOFILE - exactly.connections.fd.reserve) / 2.", MEDIUM,
        ge=1)
    max_connections_per_ip: int = setting(
        "max.connections.per.ip", 1000, "Connections one peer address holds on each listener (Kafka port: "
        "refused at accept; gRPC port: the excess shut at the next sweep), authenticated or not, so one host "
        "cannot take every connection of a port (Kafka's default: no limit).", MEDIUM, ge=0)
    max_connections_per_ip_overrides: PerIpOverrides = setting(
        "max.connections.per.ip.overrides", "", "Per-address exceptions to max.connections.per.ip: "
        "host-or-ip:count,... (a host name resolved at start).", MEDIUM)
    max_connection_creation_rate: int = setting(
        "max.connection.creation.rate", 2147483647, "New connections per second each listener accepts (KIP-612); "
        "more are refused (gRPC port: shut at the next sweep).", MEDIUM, ge=0)
    connections_fd_reserve: int = setting(
        "exactly.connections.fd.reserve", 1024, "File descriptors kept free of connections: the listeners hold "
        "at most (RLIMIT_NOFILE - this - the descriptors of segments, indexes, ZooKeeper and channels) / 2 each "
        "(recomputed every sweep; the soft limit is raised to the hard one at start).", LOW, ge=0)
    memory_trim_interval_ms: int = setting(
        "exactly.memory.trim.interval.ms", 10000, "ms between returns of freed heap memory to the system "
        "(glibc's malloc_trim): what a burst of connections allocated does not stay with the process once they "
        "closed. 0: never.", LOW, ge=0)
    connections_sweep_interval_ms: int = setting(
        "exactly.connections.sweep.interval.ms", 1000, "ms between the gRPC port's sweeps applying "
        "max.connections.per.ip, its overrides and max.connection.creation.rate, and between updates of both "
        "ports' descriptor budget.", LOW, ge=10)
    tunnel_max_in_flight_calls: int = setting(
        "exactly.tunnel.max.in.flight.calls", 500, "Calls of one tunnel stream (Tunnel/Calls or Tunnel/Batches: "
        "the services' calls to each other) read and not yet answered; the stream reads no further call meanwhile (back-pressure).",
        LOW, ge=1)
    client_stream_max_in_flight_calls: int = setting(
        "exactly.client.stream.max.in.flight.calls", 32, "Calls of one SDK stream (Client/Calls: an SDK's "
        "transaction-path calls to this service) read and not yet answered; the stream reads no further call "
        "meanwhile (back-pressure), so a client's memory here is bounded as for its direct calls.", LOW, ge=1)
    client_link_max_links: int = setting(
        "exactly.client.link.max.links", 1024, "SDK links (Client/Attach: an SDK's Client/Calls on a TCP "
        "connection to the link port) this process holds open or has issued unexpired tickets for; past it an "
        "SDK stays on its Client/Calls gRPC stream. The services' own links are bounded apart.", LOW, ge=0)
    client_link_max_links_per_principal: int = setting(
        "exactly.client.link.max.links.per.principal", 128, "SDK links of one principal (open, or an unexpired "
        "ticket) on this process; past it that principal's new SDK clients stay on their gRPC streams.", LOW, ge=0)
    tunnel_max_queued_replies: int = setting(
        "exactly.tunnel.max.queued.replies", 64, "Replies of one tunnel stream waiting to be sent at which "
        "the stream stops reading calls until the peer takes them.", LOW, ge=1)
    metrics_group_labels: Bool = setting(
        "metrics.group.labels", False, "Export consumer group names as `group` labels on /metrics (per-group "
        "lag panels need it). false: the groups' committed offsets and lags are summed under group=\"(hidden)\", "
        "since /metrics answers before authentication and ListGroups shows a principal only its own groups.",
        MEDIUM)
    metrics_topic_labels: Bool = setting(
        "metrics.topic.labels", False, "Export user topic names as `topic` labels on /metrics (per-topic "
        "dashboard panels need it). false: each user topic's series are summed (max for ages and lags) under "
        "topic=\"(hidden)\"; the internal topics keep their names.", MEDIUM)
    auto_create_topics_enable: Bool = setting(
        "auto.create.topics.enable", True, "Create a topic that does not exist when a producer asks for its "
        "metadata (MetadataRequest.allow_auto_topic_creation), with num.partitions and "
        "default.replication.factor, as Kafka's brokers do; the caller needs Create on the Cluster or the topic. "
        "Consumers and admin clients never create topics this way.", HIGH)
    num_partitions: int = setting("num.partitions", 1, "Partitions of an automatically created topic.", MEDIUM,
                                  ge=1)
    default_replication_factor: int = setting(
        "default.replication.factor", 1, "Replicas of an automatically created topic (more than the live "
        "partition leaders: not created, INVALID_REPLICATION_FACTOR).", MEDIUM, ge=1)
    max_partitions_per_topic: int = setting("max.partitions.per.topic", 10000, "Partitions one topic may have "
                                            "(CreateTopics, CreatePartitions; INVALID_PARTITIONS above).", MEDIUM,
                                            ge=1)
    max_partitions: int = setting("max.partitions", 100000, "Partitions of all topics together (KIP-578; "
                                  "POLICY_VIOLATION above).", MEDIUM, ge=1)
    quota_window_num: int = setting("quota.window.num", 11, "Samples a client quota's rate is measured over "
                                    "(KIP-13; docs/design.md, \"Quotas\").", LOW, ge=2)
    quota_window_size_seconds: int = setting("quota.window.size.seconds", 1, "Seconds each quota sample "
                                             "spans.", LOW, ge=1)
    quota_sensor_expiration_ms: int = setting(
        "exactly.quota.sensor.expiration.ms", 3600000, "A client quota's sensor (the rate and mute of one user "
        "or client id) unused this long is dropped, as Kafka drops idle quota sensors after an hour; bounds "
        "what callers rotating client ids make a service keep.", LOW, ge=1000)
    unstable_feature_versions_enable: Bool = setting(
        "unstable.feature.versions.enable", False, "Run at metadata.version levels still being built (KIP-1022): "
        "with it, this process supports them, a new cluster it creates starts at the newest, and `exactly "
        "features upgrade` may raise a cluster to one once every live process enables it. For development "
        "and benchmarks, not production.", LOW)
    test_load_delay_ms: int = setting("exactly.test.load.delay.ms", 0, "Test hook: ms a coordinator sleeps "
                                      "before loading a partition (widens failover windows in tests).", LOW, ge=0)
    authorizer: Literal["none", "acl"] = setting(
        "authorizer", "none", "acl: every request is checked against the ACLs stored in ZooKeeper (KIP-98 "
        "design document, Authorization); none: everyone may do everything.", HIGH)
    super_users: str = setting("super.users", "", "Principals allowed everything, separated by ';' "
                               "(User:admin;User:pl-0). Put the services' principals here.", HIGH)
    allow_everyone_if_no_acl_found: Bool = setting(
        "allow.everyone.if.no.acl.found", False, "With the authorizer on, allow a resource that has no ACL at "
        "all to everyone.", MEDIUM)
    ssl_principal_mapping_rules: PrincipalMappingRules = setting(
        "ssl.principal.mapping.rules", "DEFAULT", "How a client certificate's subject becomes a principal: "
        "RULE:pattern/replacement/[LU] rules, then DEFAULT (the common name).", LOW)
    ssl_client_auth: Literal["required", "requested", "none"] = setting(
        "ssl.client.auth", "none", "With SSL listeners: required (every client presents a certificate of the "
        "CA; needed for the services' own principals with the authorizer on), requested (the Kafka listener "
        "verifies one when presented; gRPC cannot ask for an optional certificate, so there it means none) or "
        "none.", MEDIUM)
    sasl_enabled_mechanisms: SaslMechanisms = setting(
        "sasl.enabled.mechanisms", "SCRAM-SHA-256,SCRAM-SHA-512,PLAIN", "SASL mechanisms offered on both ports "
        "(TLS listeners only): SCRAM-SHA-256, SCRAM-SHA-512, PLAIN (checked against the stored SCRAM-SHA-512 "
        "credential).", MEDIUM)
    connection_failed_authentication_delay_ms: int = setting(
        "connection.failed.authentication.delay.ms", 100, "Delay in ms before a failed authentication is "
        "answered (and the Kafka connection closed).", LOW, ge=0)
    exactly_sasl_failed_authentication_attempts_per_second: float = setting(
        "exactly.sasl.failed.authentication.attempts.per.second", 5.0, "After a failed authentication, further "
        "attempts from that address on that user name are spaced to at most this many a second (queued, not "
        "refused, up to 10 s of wait) for a minute; other addresses and other names are not slowed.", LOW, gt=0)
    sasl_server_max_receive_size: int = setting(
        "sasl.server.max.receive.size", 524288, "Largest request (bytes) a connection may send before it has "
        "authenticated (Kafka port: the connection is closed; gRPC: a larger SASL message is refused unread).",
        LOW, ge=64, le=104857600)
    exactly_sasl_authentication_timeout_ms: int = setting(
        "exactly.sasl.authentication.timeout.ms", 15000, "Kafka port: a connection that must authenticate "
        "with SASL (no client certificate where one is required) and has not within this many ms of its TLS "
        "handshake is closed, whatever it sends meanwhile.", MEDIUM, ge=100)
    connections_max_reauth_ms: int = setting(
        "connections.max.reauth.ms", 0, "Kafka port (KIP-368): a SASL session lasts this many ms; the client "
        "re-authenticates on its connection before then, and a request after it closes the connection. 0: "
        "sessions last as long as their connection (deleting a user or changing its password closes its "
        "connections either way).", MEDIUM, ge=0)
    exactly_sasl_session_lifetime_ms: int = setting(
        "exactly.sasl.session.lifetime.ms", 3600000, "Lifetime in ms of the session token a gRPC client gets "
        "from its SASL exchange (it authenticates again before then).", LOW, ge=1000)


class ReplicaHostSchema(ServiceSchema):
    """Settings of a process that hosts partition replicas (services/partition_leader/host.py):
    every partition leader, and from metadata.version 3 a transaction coordinator for its
    own internal topic. Topic configs override the log ones per topic."""

    ROLE: ClassVar[str] = "replica host"

    segment_bytes: int | None = setting("segment.bytes", None, "Roll the active segment past this many bytes "
                                        f"(default {_TOPIC_DEFAULTS.segment_bytes}; alias log.segment.bytes).",
                                        MEDIUM, ge=1024)
    log_segment_bytes: int | None = setting("log.segment.bytes", None, "Broker-level name of segment.bytes.",
                                            LOW, ge=1024)
    index_interval_bytes: int | None = setting("index.interval.bytes", None, "Bytes between offset index "
                                               f"entries (default {_TOPIC_DEFAULTS.index_interval_bytes}; alias "
                                               "log.index.interval.bytes).", LOW,
                                               ge=1)
    log_index_interval_bytes: int | None = setting("log.index.interval.bytes", None,
                                                   "Broker-level name of index.interval.bytes.", LOW, ge=1)
    flush_messages: int | None = setting("flush.messages", None, "fsync after this many appended records "
                                         f"(default {_TOPIC_DEFAULTS.flush_messages}: on roll and shutdown only; "
                                         "alias log.flush.interval.messages).", MEDIUM, ge=1)
    log_flush_interval_messages: int | None = setting("log.flush.interval.messages", None,
                                                      "Broker-level name of flush.messages.", LOW, ge=1)
    message_max_bytes: int = setting("message.max.bytes", _TOPIC_DEFAULTS.max_message_bytes, "Largest record "
                                     "batch a Produce may carry (bytes; MESSAGE_TOO_LARGE above; topic config "
                                     "max.message.bytes).", HIGH, ge=0, le=2147483647)
    min_insync_replicas: int = setting("min.insync.replicas", _TOPIC_DEFAULTS.min_insync_replicas, "In-sync "
                                       "replicas acks=all writes and markers need (capped at the replication "
                                       "factor).", HIGH, ge=1)
    producer_snapshot_interval_ms: int = setting("producer.snapshot.interval.ms",
                                                 _TOPIC_DEFAULTS.producer_snapshot_interval_ms, "Least ms between "
                                                 "periodic producer-state snapshots.", LOW, ge=1)
    producer_snapshot_retained: int = setting("producer.snapshot.retained",
                                              _TOPIC_DEFAULTS.producer_snapshot_retained, "Producer-state "
                                              "snapshots kept per partition.", LOW, ge=1)
    producer_id_expiration_ms: int = _producer_id_expiration_ms()
    producer_id_expiration_check_interval_ms: int = _producer_id_expiration_check_interval_ms()
    replica_lag_time_max_ms: int = setting("replica.lag.time.max.ms", 10000, "A follower not caught up for this "
                                           "many ms leaves the ISR.", MEDIUM, ge=1)
    fetch_max_wait_ms: int = setting(
        "fetch.max.wait.ms", 30000, "Largest max_wait_ms a consumer's Fetch may ask (the consumer setting of the "
        "same name; as fetch.max.bytes caps a fetch's size, KIP-541): a longer wait is cut to this many ms.",
        MEDIUM, ge=0)
    fetch_max_parked_per_principal: int = setting(
        "exactly.fetch.max.parked.per.principal", 1000, "Consumer Fetches one principal may have waiting "
        "for data on a partition leader (per connection for User:ANONYMOUS); a Fetch beyond it is answered at "
        "once with what is there, as if its max_wait_ms were 0. Followers' fetches are not counted.", MEDIUM,
        ge=0)
    replica_fetch_wait_max_ms: int = setting("replica.fetch.wait.max.ms", 500, "ms a follower's fetch waits "
                                             "for new data.", LOW, ge=0)
    replica_fetch_max_bytes: int = setting("replica.fetch.max.bytes", 1048576, "Bytes per partition per "
                                           "follower fetch.", LOW, ge=1)
    replica_fetch_backoff_ms: int = setting("replica.fetch.backoff.ms", 200, "ms a follower waits after a "
                                            "failed fetch.", LOW, ge=0)
    transaction_partition_verification_enable: Bool = setting(
        "transaction.partition.verification.enable", True, "KIP-890: verify a producer's first transactional "
        "batch on a partition with its transaction coordinator.", MEDIUM)
    log_cleanup_policy: Literal["delete", "compact", "compact,delete", "delete,compact"] = setting(
        "log.cleanup.policy", _TOPIC_DEFAULTS.cleanup_policy, "Default cleanup.policy of topics: delete "
        "(retention) and/or compact (the latest record per key). Internal topics are always compact.", MEDIUM)
    log_retention_ms: int = setting("log.retention.ms", _TOPIC_DEFAULTS.retention_ms, "Default retention.ms: "
                                    "delete segments whose newest record is older (ms; -1: no limit).", HIGH,
                                    ge=-1)
    log_retention_bytes: int = setting("log.retention.bytes", _TOPIC_DEFAULTS.retention_bytes, "Default "
                                       "retention.bytes: delete the oldest segments while a partition is larger "
                                       "(bytes; -1: no limit).", HIGH, ge=-1)
    log_roll_ms: int = setting("log.roll.ms", _TOPIC_DEFAULTS.segment_ms, "Default segment.ms: roll the active "
                               "segment after this many ms, so retention can delete it.", MEDIUM, ge=1)
    log_cleaner_delete_retention_ms: int = setting(
        "log.cleaner.delete.retention.ms", _TOPIC_DEFAULTS.delete_retention_ms, "Default delete.retention.ms: ms "
        "a compacted topic keeps tombstones and the markers of transactions whose records are gone.", MEDIUM, ge=0)
    log_retention_check_interval_ms: int = setting(
        "log.retention.check.interval.ms", 300000, "ms between passes of the log cleaner (retention, "
        "DeleteRecords segment deletion, compaction).", MEDIUM, ge=10)
    log_cleaner_enable: Bool = setting("log.cleaner.enable", True, "Compact topics whose cleanup.policy "
                                       "includes compact (retention runs either way).", MEDIUM)


class PartitionLeaderSchema(ReplicaHostSchema):
    """Partition leader settings: those of its replicas (ReplicaHostSchema) and the
    controller's."""

    ROLE: ClassVar[str] = "partition leader"

    controller_sweep_interval_ms: int = setting("controller.sweep.interval.ms", 10000, "ms between the "
                                                "controller's leader and ISR checks when no watch fired (a "
                                                "backstop: each change of live processes, registrations, "
                                                "topics or partition states starts one at once).", LOW, ge=10)


class TxnCoordinatorSchema(ReplicaHostSchema):
    """Transaction coordinator settings (KIP-98 design document, "Added Configurations"),
    with those of the replicas of its internal topic it hosts from metadata.version 3
    (ReplicaHostSchema)."""

    ROLE: ClassVar[str] = "transaction coordinator"
    UNSUPPORTED: ClassVar[dict[str, str]] = {
        **_SERVICE_UNSUPPORTED,
        "transaction.prepared.max.ms": "removed: the coordinator never aborts a prepared transaction by itself "
        "(KIP-939). Its transaction manager decides it (exactly.postgres.recover()), or an operator: exactly "
        "transactions commit-prepared / abort-prepared; the alert ExactlyPreparedTransactionWaiting says when one "
        "waits. Remove the key.",
    }

    transaction_max_timeout_ms: int | None = setting(
        "transaction.max.timeout.ms", None, "Largest transaction.timeout.ms a producer may ask for (default "
        f"{DEFAULT_TRANSACTION_MAX_TIMEOUT_MS}; the design document's max.transaction.timeout.ms is accepted "
        "too).", HIGH, ge=1)
    max_transaction_timeout_ms: int | None = setting("max.transaction.timeout.ms", None,
                                                     "The design document's name of transaction.max.timeout.ms.",
                                                     LOW, ge=1)
    transactional_id_expiration_ms: int = setting(
        "transactional.id.expiration.ms", 604800000, "ms without a transaction after which a transactional.id "
        "is expired; also how long a transactional producer's producer-id binding outlives its use once the "
        "transactional.id holds another producer id.", MEDIUM, ge=1)
    abort_timed_out_interval_ms: int = setting(
        "transaction.abort.timed.out.transaction.cleanup.interval.ms", 10000, "ms between scans that abort "
        "timed-out transactions.", LOW, ge=1)
    remove_expired_interval_ms: int = setting(
        "transaction.remove.expired.transaction.cleanup.interval.ms", 3600000, "ms between transactional.id "
        "expiration scans.", LOW, ge=1)
    producer_ids_rate: float = setting(
        "exactly.producer.ids.rate", 100.0, "InitProducerId calls per second each principal may make to one "
        "transaction coordinator with the authorizer on (KIP-936's producer_ids_rate; bursts of one second's "
        "worth; THROTTLING_QUOTA_EXCEEDED above; 0: no limit).", MEDIUM, ge=0)
    producer_ids_max_per_principal: int = setting(
        "exactly.producer.ids.max.per.principal", 100000, "Live producer-id bindings of idempotent producers "
        "one principal may hold at one transaction coordinator with the authorizer on (KIP-936's intent: a "
        "principal cannot fill the coordinator's memory); InitProducerId beyond it is answered POLICY_VIOLATION "
        "until some expire (producer.id.expiration.ms); 0: no limit.", MEDIUM, ge=0)
    transactional_ids_max_per_principal: int = setting(
        "exactly.transactional.ids.max.per.principal", 10000, "Transactional ids one principal may hold "
        "(producer ids bound to it with that transactional.id) at one transaction coordinator with the "
        "authorizer on; InitProducerId of one more is answered POLICY_VIOLATION until some expire "
        "(transactional.id.expiration.ms); 0: no limit.", MEDIUM, ge=0)
    state_log_num_partitions: int = setting("transaction.state.log.num.partitions", 8, "Partitions of "
                                            f"{TRANSACTION_STATE_TOPIC} when this coordinator creates it.", MEDIUM, ge=1)
    state_log_replication_factor: int = setting("transaction.state.log.replication.factor", 1, "Replicas of "
                                                f"{TRANSACTION_STATE_TOPIC} when created (capped at the live partition "
                                                "leaders).", HIGH, ge=1)
    state_log_min_isr: int = setting("transaction.state.log.min.isr", 2, "min.insync.replicas of "
                                     f"{TRANSACTION_STATE_TOPIC} when this coordinator creates it: the replicas a "
                                     "transaction-log write needs (acks=all; capped at the replicas a partition "
                                     "has, so 1 at replication factor 1).", HIGH, ge=1)
    state_log_segment_bytes: int = setting("transaction.state.log.segment.bytes", 104857600, "segment.bytes of "
                                           f"{TRANSACTION_STATE_TOPIC} when this coordinator creates it (smaller "
                                           "segments compact sooner).", MEDIUM, ge=1024)
    state_log_load_buffer_size: int = setting("transaction.state.log.load.buffer.size", 5242880, "Bytes per "
                                              f"fetch while loading a {TRANSACTION_STATE_TOPIC} partition.", LOW, ge=1)
    txn_retry_backoff_ms: int = setting("exactly.txn.retry.backoff.ms", 20, "ms before retrying a marker, "
                                        "completion append or load.", LOW, ge=0)
    txn_retry_backoff_max_ms: int = setting("exactly.txn.retry.backoff.max.ms", 1000, "Largest ms between "
                                            "those retries.", LOW, ge=0)
    txn_end_completion_wait_ms: int = setting("exactly.txn.end.completion.wait.ms", 0, "ms EndTxn waits for "
                                              "the markers and the Complete record before answering (0: it "
                                              "answers once the Prepare record is durable).", LOW, ge=0)
    txn_previous_completion_wait_ms: int = setting(
        "exactly.txn.previous.completion.wait.ms", 5000, "ms AddPartitionsToTxn / AddOffsetsToTxn of a "
        "producer's next transaction wait for its previous one to complete (markers written) before answering "
        "CONCURRENT_TRANSACTIONS.", LOW, ge=0)
    txn_handover_wait_ms: int = setting(
        "exactly.txn.handover.wait.ms", 5, "ms the completion of a transaction waits, once its markers are "
        "written, for the producer's next transaction to start, when that producer started its last one within "
        "this time of the previous one's completion: the next transaction's first record then also completes "
        "this one (one transaction-log append instead of two). 0: never wait.", LOW, ge=0)
    txn_batch_linger_ms: int = setting("exactly.txn.batch.linger.ms", 1, "ms a transaction-log append or "
                                       "marker request waits for others to join it while several producers "
                                       "commit at once (0: never).", LOW, ge=0)
    txn_ready_timeout_ms: int = setting("exactly.txn.ready.timeout.ms", 30000, "ms the coordinator waits for "
                                        "its internal topic at start.", LOW, ge=1)
    test_pause_after_prepare_ms: int = setting("exactly.test.pause.after.prepare.ms", 0, "Test hook: ms between "
                                               "a Prepare record and its markers.", LOW, ge=0)

    @property
    def max_timeout_ms(self) -> int:
        """The largest transaction.timeout.ms (ms): transaction.max.timeout.ms, else the
        design document's max.transaction.timeout.ms, else the default."""
        return (self.transaction_max_timeout_ms or self.max_transaction_timeout_ms
                or DEFAULT_TRANSACTION_MAX_TIMEOUT_MS)


class GroupCoordinatorSchema(ServiceSchema):
    """Group coordinator settings."""

    ROLE: ClassVar[str] = "group coordinator"

    group_min_session_timeout_ms: int = setting("group.min.session.timeout.ms", 1000, "Smallest "
                                                "session.timeout.ms a member may ask for.", MEDIUM, ge=1)
    group_max_session_timeout_ms: int = setting("group.max.session.timeout.ms", 1800000, "Largest "
                                                "session.timeout.ms a member may ask for.", MEDIUM, ge=1)
    group_initial_rebalance_delay_ms: int = setting("group.initial.rebalance.delay.ms", 0, "ms the first "
                                                    "rebalance of an empty group waits for more members.", LOW, ge=0)
    group_max_size: int = setting("group.max.size", 2147483647, "Members per group.", LOW, ge=1)
    offset_metadata_max_bytes: int = setting("offset.metadata.max.bytes", 4096, "Largest metadata string of "
                                             "a committed offset.", LOW, ge=0)
    offsets_commit_timeout_ms: int = setting("offsets.commit.timeout.ms", 5000, "ms an offset commit waits "
                                             "for its append.", LOW, ge=1)
    offsets_load_buffer_size: int = setting("offsets.load.buffer.size", 5242880, "Bytes per fetch while "
                                            f"loading a {CONSUMER_OFFSETS_TOPIC} partition.", LOW, ge=1)
    offsets_topic_num_partitions: int = setting("offsets.topic.num.partitions", 8, "Partitions of "
                                                f"{CONSUMER_OFFSETS_TOPIC} when this coordinator creates it.", MEDIUM, ge=1)
    offsets_topic_replication_factor: int = setting("offsets.topic.replication.factor", 1, "Replicas of "
                                                    f"{CONSUMER_OFFSETS_TOPIC} when created (capped at the live "
                                                    "partition leaders).", HIGH, ge=1)
    offsets_topic_segment_bytes: int = setting("offsets.topic.segment.bytes", 104857600, "segment.bytes of "
                                               f"{CONSUMER_OFFSETS_TOPIC} when this coordinator creates it (smaller "
                                               "segments compact sooner).", MEDIUM, ge=1024)
    tail_max_wait_ms: int = setting("group.coordinator.tail.max.wait.ms", 500, "ms a fetch of the coordinator's "
                                    "own partition waits for new records.", LOW, ge=0)
    tick_ms: int = setting("group.coordinator.tick.ms", 100, "ms between session and rebalance timer checks.",
                           LOW, ge=1)
    transaction_partition_verification_enable: Bool = setting(
        "transaction.partition.verification.enable", True, "KIP-890: verify a TxnOffsetCommit with the "
        "transaction coordinator before accepting it.", MEDIUM)
    producer_id_expiration_ms: int = _producer_id_expiration_ms()


SERVICE_SCHEMAS: dict[str, type[ServiceSchema]] = {
    "partition_leader": PartitionLeaderSchema,
    "txn_coordinator": TxnCoordinatorSchema,
    "group_coordinator": GroupCoordinatorSchema,
}


def role_settings(schema: type[S], given: S | Mapping[str, object]) -> S:
    """`given` when it is already a parsed settings object, else `parse(schema, given)`
    (a mapping of Kafka keys, as tests and tools give them). Raises ConfigurationError
    for an unknown key or a wrong value."""
    if isinstance(given, ConfigSchema):
        return given
    return parse(schema, given)


def service_settings(props: Mapping[str, object]) -> ServiceSchema:
    """The settings every service has (ServiceSchema), parsed from a mapping of one
    role's settings: keys of the role's own settings are left out. Raises
    ConfigurationError for a wrong value."""
    common = set(keys(ServiceSchema))
    return parse(ServiceSchema, {k: v for k, v in props.items() if k in common})


def key_of(schema: type[ConfigSchema], field: str) -> str:
    """The Kafka key of `schema`'s setting `field` (its attribute name), for the messages,
    metric labels and error reasons that name a setting: the key is written once, in the
    schema. Raises KeyError for a field `schema` does not have."""
    info = schema.model_fields.get(field)
    if info is None or info.alias is None:
        raise KeyError(f"{schema.__name__} has no setting {field!r}")
    return info.alias


def settings_by_role(props: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """Split one set of cluster-wide settings (as a development cluster or a Helm
    values file gives them) into each role's own: role -> {key: value}, every value
    validated by its role's schema. Raises ConfigurationError for a key no role has
    (with the closest key), an unsupported key, or a wrong value."""
    out: dict[str, dict[str, str]] = {role: {} for role in SERVICE_SCHEMAS}
    every = sorted({k for schema in SERVICE_SCHEMAS.values() for k in keys(schema)})
    for key, value in props.items():
        roles = [role for role, schema in SERVICE_SCHEMAS.items() if key in keys(schema)]
        if not roles:
            for schema in (ServiceSchema, *SERVICE_SCHEMAS.values()):
                try:
                    parse(schema, {key: value})
                except ConfigurationError as exc:
                    if exc.allowed == "not supported":
                        raise  # with the reason
            guess = difflib.get_close_matches(key.replace("_", ".").lower(), every, n=1, cutoff=0.75)
            hint = f"; did you mean {guess[0]!r}?" if guess else ""
            raise ConfigurationError(f"unknown configuration key {key!r} for every service role{hint}",
                                     key=key, value=value, allowed="the keys of the service roles")
        for role in roles:
            out[role][key] = value
    for role, schema in SERVICE_SCHEMAS.items():
        parse(schema, out[role])
    return out


__all__ = ["settings_by_role", "role_settings", "service_settings",
           "DEFAULT_TRANSACTION_MAX_TIMEOUT_MS", "ServiceSchema", "ReplicaHostSchema", "PartitionLeaderSchema", "TxnCoordinatorSchema",
           "GroupCoordinatorSchema", "SERVICE_SCHEMAS"]
