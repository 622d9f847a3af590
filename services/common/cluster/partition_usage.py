"""How many partitions the topics of each principal hold, kept in ZooKeeper so that a
partition quota (`max_partitions`, services.common.security.quotas) is reserved and the
topic created in one step (docs/design.md, "Quotas").

One znode per principal, `/exactly/config/partitions/<principal, URL-quoted>`, JSON
`{"version": 1, "partitions": n}`, from metadata.version 2 on (features.py): versions
before it neither write nor read these counts, so a count kept while they still
created topics would fall short. Below that level (`enabled()` false) nothing is
written, and a quota is checked against a count of the topic znodes at each creation
(as versions before it did: concurrent creations may pass it). A count without a
version field was written before the level existed and is counted again. Every CreateTopics and CreatePartitions by (or on a topic of) a
principal writes its new count in the same ZooKeeper multi-op that writes the topic,
checking the znode's version: of concurrent creations, on one process or several, one
commits and the others read the count again and check their quota against it. A
check against a cache instead let 16 concurrent CreateTopics under a quota of 4 create
64 partitions. DeleteTopics lowers the count after the topic is gone (a process killed
between the two leaves it too high: a refusal first counts again from the topic
znodes, at most once a minute per principal, and repairs it). A principal without a
znode yet (topics created before it existed) is counted from the topic znodes once.
"""
from __future__ import annotations

import json
import logging
import time
from typing import Callable
from urllib.parse import quote

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from . import features

log = logging.getLogger(__name__)

USAGE = "/exactly/config/partitions"
RECOUNT_INTERVAL_S = 60.0  # the least time between two recounts of one principal's topics on a refusal


COUNT_FORMAT = "zk-partition-count"


def _encode(partitions: int) -> bytes:
    return json.dumps({"version": features.FORMATS[COUNT_FORMAT].newest, "partitions": partitions}).encode()


class PartitionUsage:
    """zk: a started KazooClient (its default ACL is the cluster's); recount(principal)
    -> the partitions of the topics whose znode names `principal` as creator, read from
    ZooKeeper; clock: monotonic seconds; enabled() -> whether the finalized
    metadata.version lets processes keep the counts (module docstring)."""

    def __init__(self, zk, recount: Callable[[str], int], clock: Callable[[], float] = time.monotonic,
                 enabled: Callable[[], bool] = lambda: True):
        self.zk = zk
        self.recount = recount
        self.clock = clock
        self.enabled = enabled
        self._recounted: dict[str, float] = {}
        self._parent_made = False

    @staticmethod
    def path(principal: str) -> str:
        return f"{USAGE}/{quote(principal, safe='')}"

    def read(self, principal: str) -> tuple[int, int | None]:
        """(partitions of `principal`'s topics, znode version; None when there is no
        znode yet or counts are not `enabled`, the count then coming from the topic
        znodes). Raises features.UnknownFormatVersion for a count of a newer version."""
        if not self.enabled():
            return self.recount(principal), None
        if not self._parent_made:
            self.zk.ensure_path(USAGE)
            self._parent_made = True
        try:
            data, stat = self.zk.get(self.path(principal))
        except NoNodeError:
            return self.recount(principal), None
        try:
            body = json.loads(data)
            if "version" not in body:  # written before counts were versioned: not trusted
                return self.recount(principal), stat.version
            features.check_readable(COUNT_FORMAT, int(body["version"]), self.path(principal))
            return int(body["partitions"]), stat.version
        except (ValueError, KeyError, TypeError) as exc:
            if isinstance(exc, features.UnknownFormatVersion):
                raise
            log.warning("unreadable partition count of %s; counting its topics", principal)
            return self.recount(principal), stat.version

    def write(self, tx, principal: str, partitions: int, version: int | None) -> bool:
        """Add to ZooKeeper transaction `tx` the write of `principal`'s new count, checked
        against the `version` read (None: the znode must not exist yet); nothing when
        counts are not `enabled`. Returns whether it added the write."""
        if not self.enabled():
            return False
        data = _encode(partitions)
        if version is None:
            tx.create(self.path(principal), data)
        else:
            tx.set_data(self.path(principal), data, version=version)
        return True

    @staticmethod
    def lost_race(result) -> bool:
        """Whether the count's write in a committed multi-op failed because another
        writer changed it first (read it again and retry)."""
        return isinstance(result, (BadVersionError, NodeExistsError, NoNodeError))

    def refusal(self, principal: str, used: int, version: int | None, more: int, limit: float | None
                ) -> tuple[str | None, int, int | None]:
        """(why `more` partitions pass `principal`'s `limit`, or None; the count and
        version to go on with). Before refusing, the count is read again from the topic
        znodes (at most every RECOUNT_INTERVAL_S) and repaired when it drifted."""
        if limit is None or more <= 0 or used + more <= limit:
            return None, used, version
        now = self.clock()
        if now - self._recounted.get(principal, -RECOUNT_INTERVAL_S) >= RECOUNT_INTERVAL_S:
            self._recounted[principal] = now
            if len(self._recounted) > 10_000:
                self._recounted = {principal: now}
            actual = self.recount(principal)
            if actual != used and version is not None:
                try:
                    stat = self.zk.set(self.path(principal), _encode(actual), version=version)
                    log.info("partition count of %s repaired: %d -> %d", principal, used, actual)
                    used, version = actual, stat.version
                except (BadVersionError, NoNodeError):
                    pass  # changed meanwhile: the caller's multi-op fails and reads it again
            elif version is None:
                used = actual
            if used + more <= limit:
                return None, used, version
        return (f"{principal} has {used} partitions; {more} more would pass its partition quota of {int(limit)} "
                f"(max_partitions)"), used, version

    def adjust(self, principal: str, delta: int) -> None:
        """Add `delta` to `principal`'s count (DeleteTopics: the partitions removed), by
        compare-and-set; nothing when it has no znode (counted from the topics then) or
        counts are not `enabled`."""
        if not self.enabled():
            return
        for _ in range(20):
            try:
                data, stat = self.zk.get(self.path(principal))
                body = json.loads(data)
                count = max(int(body["partitions"]) + delta, 0) if "version" in body else self.recount(principal)
                self.zk.set(self.path(principal), _encode(count), version=stat.version)
                return
            except NoNodeError:
                return
            except BadVersionError:
                continue
            except (ValueError, KeyError, TypeError):
                self.zk.set(self.path(principal), _encode(self.recount(principal)))
                return
        log.warning("partition count of %s kept changing; left for the next recount", principal)
