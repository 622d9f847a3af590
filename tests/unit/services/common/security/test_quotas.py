"""Client quota math and resolution (services.common.security.quotas; Kafka's KIP-13 Rate and
throttle time, KIP-124 request percentage, KIP-599 token bucket, the
ClientQuotaManager precedence order), on a manual clock (exactly.testing.MockTime)."""
from __future__ import annotations

import pytest

from exactly.testing import MockTime
from services.common.security.quotas import (CONSUMER_BYTE_RATE, CONTROLLER_MUTATION_RATE, DEFAULT, MAX_PARTITIONS,
                                             PRODUCER_BYTE_RATE, REQUEST_PERCENTAGE, QuotaEntity, QuotaError,
                                             QuotaManager, Rate, TokenBucket, alter, decode_configs, encode_configs,
                                             grpc_client_id, resolve, throttle_time_ms)


def test_rate_measures_over_at_least_samples_minus_one_windows():
    rate = Rate(samples=11, window_ms=1000)
    rate.record(1000, 0)
    # One sample only: the window counts as 10 full windows, so a first burst is not
    # measured as an unbounded rate.
    assert rate.window_size_ms(0) == 10_000
    assert rate.measure(0) == pytest.approx(100.0)
    rate.record(1000, 15_000)  # the first sample fell out of the 11 s horizon
    assert rate.measure(15_000) == pytest.approx(100.0)
    rate.record(1000, 15_500)
    assert rate.measure(15_500) == pytest.approx(2000 / 10.5)  # 0.5 s + the 10 windows a young rate counts


def test_rate_keeps_at_most_samples_windows():
    rate = Rate(samples=3, window_ms=1000)
    for t in range(0, 10_000, 100):
        rate.record(10, t)
    # 3 samples of 1 s, 10 records of 10 each: 300 over the 2.9 s they span.
    assert rate.measure(9_900) == pytest.approx(300 / 2.9)


def test_throttle_time_is_when_the_rate_is_back_at_the_quota():
    rate = Rate(samples=11, window_ms=1000)
    rate.record(2000, 0)  # 200/s measured over 10 s
    assert throttle_time_ms(rate, 200.0, 0) == 0
    assert throttle_time_ms(rate, 250.0, 0) == 0
    # Kafka's (200 - 100) / 100 * 10 s = 10 s would leave the rate at 2000 / 10 s: the
    # measured window stays between 10 and 11 s until the sample ages out at 11 s.
    assert throttle_time_ms(rate, 100.0, 0) == 11_001


@pytest.mark.parametrize("seed", range(20))
def test_throttle_time_is_the_first_time_the_rate_is_at_the_quota(seed):
    import random
    rnd = random.Random(seed)
    rate = Rate(samples=rnd.choice([2, 3, 11]), window_ms=rnd.choice([100, 1000]))
    now = 0.0
    for _ in range(rnd.randrange(1, 200)):
        now += rnd.uniform(0, 300)
        rate.record(rnd.uniform(0, 5000), now)
    quota = rnd.uniform(100, 20_000)
    throttle = throttle_time_ms(rate, quota, now)
    if throttle == 0:
        assert rate.measure(now) <= quota
        return
    assert rate.measure(now + throttle) <= quota * 1.0001
    # Not much earlier: sampled every ms over the last tenth of the wait, the rate was above.
    assert all(rate.measure(now + t) > quota for t in range(max(0, int(throttle * 0.9) - 2), throttle - 2))


@pytest.mark.parametrize("quota, chunk", [(100_000.0, 16_384), (1_048_576.0, 65_536), (10_000.0, 1_000)])
def test_a_client_honouring_throttle_converges_to_the_quota(quota, chunk):
    """A producer that sends as fast as it may (waiting out each throttle time, as
    KIP-219 clients and the muted channel make it) gets the quota within 5 % over a
    minute, after the first windows."""
    clock = MockTime()
    manager = QuotaManager(samples=11, window_s=1, clock=clock.now_ms)
    manager.set_configs({QuotaEntity("alice", None): {PRODUCER_BYTE_RATE: quota}})
    start = clock.now_ms()
    sent_after_warmup, warmup_end = 0, start + 20_000
    while clock.now_ms() < start + 80_000:
        throttle = manager.record("User:alice", "app", PRODUCER_BYTE_RATE, chunk)
        if clock.now_ms() >= warmup_end:
            sent_after_warmup += chunk
        clock.advance(max(throttle, 1))  # 1 ms to send the next request
    achieved = sent_after_warmup / ((clock.now_ms() - warmup_end) / 1000)
    assert achieved == pytest.approx(quota, rel=0.05)


def test_unthrottled_below_the_quota():
    clock = MockTime()
    manager = QuotaManager(clock=clock.now_ms)
    manager.set_configs({QuotaEntity("alice", None): {PRODUCER_BYTE_RATE: 1000.0}})
    for _ in range(100):
        assert manager.record("User:alice", "", PRODUCER_BYTE_RATE, 50) == 0  # 500 B/s
        clock.advance(100)


def test_precedence_is_kafkas():
    """user+client, user+<default>, user, <default>+client, <default>+<default>,
    <default> user, client, <default> client: each level wins over those after it."""
    levels = [QuotaEntity("alice", "app"), QuotaEntity("alice", DEFAULT), QuotaEntity("alice", None),
              QuotaEntity(DEFAULT, "app"), QuotaEntity(DEFAULT, DEFAULT), QuotaEntity(DEFAULT, None),
              QuotaEntity(None, "app"), QuotaEntity(None, DEFAULT)]
    configs = {e: {PRODUCER_BYTE_RATE: float(i + 1)} for i, e in enumerate(levels)}
    for i in range(len(levels)):
        found = resolve(configs, "alice", "app", PRODUCER_BYTE_RATE)
        assert found is not None and found[1] == float(i + 1), levels[i]
        del configs[levels[i]]
    assert resolve(configs, "alice", "app", PRODUCER_BYTE_RATE) is None


def test_each_key_resolves_on_its_own():
    configs = {QuotaEntity("alice", None): {PRODUCER_BYTE_RATE: 10.0},
               QuotaEntity(DEFAULT, None): {CONSUMER_BYTE_RATE: 20.0, PRODUCER_BYTE_RATE: 99.0}}
    assert resolve(configs, "alice", "", PRODUCER_BYTE_RATE)[1] == 10.0
    assert resolve(configs, "alice", "", CONSUMER_BYTE_RATE)[1] == 20.0
    assert resolve(configs, "bob", "", PRODUCER_BYTE_RATE)[1] == 99.0


def test_a_managers_answers_follow_every_change_of_the_configs():
    """QuotaManager keeps each caller's resolution until the configs change: a
    new, changed or removed quota applies to the very next request."""
    manager = QuotaManager()
    assert manager.quota("User:alice", "app", PRODUCER_BYTE_RATE) is None
    manager.set_configs({QuotaEntity(DEFAULT, None): {PRODUCER_BYTE_RATE: 10.0}})
    assert manager.quota("User:alice", "app", PRODUCER_BYTE_RATE)[1] == 10.0
    assert manager.quota("User:alice", "app", PRODUCER_BYTE_RATE)[1] == 10.0  # answered from the resolutions
    manager.set_configs({QuotaEntity("alice", "app"): {PRODUCER_BYTE_RATE: 5.0},
                         QuotaEntity(DEFAULT, None): {PRODUCER_BYTE_RATE: 10.0}})
    assert manager.quota("User:alice", "app", PRODUCER_BYTE_RATE)[1] == 5.0
    assert manager.quota("User:bob", "app", PRODUCER_BYTE_RATE)[1] == 10.0
    manager.set_configs({})
    assert manager.quota("User:alice", "app", PRODUCER_BYTE_RATE) is None


def test_a_user_quota_is_shared_by_its_clients_and_a_default_is_per_user():
    clock = MockTime()
    manager = QuotaManager(samples=11, window_s=1, clock=clock.now_ms)
    manager.set_configs({QuotaEntity("alice", None): {PRODUCER_BYTE_RATE: 100.0},
                         QuotaEntity(DEFAULT, None): {PRODUCER_BYTE_RATE: 100.0}})
    assert manager.record("User:alice", "one", PRODUCER_BYTE_RATE, 1000) == 0  # 100/s over 10 s: at the quota
    assert manager.record("User:alice", "two", PRODUCER_BYTE_RATE, 1000) > 0  # the same sensor: 200/s
    assert manager.record("User:bob", "one", PRODUCER_BYTE_RATE, 1000) == 0  # bob's own sensor
    assert manager.record("User:carol", "one", PRODUCER_BYTE_RATE, 1000) == 0  # and carol's


def test_another_user_is_not_throttled_by_one_over_its_quota():
    clock = MockTime()
    manager = QuotaManager(clock=clock.now_ms)
    manager.set_configs({QuotaEntity("alice", None): {PRODUCER_BYTE_RATE: 100.0}})
    assert manager.record("User:alice", "", PRODUCER_BYTE_RATE, 100_000) > 0
    assert manager.record("User:bob", "", PRODUCER_BYTE_RATE, 100_000) == 0  # no quota of its own


def test_super_users_are_never_throttled():
    manager = QuotaManager(super_users=["User:pl-0"], clock=MockTime().now_ms)
    manager.set_configs({QuotaEntity(DEFAULT, None): {PRODUCER_BYTE_RATE: 1.0, MAX_PARTITIONS: 1.0}})
    assert manager.record("User:pl-0", "", PRODUCER_BYTE_RATE, 10**9) == 0
    assert manager.partition_quota("User:pl-0") is None
    assert manager.partition_quota("User:alice") == 1.0


def test_request_percentage_records_percent_seconds_and_caps_at_one_window():
    clock = MockTime()
    manager = QuotaManager(samples=11, window_s=1, clock=clock.now_ms)
    manager.set_configs({QuotaEntity("alice", None): {REQUEST_PERCENTAGE: 10.0}})
    # 0.5 s of handling in 10 s = 5 %: within 10 %.
    assert manager.record_request_time("User:alice", "", 0.5) == 0
    # 5 s more: 55 % measured, 45 % over: (55 - 10) / 10 * 10 s, capped at the 1 s window.
    assert manager.record_request_time("User:alice", "", 5.0) == 1000


def test_mutation_token_bucket():
    bucket = TokenBucket(quota=2.0, burst_s=10, now_ms=0)  # 20 partitions of burst
    assert bucket.throttle_ms(0) == 0
    bucket.record(25, 0)  # 5 below zero
    assert bucket.throttle_ms(0) == 2500  # 5 / 2 per second
    assert bucket.throttle_ms(2500) == 0
    assert bucket.throttle_ms(10**9) == 0 and bucket.tokens == 20  # never above the burst


def test_mutation_quota_refuses_while_negative():
    clock = MockTime()
    manager = QuotaManager(samples=2, window_s=1, clock=clock.now_ms)
    manager.set_configs({QuotaEntity("alice", None): {CONTROLLER_MUTATION_RATE: 5.0}})  # burst 10
    assert manager.mutation_throttle("User:alice", "") == 0
    assert manager.record_mutations("User:alice", "", 30) == 4000  # 20 below: 4 s
    assert manager.mutation_throttle("User:alice", "") == 4000
    clock.advance(4000)
    assert manager.mutation_throttle("User:alice", "") == 0
    assert manager.mutation_throttle("User:bob", "") == 0


def test_mute_window():
    clock = MockTime()
    manager = QuotaManager(clock=clock.now_ms)
    manager.mute("User:alice", "app", 300)
    assert manager.muted_ms("User:alice", "app") == 300
    assert manager.muted_ms("User:alice", "other") == 0
    clock.advance(301)
    assert manager.muted_ms("User:alice", "app") == 0


def test_entities_round_trip_and_bad_ones_are_refused():
    for e in (QuotaEntity("alice", None), QuotaEntity(DEFAULT, "app"), QuotaEntity(None, DEFAULT)):
        assert QuotaEntity.parse(e.key()) == e
    for key in ("", "user=", "group=x", "user=a,user=b", "user"):
        with pytest.raises(QuotaError):
            QuotaEntity.parse(key)
    with pytest.raises(QuotaError):
        QuotaEntity(None, None).validate()
    with pytest.raises(QuotaError):
        QuotaEntity("a,b", None).validate()


def test_alter_sets_removes_and_validates():
    alice = QuotaEntity("alice", None)
    configs = alter({}, alice, [(PRODUCER_BYTE_RATE, 1024), (CONSUMER_BYTE_RATE, 2048)])
    assert configs == {alice: {PRODUCER_BYTE_RATE: 1024.0, CONSUMER_BYTE_RATE: 2048.0}}
    configs = alter(configs, alice, [(PRODUCER_BYTE_RATE, None)])
    assert configs == {alice: {CONSUMER_BYTE_RATE: 2048.0}}
    assert alter(configs, alice, [(CONSUMER_BYTE_RATE, None)]) == {}  # nothing left: the entity goes
    for bad in [("producer_byte_rate", 0), ("producer_byte_rate", -1), ("producer_byte_rate", float("nan")),
                ("bytes_per_second", 5)]:
        with pytest.raises(QuotaError):
            alter({}, alice, [bad])


def test_znode_encoding_round_trips_and_skips_malformed_entries():
    configs = {QuotaEntity("alice", None): {PRODUCER_BYTE_RATE: 1024.0},
               QuotaEntity(DEFAULT, DEFAULT): {REQUEST_PERCENTAGE: 50.0}}
    assert decode_configs(encode_configs(configs)) == configs
    raw = b'{"user=alice": {"producer_byte_rate": 5}, "bogus": {"producer_byte_rate": 1},' \
          b' "user=bob": {"producer_byte_rate": -3}}'
    assert decode_configs(raw) == {QuotaEntity("alice", None): {PRODUCER_BYTE_RATE: 5.0}}
    assert decode_configs(b"not json") == {}
    assert decode_configs(None) == {}


def test_grpc_client_id_from_the_sdk_user_agent():
    assert grpc_client_id([("user-agent", "exactly/billing grpc-python/1.66.0 grpc-c/43.0.0")]) == "billing"
    assert grpc_client_id([("user-agent", "grpc-python/1.66.0")]) == ""
    assert grpc_client_id(()) == ""


def test_timed_counts_the_handlers_own_steps_not_its_waits():
    """On a clock that moves only when a step "works" (spin): the handler's own step
    is counted, another request's work while the handler waits is not."""
    import asyncio

    from services.common.security.quotas import Timed

    clock = MockTime(0)

    def spin(seconds: float) -> None:  # running on the event loop
        clock.advance(seconds * 1000)

    async def handler(gate: asyncio.Event):
        await gate.wait()  # waiting (for data, replication) while others run: not counted
        spin(0.05)  # the handler's own step: counted
        await asyncio.sleep(0)
        spin(0.01)  # and its next one
        return "done"

    async def _timed(timed):
        return await timed

    async def main():
        gate = asyncio.Event()
        timed = Timed(handler(gate), clock=clock.now_s)
        task = asyncio.ensure_future(_timed(timed))
        await asyncio.sleep(0)  # the handler parks on the gate
        spin(0.2)  # another request's work meanwhile
        gate.set()
        assert await task == "done"
        return timed.seconds

    seconds = asyncio.run(main())
    assert seconds == pytest.approx(0.06), seconds


def test_timed_passes_errors_and_cancellation_through():
    import asyncio

    from services.common.security.quotas import Timed

    async def failing():
        await asyncio.sleep(0)
        raise ValueError("bad request")

    async def waiting(started: asyncio.Event):
        started.set()
        await asyncio.Event().wait()  # never set: only cancellation ends it

    async def main():
        with pytest.raises(ValueError, match="bad request"):
            await Timed(failing())
        started = asyncio.Event()
        task = asyncio.ensure_future(_await(Timed(waiting(started))))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    async def _await(timed):
        return await timed

    asyncio.run(main())


# ---------------------------------------------------------------- enforcement whatever the client does
def _fixed_overhead(per_call_s: float = 0.0):
    from services.common.security.quotas import CallOverhead
    overhead = CallOverhead(cpu=lambda: 0.0, clock=lambda: 0.0)
    overhead.per_call_s = per_call_s
    return overhead


def test_a_user_quota_mutes_every_client_id_of_the_user():
    """The excess of a quota set on the user mutes the user: a client id it has not
    used before is held as well (its calls waited only per client id before)."""
    clock = MockTime()
    manager = QuotaManager(samples=11, window_s=1, clock=clock.now_ms, overhead=_fixed_overhead())
    manager.set_configs({QuotaEntity("mallory", None): {PRODUCER_BYTE_RATE: 100.0}})
    throttle = manager.record("User:mallory", "c1", PRODUCER_BYTE_RATE, 10_000)
    assert throttle > 0
    assert manager.muted_ms("User:mallory", "c1") == throttle
    assert manager.muted_ms("User:mallory", "fresh-c2") == throttle
    assert manager.muted_ms("User:alice", "c1") == 0
    clock.advance(throttle)
    assert manager.muted_ms("User:mallory", "fresh-c2") == 0


def test_fresh_client_ids_under_a_default_client_id_quota_share_one_budget():
    """<default> client-id quota of 100 B/s: 200 calls of 100 B, each with a client id
    never used before, are measured together (the principal's bucket of new client
    ids), not 200 fresh budgets; a client id used for a whole measurement gets its own."""
    clock = MockTime()
    manager = QuotaManager(samples=11, window_s=1, clock=clock.now_ms, overhead=_fixed_overhead())
    manager.set_configs({QuotaEntity(None, DEFAULT): {PRODUCER_BYTE_RATE: 100.0}})
    throttles = []
    for i in range(200):
        throttles.append(manager.record("User:mallory", f"fresh-{i}", PRODUCER_BYTE_RATE, 100))
        clock.advance(10)
    assert throttles[-1] > 10_000, throttles[-5:]  # 20,000 B in 2 s against 100 B/s: held for minutes
    assert manager.muted_ms("User:mallory", "fresh-201") > 10_000
    assert manager.muted_ms("User:alice", "fresh-201") == 0  # another principal's new client ids: its own
    # "steady" first seen now, used within its budget for a whole measurement: its own sensor then.
    manager.record("User:alice", "steady", PRODUCER_BYTE_RATE, 1)
    clock.advance(11_000)
    assert manager.record("User:alice", "steady", PRODUCER_BYTE_RATE, 50) == 0


def test_a_principal_follows_at_most_max_client_ids():
    from services.common.security.quotas import MAX_CLIENT_IDS_PER_USER
    clock = MockTime()
    manager = QuotaManager(samples=2, window_s=1, clock=clock.now_ms, overhead=_fixed_overhead())
    manager.set_configs({QuotaEntity(None, DEFAULT): {REQUEST_PERCENTAGE: 100.0}})
    for i in range(3 * MAX_CLIENT_IDS_PER_USER):
        manager.record_request_time("User:mallory", f"c{i}", 0.0)
    assert sum(len(v) for v in manager._first_seen.values()) == MAX_CLIENT_IDS_PER_USER
    assert manager.sensors() == 1  # every one of them new: the shared bucket only


def test_idle_sensors_expire_and_removed_quotas_drop_theirs():
    """Sensors idle for the expiration (Kafka: one hour) are dropped as requests go
    on; a quota removed drops its sensors at once."""
    clock = MockTime()
    manager = QuotaManager(samples=2, window_s=1, clock=clock.now_ms, sensor_expiration_ms=3_600_000,
                           overhead=_fixed_overhead())
    manager.set_configs({QuotaEntity(DEFAULT, None): {REQUEST_PERCENTAGE: 50.0}})
    for i in range(100):
        manager.record_request_time(f"User:u{i}", "", 0.001)
    assert manager.sensors() == 100
    clock.advance(3_600_001)
    manager.record_request_time("User:late", "", 0.001)
    assert manager.sensors() == 1
    manager.set_configs({})
    assert manager.sensors() == 0


def test_client_ids_are_bounded():
    from services.common.security.quotas import MAX_CLIENT_ID_LENGTH, client_id_error
    assert client_id_error("x" * MAX_CLIENT_ID_LENGTH) is None
    assert "at most 255" in client_id_error("x" * 30_000)


def test_refused_calls_are_charged_what_a_call_costs():
    """A call refused before its handler (throttled, denied) is charged the overhead
    of a call, so a flood of refused calls runs into request_percentage."""
    from services.common.security.quotas import charge_refused
    clock = MockTime()
    manager = QuotaManager(samples=11, window_s=1, clock=clock.now_ms, overhead=_fixed_overhead(0.0005))
    manager.set_configs({QuotaEntity("mallory", None): {REQUEST_PERCENTAGE: 10.0}})
    # 10 % of a handler thread measured over the first 10 s: 1 s of calls; 3,000 refused at 0.5 ms are 1.5 s.
    throttles = [charge_refused(manager, "User:mallory", "") for _ in range(3000)]
    assert throttles[0] == 0 and throttles[-1] > 0
    assert manager.muted_ms("User:mallory", "another") > 0


def test_call_overhead_is_the_cpu_outside_the_handlers_per_call():
    from services.common.security.quotas import CallOverhead
    cpu, clock = [10.0], MockTime(0)
    overhead = CallOverhead(interval_s=1.0, min_calls=100, cpu=lambda: cpu[0], clock=clock.now_s)
    for _ in range(199):
        assert overhead.add(0.0001) == 0.0
    cpu[0] += 0.2 + 200 * 0.0001  # 0.2 s outside the handlers over 200 calls
    clock.set_ms(1000)
    assert overhead.add(0.0001) == pytest.approx(0.001)
    # An interval with fewer calls (the process's background work would be charged to them) keeps it.
    cpu[0] += 5.0
    clock.set_ms(2500)
    assert overhead.add(0.0) == pytest.approx(0.001)


def test_a_held_call_whose_deadline_comes_first_is_answered_throttled_unhandled():
    import asyncio

    from services.common.security.quotas import QuotaInterceptor
    from exactly_wire.v1 import exactly_pb2 as pb

    clock = MockTime()
    manager = QuotaManager(clock=clock.now_ms, overhead=_fixed_overhead())
    manager.set_configs({QuotaEntity("mallory", None): {PRODUCER_BYTE_RATE: 100.0}})
    manager.record("User:mallory", "", PRODUCER_BYTE_RATE, 10_000)

    class Context:
        def invocation_metadata(self):
            return [("user-agent", "exactly/fresh grpc-python")]

        def time_remaining(self):
            return 0.04  # less than the answer margin: no wait

    request = pb.ProduceRequest(topics=[pb.TopicProduceData(name="t", partitions=[
        pb.PartitionProduceData(partition=0, records=b"x")])])
    response = asyncio.run(QuotaInterceptor(manager).admit("User:mallory", "PartitionLeader/Produce", request,
                                                           Context()))
    assert response.topics[0].partitions[0].error_code == 89  # THROTTLING_QUOTA_EXCEEDED
    assert response.throttle_time_ms >= manager.muted_ms("User:mallory", "") - 1


@pytest.mark.parametrize("method", ["PartitionLeader/CoordinatorProduce", "PartitionLeader/WriteTxnMarkers",
                                    "PartitionLeader/TxnPartitionsAdded"])
def test_a_muted_principals_calls_between_services_are_not_held(method):
    """Calls between services are exempt (Kafka exempts inter-broker requests): a mute
    of their principal (all User:ANONYMOUS without authentication) holds them no more
    than it throttles them, so a one-way notice, run as its stream reads it, never
    stalls the stream."""
    import asyncio

    from services.common.security.quotas import QuotaInterceptor

    clock = MockTime()
    manager = QuotaManager(clock=clock.now_ms, overhead=_fixed_overhead())
    manager.set_configs({QuotaEntity("ANONYMOUS", None): {PRODUCER_BYTE_RATE: 100.0}})
    manager.record("User:ANONYMOUS", "", PRODUCER_BYTE_RATE, 10_000)
    assert manager.muted_ms("User:ANONYMOUS", "") > 0

    class Context:
        def invocation_metadata(self):
            return []

        def time_remaining(self):
            return 30.0  # a held call would wait out the mute

    gate = QuotaInterceptor(manager)
    assert asyncio.run(asyncio.wait_for(gate.admit("User:ANONYMOUS", method, None, Context()), 1)) is None
