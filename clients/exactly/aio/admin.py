"""AIOAdminClient: the AdminClient for asyncio, on grpc.aio, with the AdminClient's
rules (`exactly.admin`: requests, outcomes, listings, descriptions)."""
from __future__ import annotations

import asyncio
from typing import Any, Iterable, Mapping

from exactly import errors
from exactly._unclosed import collected, creation_stack
from exactly._client import COORDINATOR_TRANSACTION, Metadata, Transport
from exactly.config import AdminSchema, parse
from exactly._sender import txn_coordinator_addresses
from exactly.admin import (MetadataAt, ProbeLeader, RefreshMetadata, Sleep, TopicDescription, TransactionDescription,
                           TransactionListing, create_topics_outcome, create_topics_request, create_topics_timeout_s, describe_transaction_code,
                           describe_transaction_request, leader_probe, list_transactions_request, probe_answered,
                           probe_timeout_s, topic_descriptions, topic_listing, transaction_descriptions,
                           transaction_listings, wait_serving_flow)
from exactly.types import NewTopic
from exactly_wire.v1 import exactly_pb2 as pb

from ._core import AIOClientCore, run_flow_async


class AIOAdminClient:
    """Administrative operations from asyncio code. `conf`: bootstrap.servers
    (required), request.timeout.ms, retry.backoff.ms, retry.backoff.max.ms. Create
    it inside a running event loop (raises RuntimeError otherwise)."""

    def __init__(self, conf: Mapping[str, Any], *, transport: Transport | None = None):
        # Where, in debug mode (also the event loop's), for the unclosed warning (`__del__`).
        self._created = creation_stack(asyncio.get_running_loop().get_debug())
        self._core = AIOClientCore(parse(AdminSchema, conf), transport=transport)

    async def create_topics(self, new_topics: Iterable[NewTopic], timeout: float | None = None) -> None:
        """As `exactly.AdminClient.create_topics`: create topics and return when every
        new partition has a leader that answers. `timeout` in seconds (default
        request.timeout.ms, at least 30 s). Raises errors.TopicAlreadyExistsError,
        errors.InvalidTopicException, errors.InvalidPartitionsError,
        errors.InvalidReplicationFactorError, errors.KafkaTimeoutError."""
        topics = list(new_topics)
        if not topics:
            return
        core = self._core
        timeout_s = create_topics_timeout_s(core, timeout)
        deadline = core.clock.now_s() + timeout_s
        req = create_topics_request(topics, timeout_s)
        tries = 0

        async def _create():
            nonlocal tries
            tries += 1
            return await core.call(core.cluster_stub().CreateTopics, req)

        created, failures = create_topics_outcome(await core.retry(_create, timeout_s), tries)
        await self._wait_serving(created, deadline)
        if failures:
            raise failures[0]

    async def _wait_serving(self, topics: list[str], deadline: float) -> None:
        await run_flow_async(wait_serving_flow(self._core, topics, deadline), self._perform)

    async def _perform(self, effect: Any) -> Any:
        if isinstance(effect, RefreshMetadata):
            return await self._core.metadata_async(effect.topics, refresh=True)
        if isinstance(effect, ProbeLeader):
            return await self._leader_answers(*effect)
        if isinstance(effect, MetadataAt):
            return await self._metadata_at(effect.address)
        if isinstance(effect, Sleep):
            return await self._core.clock.sleep_async(effect.seconds)
        raise TypeError(f"unknown effect {effect!r}")

    async def _leader_answers(self, address: str, topic: str, partition: int) -> bool:
        core = self._core
        try:
            resp = await core.call(core.leader_stub(address).ListOffsets, leader_probe(topic, partition),
                                   timeout_s=probe_timeout_s(core))
        except errors.ExactlyError:
            return False
        return probe_answered(resp)

    async def _metadata_at(self, address: str) -> Metadata | None:
        core = self._core
        try:
            resp = await core.call(core.cluster_stub(address).Metadata, pb.MetadataRequest(),
                                   timeout_s=probe_timeout_s(core))
        except errors.ExactlyError:
            return None
        return Metadata.from_response(resp, core.clock())

    async def _fresh_metadata(self) -> Metadata:
        """`AdminClient._fresh_metadata`: metadata fetched now, with the admin calls'
        retries; raises the last error after request.timeout.ms."""
        core = self._core
        return await core.retry(lambda: core.metadata_async(refresh=True))

    async def list_topics(self, include_internal: bool = False) -> dict[str, list[int]]:
        """Topic name -> sorted partition ids (internal topics only if asked)."""
        return topic_listing(await self._fresh_metadata(), include_internal)

    async def describe_topics(self, topics: Iterable[str] | None = None) -> dict[str, TopicDescription]:
        """As `exactly.AdminClient.describe_topics`. Raises errors.UnknownTopicOrPartitionError."""
        return topic_descriptions(await self._fresh_metadata(), topics)

    async def list_transactions(self, states: Iterable[str] = (), producer_ids: Iterable[int] = ()
                                ) -> list[TransactionListing]:
        """As `exactly.AdminClient.list_transactions`."""
        core = self._core
        req = list_transactions_request(states, producer_ids)
        out = []
        for addr in txn_coordinator_addresses(await self._fresh_metadata()):
            resp = await core.retry(lambda a=addr: core.call(core.txn_stub(a).ListTransactions, req))
            out.extend(transaction_listings(resp))
        return sorted(out)

    async def describe_transactions(self, transactional_ids: Iterable[str]) -> dict[str, TransactionDescription]:
        """As `exactly.AdminClient.describe_transactions`."""
        core = self._core
        out = {}
        for tid in transactional_ids:
            out.update(transaction_descriptions(await core.coordinator_call(
                tid, COORDINATOR_TRANSACTION, lambda a: core.txn_stub(a).DescribeTransactions,
                describe_transaction_request(tid), error_code=describe_transaction_code)))
        return out

    async def close(self) -> None:
        """Release connections. Idempotent."""
        await self._core.close()

    def __del__(self) -> None:
        # Unclosed: a ResourceWarning; the connections close on the loop (exactly._unclosed).
        core = getattr(self, "_core", None)
        collected(self, core is not None and not core.closed, lambda: core.release_unclosed())

    async def __aenter__(self) -> "AIOAdminClient":
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()


__all__ = ["AIOAdminClient"]
