"""What /metrics shows and costs, on real processes of the default secured dev cluster
(`exactly-dev up --security`; docs/design/metrics.md, "Metrics and tenant names"):
/metrics answers before any authentication (plain HTTP, no certificate), so

- it names no consumer group (nor user topic) by default: a group whose offsets are
  committed appears as group="(hidden)", summed with the others, as topics already do;
- scrapers cannot slow the services' clients: 8 scrapers fetching /metrics of a
  partition leader leading 200 partitions as fast as they can leave another client's
  produce p50 within 2x of its value before (the least of three rounds each, in the
  same run) and the leader's CPU within 10 % of a core of its idle use: scrapes are
  answered at most 2 a second, in turn (they were answered as fast as they came: 26 %
  of a core for 8 scrapers).
"""
from __future__ import annotations

import statistics
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest

from exactly import AclBinding, NewTopic
from exactly_tools.certs import CertificateAuthority
from exactly_wire import records
from exactly_wire.clock import wall_clock_ms
from exactly_wire.security import TransportSecurity, secure_channel
from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pbg
from bench.common import cpu_seconds
from clusters import admin_client, certificate_conf, chrooted_cluster
from waiting import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def sec(zk, tmp_path_factory):
    c = chrooted_cluster(zk, tmp_path_factory.mktemp("metrics-exposure"), "metricsexp", security=True, leaders=1)
    CertificateAuthority.load(c.dir / "certs").issue("alice", client=True)
    yield c
    c.down()


def scrape(c, service: str) -> str:
    with urllib.request.urlopen(f"http://{c.services[service].metrics_address}/metrics", timeout=30) as r:
        return r.read().decode()


def stub(c, who: str, kind, service: str):
    return kind(secure_channel(c.services[service].address, TransportSecurity.from_conf(certificate_conf(c, who)),
                               []))


def test_metrics_name_no_consumer_group(sec):
    group, topic = f"secret-group-{uuid.uuid4().hex[:6]}", f"secret-topic-{uuid.uuid4().hex[:6]}"
    with admin_client(sec) as a:
        a.create_topics([NewTopic(topic, 1, 1)])
    admin_groups = stub(sec, "admin", pbg.GroupCoordinatorStub, "group-0")
    wait_for(lambda: admin_groups.OffsetCommit(pb.OffsetCommitRequest(group_id=group, generation_id=-1, topics=[
        pb.OffsetCommitTopic(name=topic, partitions=[pb.OffsetCommitPartition(partition=0, committed_offset=0)])]),
        timeout=20).topics[0].partitions[0].error_code == 0, 30, "the group's offset committed")
    def committed_series() -> str | None:
        text = scrape(sec, "group-0")
        return text if "exactly_group_committed_offset{" in text else None
    text = wait_for(committed_series, 30, "the committed offset's series")
    series = [line for line in text.splitlines() if line.startswith("exactly_group_")]
    print("\n".join(s for s in series if "{group=" in s))
    assert group not in text and topic not in text
    assert any('group="(hidden)"' in line for line in series if line.startswith("exactly_group_committed_offset"))


def _produce_p50_ms(producer, topic: str, n: int = 300) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        r = producer.Produce(pb.ProduceRequest(acks=1, timeout_ms=10000, topics=[pb.TopicProduceData(
            name=topic, partitions=[pb.PartitionProduceData(partition=0, records=records.encode_batch(
                [(None, b"a", (), wall_clock_ms())]))])]), timeout=30)
        times.append((time.perf_counter() - start) * 1000)
        assert r.topics[0].partitions[0].error_code == 0
    return statistics.median(times)


# One scraping process: argv the metrics address; fetches /metrics as fast as it can
# until its stdin closes, then prints how many scrapes it made.
_SCRAPER = """
import sys, threading, urllib.request
address, done, count = sys.argv[1], threading.Event(), 0
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
while not done.is_set():
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=30) as r:
        r.read()
    count += 1
print(count)
"""


def test_scrapers_do_not_slow_clients(sec):
    topic = f"alice-{uuid.uuid4().hex[:6]}"
    with admin_client(sec) as a:
        a.create_topics([NewTopic(topic, 1, 1)] + [NewTopic(f"load-{uuid.uuid4().hex[:6]}-{i}", 50, 1)
                                                   for i in range(4)])
        a.create_acls([AclBinding("User:alice", "Topic", topic, "All")])
    alice = stub(sec, "alice", pbg.PartitionLeaderStub, "pl-0")

    def writable() -> bool:
        try:
            return _produce_p50_ms(alice, topic, 1) >= 0
        except Exception:  # noqa: BLE001 - PERMISSION_DENIED until the ACL watch fired, no leader yet
            return False
    wait_for(writable, 30, "alice's topic writable")
    wait_for(lambda: scrape(sec, "pl-0").count("exactly_partition_high_watermark") > 0, 30, "the partitions served")
    before = min(_produce_p50_ms(alice, topic) for _ in range(3))
    pid = sec.services["pl-0"].pid
    idle_start, idle_cpu = time.monotonic(), cpu_seconds(pid)
    time.sleep(5)
    idle = (cpu_seconds(pid) - idle_cpu) / (time.monotonic() - idle_start)
    scrapers = [subprocess.Popen([sys.executable, "-c", _SCRAPER, sec.services["pl-0"].metrics_address],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(8)]
    started = time.monotonic()
    try:
        time.sleep(1)
        scraped_start, scraped_cpu = time.monotonic(), cpu_seconds(pid)
        time.sleep(5)
        scraped = (cpu_seconds(pid) - scraped_cpu) / (time.monotonic() - scraped_start)
        during = min(_produce_p50_ms(alice, topic) for _ in range(3))
    finally:
        counts = []
        for s in scrapers:
            out, _ = s.communicate("", timeout=60)
            counts.append(int(out or 0))
    scrapes = [sum(counts)]
    rate = scrapes[0] / (time.monotonic() - started)
    print(f"alice's produce p50 {before:.2f} ms before, {during:.2f} ms while 8 scrapers fetch /metrics "
          f"({rate:.0f} scrapes/s); the leader's CPU {idle:.0%} of a core idle, {scraped:.0%} while scraped")
    assert scraped <= idle + 0.1, f"the leader used {scraped:.0%} of a core while scraped, {idle:.0%} idle"
    assert during <= 2 * before, f"produce p50 {during:.2f} ms during the scrapes, {before:.2f} ms before"
