"""faust-streaming, unmodified, in its own virtualenv (.compat/faust): an app with
processing_guarantee="exactly_once" (tests/compat/faust_copy.py) whose agent reads an
input topic and sends each value to an output topic. The worker is SIGKILLed
mid-stream and restarted; read_committed — by kcat and by the exactly SDK — holds
every input in the output exactly once.

What faust's exactly-once needs, and what it does not cover:
- It is per partition: faust commits the offsets of input partition p in the
  transaction of producer `<app>-<group>-p`, and sends an output record through the
  producer of the output partition its key maps to. The two meet only when input and
  output are co-partitioned (same partition count and partitioner: Kafka's murmur2,
  which faust's aiokafka uses), so the input is produced with librdkafka's murmur2.
- It sends in a transaction only to topics its consumer subscribes (their partitions
  known to its consumer, in its assignor's topic groups); to any other topic it sends
  with its plain producer, outside every transaction. So the app also reads its
  output (faust_copy.py's `audit` agent).
- A commit takes the offsets of the events the agent has acknowledged. A send made
  at once would put the output of the event still in progress into that transaction
  too, and a SIGKILL would then repeat that event (faust-streaming issue 517; a run
  without the next setting printed one duplicate of 3,000). With
  `stream_publish_on_commit=True` a send is attached to its event and published by
  the commit of that event's offset, in the same transaction.
"""
from __future__ import annotations

import uuid

import pytest

from .support import HERE, compat_python, kill_after, new_topic, produce_ids, \
    read_committed_kcat, read_committed_sdk, run_until_copied, size, start

pytestmark = pytest.mark.integration


@pytest.mark.timeout(size(420, 1200))
def test_faust_exactly_once_agent_through_a_sigkill(kc, tmp_path):
    """300 ids (3,000 under `make compat`); the worker is SIGKILLed once it has
    processed a third of them and restarted with the same app id."""
    python = compat_python("faust")
    count = size(300, 3000)
    source, sink = new_topic(kc, prefix="faust-in"), new_topic(kc, prefix="faust-out")
    expected = produce_ids(kc, source, count, partitioner="murmur2_random")
    app_id = f"faust-copy-{uuid.uuid4().hex[:8]}"
    args = [str(python), str(HERE / "faust_copy.py"), app_id, kc.kafka_bootstrap_servers, source, sink,
            str(tmp_path / "faust-data")]
    log = tmp_path / "faust.log"
    processed = kill_after(start(args, log, cwd=tmp_path), count // 3, 240, word="copied")
    print(f"SIGKILLed the worker after it printed copied {processed}")
    run_until_copied(args, log, kc, sink, expected, size(300, 900), cwd=tmp_path)
    by_kcat, by_sdk = read_committed_kcat(kc, sink), read_committed_sdk(kc, sink)
    assert sorted(by_kcat) == sorted(by_sdk)
    duplicates = len(by_kcat) - len(set(by_kcat))
    print(f"faust copy, read_committed (kcat and exactly SDK): {len(by_kcat)} records, {len(set(by_kcat))} distinct, "
          f"duplicates {duplicates}")
    assert set(by_kcat) == set(expected)
    assert duplicates == 0
