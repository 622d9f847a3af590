"""What every role of the cluster must agree on, defined once: the names of the
internal topics and the deadlines of the wire.

Internal topics (Kafka's `Topic.TRANSACTION_STATE_TOPIC_NAME` and
`Topic.GROUP_METADATA_TOPIC_NAME`): the transaction coordinators' log
(`TRANSACTION_STATE_TOPIC`) and the group coordinators' log (`CONSUMER_OFFSETS_TOPIC`).
Every module of `services/` names them through these constants, in code, log
messages and metric help alike.

Deadlines, WriteTxnMarkers (docs/design.md, "Two-phase commit with markers"): with transaction
version 1 the markers keep the producer's epoch, so the producer's next transaction has
the same PID and epoch, and a marker request that got no answer and still runs at its
partition leader could end that next transaction early. So:

- the transaction coordinator waits `WRITE_TXN_MARKERS_TIMEOUT_MS` for an answer;
- a partition leader appends no marker of a request later than
  `MARKER_LEADER_DEADLINE_MS` after the request arrived (`marker_leader_deadline_s`),
  counted from its arrival, before any interceptor (a quota mute, authentication)
  held it;
- after a marker request got no answer, the coordinator keeps the transaction in
  PrepareCommit / PrepareAbort, and the next one from starting, for
  `marker_coordinator_wait_ms()` after a retry wrote the marker: the leader's deadline
  plus `MARKER_DEADLINE_MARGIN_MS`. The unanswered request arrived, if at all, before
  the retry (ahead of it on the same stream, or before its stream broke), so its
  leader deadline ended before the coordinator's wait by at least the margin, which
  absorbs what lies between the leader's deadline check and its append (an event-loop
  turn, a lease confirmation bounded by the same deadline).

Deadline, CoordinatorProduce: a coordinator's append to its internal topic (acks=all)
may take `INTERNAL_APPEND_TIMEOUT_MS` at the partition leader unless the caller gives its
own (the group coordinator's commits wait `offsets.commit.timeout.ms`); the transaction
coordinator's appends to `TRANSACTION_STATE_TOPIC` use it (Kafka's TransactionStateManager
appends with the broker's `request.timeout.ms`, 30 s by default).

`REQUEST_ARRIVAL_S` carries the arrival of the request being handled (monotonic s,
`time.monotonic`), set by the outermost server interceptor
(services.common.metrics.RpcMetricsInterceptor) for direct and tunneled calls alike;
the servicers read it.
"""
from __future__ import annotations

import contextvars

# The transaction log: one record per state change of a transactional.id (design doc
# "Transaction Log").
TRANSACTION_STATE_TOPIC = "__transaction_state"
# The offsets log: committed offsets and group metadata (design doc "Consumer Coordinator").
CONSUMER_OFFSETS_TOPIC = "__consumer_offsets"
# The coordinator kind ("txn", "group") that owns each internal topic's partitions.
INTERNAL_TOPIC_FOR_KIND = {"txn": TRANSACTION_STATE_TOPIC, "group": CONSUMER_OFFSETS_TOPIC}

# How long the transaction coordinator waits for a WriteTxnMarkers answer (ms).
WRITE_TXN_MARKERS_TIMEOUT_MS = 30_000
# A partition leader appends no marker of a WriteTxnMarkers request later than this
# after the request's arrival (ms).
MARKER_LEADER_DEADLINE_MS = 25_000
# How much longer than the leader's deadline the coordinator waits out an unanswered
# marker request under transaction version 1 (ms).
MARKER_DEADLINE_MARGIN_MS = 5_000

# How long a partition leader may take to append a coordinator's batch to an internal
# topic with acks=all, when the caller gives no deadline of its own (ms).
INTERNAL_APPEND_TIMEOUT_MS = 30_000

# Monotonic s (time.monotonic) at which the request being handled arrived; None
# outside a request.
REQUEST_ARRIVAL_S: contextvars.ContextVar[float | None] = contextvars.ContextVar("request_arrival_s",
                                                                                  default=None)


def marker_leader_deadline_s(arrival_s: float) -> float:
    """The monotonic s after which a partition leader appends no marker of a
    WriteTxnMarkers request that arrived at `arrival_s` (monotonic s)."""
    return arrival_s + MARKER_LEADER_DEADLINE_MS / 1000


def marker_coordinator_wait_ms() -> int:
    """How long (ms) the coordinator keeps a transaction version 1 transaction from
    completing after a retry wrote the marker of a request that got no answer: the
    leader's deadline plus the margin."""
    return MARKER_LEADER_DEADLINE_MS + MARKER_DEADLINE_MARGIN_MS
