"""kafka-python 3.0 and aiokafka, unmodified, each running the exactly-once
consume-transform-produce copier its documentation describes
(tests/compat/python_copiers.py) through a SIGKILL and a restart with the same
transactional id: read_committed — by kcat and by the exactly SDK — holds every id
exactly once. confluent-kafka's copier is the demo's pipeline
(tests/integration/test_kafka_clients.py::test_purchases_pipeline_with_confluent_kafka),
kcat's own reads are also in that module (test_kcat_metadata_and_read_committed)."""
from __future__ import annotations

import sys
import uuid

import pytest

from .support import HERE, exactly_once, kill_after, new_topic, produce_ids, read_committed_kcat, \
    read_committed_sdk, run_to_end, size, start

pytestmark = pytest.mark.integration


@pytest.mark.timeout(size(300, 1200))
@pytest.mark.parametrize("client", ["kafka-python", "aiokafka"])
def test_transactional_copy_through_a_sigkill(kc, client, tmp_path):
    """300 ids (3,000 under `make compat`) from a 3-partition topic to another; the
    copier is SIGKILLed after committing a third and restarted with the same
    transactional id and group."""
    count = size(300, 3000)
    source, sink = new_topic(kc, prefix="py-in"), new_topic(kc, prefix="py-out")
    expected = produce_ids(kc, source, count)
    suffix = uuid.uuid4().hex[:8]
    args = [sys.executable, str(HERE / "python_copiers.py"), client, kc.kafka_bootstrap_servers, source, sink,
            f"{client}-group-{suffix}", f"{client}-copier-{suffix}"]
    log = tmp_path / "copier.log"
    committed = kill_after(start(args, log), count // 3, 240)
    print(f"{client}: SIGKILLed the copier after it printed committed {committed}")
    out = run_to_end(start(args, log), size(240, 900), log)
    assert "copied everything" in out
    exactly_once(read_committed_kcat(kc, sink), expected, f"{client} copy, kcat read_committed")
    exactly_once(read_committed_sdk(kc, sink), expected, f"{client} copy, exactly SDK read_committed")
