"""The Kafka API tables of docs/reference/kafka-api.md, generated from the API surface
(design, "Kafka protocol") by `python -m exactly_tools.config_docs` with the configuration
tables.

The served table (between `<!-- kafka-api-table: served -->` and
`<!-- /kafka-api-table -->`) has one row per key of
services.common.kafka.surface.SURFACE plus the keys the listener answers itself
(listener.LISTENER_APIS), with the versions of that table; the not-served table
(`<!-- kafka-api-table: not-served -->`) lists every other key Kafka defines (kio's
index of Kafka's message schemas) with the reason from `NOT_SERVED`.
"""
from __future__ import annotations

import re

from kio.schema.index import api_key_map

from services.common.kafka import surface
from services.common.kafka.listener import LISTENER_APIS, SASL_AUTHENTICATE_KEY, SASL_HANDSHAKE_KEY

from .generated_docs import DOCS

# The page that holds the tables.
PAGE = DOCS / "reference" / "kafka-api.md"

WHO = {surface.CLUSTER: "every service", surface.PARTITION_LEADER: "partition leaders",
       surface.TXN_COORDINATOR: "transaction coordinators", surface.GROUP_COORDINATOR: "group coordinators"}

# What a Kafka user should know about a served key (rows without one have none).
NOTES: dict[int, str] = {
    0: "acks 0/1/all, idempotent, transactional, every codec of the SDK",
    1: "isolation level, aborted transactions, LSO, log start offset; no fetch sessions",
    2: "-1 latest = LSO under read_committed, -2 earliest, -3 max timestamp (KIP-734), timestamps",
    10: "key types 0 group, 1 transaction; batched from v4",
    16: "any port answers the union of every group coordinator's groups (each asked with a deadline)",
    9: "require_stable",
    19: "from v5 the result lists the topic's configs",
    22: "v6: keep_prepared_txn keeps a prepared transaction under a new epoch (KIP-939; enable2_pc refused); "
        "elsewhere: an idempotent producer's is forwarded to a transaction coordinator",
    29: "resource types Topic, Group, Cluster, TransactionalId; patterns LITERAL, PREFIXED, ANY, MATCH",
    30: "INVALID_REQUEST with a message for values outside Exactly's model (host other than *, "
        "USER or DELEGATION_TOKEN resources, token operations)",
    31: "each filter's matching ACLs are removed and listed",
    32: "TOPIC and BROKER resources, with sources and synonyms (see \"Config admin APIs\")",
    33: "TOPIC resources; BROKER settings change only with a restart (INVALID_REQUEST)",
    44: "SET and DELETE on TOPIC resources (see \"Config admin APIs\")",
    35: "the process's data directory: each replica's size and lag; other roles: no directory",
    43: "ELECTION_NOT_NEEDED, or a message why not: the controller elects only on a leader's failure "
        "and never outside the ISR",
    47: "GROUP_SUBSCRIBED_TO_TOPIC for topics the group's members subscribe to",
    60: "broker endpoints only",
}

# Kafka keys not served, and why (every key Kafka defines is here or in SURFACE).
_RAFT = "KRaft controller quorum: Exactly's controller runs on ZooKeeper"
_INTER_BROKER = "inter-broker: Exactly's services talk gRPC to each other"
_SHARE = "share groups (KIP-932) are not implemented"
_STREAMS = "Kafka Streams groups (KIP-1071) are not implemented"
NOT_SERVED: dict[int, str] = {
    27: _INTER_BROKER + " (transaction markers: PartitionLeader/WriteTxnMarkers)",
    34: "one log directory per process: there is nothing to move a replica to",
    38: "delegation tokens are not implemented (SASL sessions use their own tokens)",
    39: "delegation tokens are not implemented", 40: "delegation tokens are not implemented",
    41: "delegation tokens are not implemented",
    45: "replica assignments are fixed at creation", 46: "replica assignments are fixed at creation",
    50: "SCRAM users are managed over gRPC (Cluster/DescribeUserScramCredentials, `exactly users`)",
    51: "SCRAM users are managed over gRPC (Cluster/AlterUserScramCredentials, `exactly users`)",
    52: _RAFT, 53: _RAFT, 54: _RAFT, 55: _RAFT, 56: _INTER_BROKER, 57: "no feature flags (KIP-584)",
    58: _INTER_BROKER, 59: _RAFT, 62: _RAFT, 63: _RAFT, 64: _RAFT, 67: _INTER_BROKER,
    68: "the KIP-848 consumer protocol is not implemented (the classic group protocol is)",
    69: "the KIP-848 consumer protocol is not implemented (the classic group protocol is)",
    70: _RAFT, 71: "client telemetry (KIP-714) is not collected", 72: "client telemetry (KIP-714) is not collected",
    73: _RAFT, 74: "not served yet", 75: "Metadata serves topic partitions",
    76: _SHARE, 77: _SHARE, 78: _SHARE, 79: _SHARE, 80: _RAFT, 81: _RAFT, 82: _RAFT,
    83: _SHARE, 84: _SHARE, 85: _SHARE, 86: _SHARE, 87: _SHARE,
    88: _STREAMS, 89: _STREAMS,
    90: _SHARE, 91: _SHARE, 92: _SHARE,
}


def api_title(key: int) -> str:
    """Kafka's name of API `key` ("list_offsets" -> "ListOffsets")."""
    return "".join(part.capitalize() for part in api_key_map[key].split("_"))


def served() -> dict[int, tuple[int, int, str]]:
    """Every key a Kafka port may advertise -> (min version, max version, who serves it)."""
    out = {k: (s.min_version, s.max_version, WHO[s.role]) for k, s in surface.SURFACE.items()}
    for key, (lo, hi) in LISTENER_APIS.items():
        out[key] = (lo, hi, "every service (TLS listeners with SASL)" if key in (SASL_HANDSHAKE_KEY,
                                                                                 SASL_AUTHENTICATE_KEY)
                    else "every service")
    return out


def served_table() -> str:
    rows = ["| API (key) | versions | served by | notes |", "|---|---|---|---|"]
    for key, (lo, hi, who) in sorted(served().items()):
        versions = str(lo) if lo == hi else f"{lo}-{hi}"
        rows.append(f"| {api_title(key)} ({key}) | {versions} | {who} | {NOTES.get(key, '')} |")
    return "\n".join(rows) + "\n"


def not_served_table() -> str:
    rows = ["| API (key) | why not |", "|---|---|"]
    for key in sorted(set(api_key_map) - set(served())):
        rows.append(f"| {api_title(key)} ({key}) | {NOT_SERVED.get(key, 'not served')} |")
    return "\n".join(rows) + "\n"


TABLES = {"served": served_table, "not-served": not_served_table}
_BLOCK = re.compile(r"(<!-- kafka-api-table: ([\w-]+) -->\n)(.*?)(<!-- /kafka-api-table -->)", re.S)


def render(text: str) -> str:
    """`text` with every kafka-api-table block regenerated (KeyError: unknown name)."""
    return _BLOCK.sub(lambda m: m.group(1) + TABLES[m.group(2)]() + m.group(4), text)


def blocks(text: str) -> list[str]:
    return [m.group(2) for m in _BLOCK.finditer(text)]
