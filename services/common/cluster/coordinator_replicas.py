"""Where a coordinator-led internal partition's replicas are (metadata.version 3;
docs/design/coordinator-local-logs.md, "Who leads, and the ZooKeeper layout").

From level 3 the owner of a `TRANSACTION_STATE_TOPIC` partition is its first replica,
and the controller moves leadership to it once it is in sync (Kafka's preferred-replica
election). A claim writes the new owner first in the topic znode's replica list, in the
same ZooKeeper multi-op as the claim itself, and lists under `"removing"` the replica
that leaves so that the replication factor stays (KIP-455's removing replicas): the
previous owner, or on the first claim at level 3 the last partition-leader replica. The
controller drops the removing replicas once the first replica leads (`plan_removal`).

Pure functions: the ZooKeeper reads and writes are in ownership.py (claims) and
controller.py (removals).
"""
from __future__ import annotations

from typing import Sequence

# The metadata.version from which coordinators lead their internal partitions.
COORDINATOR_LED_LEVEL = 3


def claim_assignment(replicas: Sequence[str], removing: Sequence[str], owner: str,
                     previous_owner: str | None) -> tuple[list[str], list[str]] | None:
    """The (replicas, removing) of an internal partition once `owner` claims it, or
    None when `owner` is its first replica already.

    replicas: the assigned replica node ids, first one first; removing: those already
    leaving (an unfinished move); owner: the claiming coordinator's node id;
    previous_owner: the node id the claim znode named before (None: no claim yet).
    The replicas that stay (not removing) keep their number: `owner` joins them
    first, and the previous owner leaves when it is one of them, else the last of them
    (the first claim at level 3: a partition-leader replica), unless `owner` already
    was one."""
    if replicas and replicas[0] == owner:
        return None
    staying = [r for r in replicas if r not in removing]
    leaving = [r for r in removing if r != owner and r in replicas]
    if owner not in staying and staying:
        out = previous_owner if previous_owner in staying and previous_owner != owner else staying[-1]
        leaving.append(out)
    new = [owner] + [r for r in replicas if r != owner]
    return new, leaving


def with_assignment(body: dict, partition: int, replicas: Sequence[str], removing: Sequence[str]) -> dict:
    """A copy of a topic znode's `body` in which `partition` has `replicas` and, under
    `"removing"`, `removing` (the field is left out when no partition has any)."""
    key = str(partition)
    leaving = {k: v for k, v in (body.get("removing") or {}).items() if k != key}
    if removing:
        leaving[key] = list(removing)
    out = {**body, "partitions": {**body["partitions"], key: list(replicas)}}
    out.pop("removing", None)
    if leaving:
        out["removing"] = leaving
    return out


def plan_removal(replicas: Sequence[str], removing: Sequence[str], leader: str | None,
                 isr: Sequence[str], leader_current: bool) -> tuple[list[str], tuple[str, ...]] | None:
    """The (replicas, ISR) of a partition once its removing replicas are dropped, or
    None while they must stay: nothing to drop, the first replica does not lead, or its
    leadership is not current (`leader_current` False: the leader's session ended, or it
    registered again since the state was written, so an election comes first), or a
    replica that stays is out of the ISR (KIP-455: a move completes once every target
    replica is in sync; until then the leaving replicas may hold copies the ISR needs).
    replicas / removing / isr: node ids; leader: the current leader (None: offline)."""
    gone = [r for r in removing if r in replicas]
    if not gone or not replicas or leader != replicas[0] or leader in gone or not leader_current:
        return None
    staying = [r for r in replicas if r not in gone]
    if any(r not in isr for r in staying):
        return None
    return staying, tuple(r for r in isr if r not in gone)
