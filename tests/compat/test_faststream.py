"""FastStream, unmodified, in its own virtualenv (.compat/faststream), with both of
its Kafka backends: faststream.kafka (aiokafka) and faststream.confluent
(confluent-kafka). Its idiomatic app (tests/compat/faststream_app.py) — a subscriber
whose return value a publisher sends on — is at-least-once: SIGKILLed mid-stream and
restarted, every input reaches the output, some possibly twice. FastStream has no
transaction API: a broker given transactional_id cannot publish, and each backend's
client says why before anything reaches the cluster."""
from __future__ import annotations

import uuid

import pytest

from .support import HERE, compat_python, kill_after, new_topic, produce_ids, read_committed_kcat, run_to_end, \
    run_until_copied, size, start

pytestmark = pytest.mark.integration

BACKENDS = ["kafka", "confluent"]


@pytest.mark.timeout(size(300, 900))
@pytest.mark.parametrize("backend", BACKENDS)
def test_faststream_at_least_once_copy_through_a_sigkill(kc, backend, tmp_path):
    """150 ids (2,000 under `make compat`); the app is SIGKILLed after handling a third
    and restarted in the same group: the output holds every id at least once."""
    python = compat_python("faststream")
    count = size(150, 2000)
    source, sink = new_topic(kc, prefix="fs-in"), new_topic(kc, prefix="fs-out")
    expected = produce_ids(kc, source, count)
    args = [str(python), str(HERE / "faststream_app.py"), "copy", backend, kc.kafka_bootstrap_servers, source, sink,
            f"fs-{backend}-{uuid.uuid4().hex[:8]}"]
    log = tmp_path / "faststream.log"
    handled = kill_after(start(args, log), count // 3, 180, word="handled")
    print(f"{backend}: SIGKILLed the app after it printed handled {handled}")
    run_until_copied(args, log, kc, sink, expected, size(180, 600))
    got = read_committed_kcat(kc, sink)
    print(f"{backend}: {len(got)} records, {len(set(got))} distinct, duplicates {len(got) - len(set(got))}")
    assert set(got) == set(expected)


REFUSALS = {
    # aiokafka's producer starts the transactional id (InitProducerId) and then refuses a
    # send outside producer.transaction(), which FastStream never opens.
    "kafka": "refused: IllegalOperation: Can't send messages while not in transaction",
    # librdkafka's producer with transactional.id refuses to produce before
    # init_transactions(), which FastStream never calls.
    "confluent": "refused: KafkaException: KafkaError{code=_STATE",
}


@pytest.mark.parametrize("backend", BACKENDS)
def test_faststream_transactional_publish_is_refused_by_the_client(kc, backend, tmp_path):
    python = compat_python("faststream")
    topic = new_topic(kc, partitions=1, prefix="fs-tx")
    log = tmp_path / "faststream.log"
    out = run_to_end(start([str(python), str(HERE / "faststream_app.py"), "transactional", backend,
                            kc.kafka_bootstrap_servers, topic, f"fs-tx-{uuid.uuid4().hex[:8]}"], log), 180, log)
    print(backend, out.strip())
    assert out.startswith(REFUSALS[backend]), out
    assert read_committed_kcat(kc, topic, "read_uncommitted") == []
