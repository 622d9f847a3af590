"""Kafka APIs every service answers: Metadata, FindCoordinator, CreateTopics,
DeleteTopics, CreatePartitions, DescribeClientQuotas, AlterClientQuotas (and the
config APIs of services.common.kafka.config_api) — adapters over the Cluster servicer
(services/common/server.py), so the rules stay in one place (docs/design.md, "Kafka
protocol").

Node ids become int32 broker ids (`cluster.broker_id`); a node is listed as a broker
when it runs a Kafka listener, with its Kafka port. Partition leaders, replicas and
ISR are listed by broker id.
"""
from __future__ import annotations

from typing import Any

import grpc

from exactly_wire.error_codes import ErrorCode
from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pbg

from .. import authz, topic_admin
from ..auth import current_principal
from ..cluster import ClusterState, broker_id
from .codec import field
from .config_api import ConfigApis
from .listener import Handler, RequestContext

CLUSTER_ID = "exactly"
METADATA, FIND_COORDINATOR, CREATE_TOPICS, DELETE_TOPICS, CREATE_PARTITIONS = 3, 10, 19, 20, 37
INIT_PRODUCER_ID = 22
DESCRIBE_CLIENT_QUOTAS, ALTER_CLIENT_QUOTAS = 48, 49


# Kafka's DescribeConfigsResponse.ConfigSource ids, used by CreateTopics v5+ too.
_CONFIG_SOURCE = {topic_admin.SOURCE_TOPIC: 1, topic_admin.SOURCE_DEFAULT: 5}


def _creatable_configs(configs: dict[str, str]) -> list[dict]:
    """CreateTopics v5+ `configs` of a topic created with `configs`: every topic config
    (name, value, read_only, config_source, is_sensitive), as DescribeConfigs lists them."""
    return [{"name": e.name, "value": e.value, "read_only": False, "config_source": _CONFIG_SOURCE[e.source],
             "is_sensitive": False} for e in topic_admin.describe_topic_configs(dict(configs))]


def _kafka_entity(c: pb.ClientQuotaEntityComponent) -> dict:
    """A quota entity component as Kafka's EntityData (entity_name null: the default)."""
    return {"entity_type": c.entity_type, "entity_name": None if c.is_default else c.name}


class ClusterApis:
    """Handlers over `servicer` (a services.common.server.ClusterServicer).
    `channel(address)`: a grpc.aio channel to another service (ClusterClient.channel),
    for InitProducerId of idempotent producers sent to a service that is not a
    transaction coordinator (Kafka clients send it to any broker). `settings` and
    `props`: the process's parsed settings and the keys it was started with, which
    DescribeConfigs lists for a BROKER resource (config_api.ConfigApis)."""

    def __init__(self, cluster: ClusterState, servicer: Any, channel=None, settings=None, props=None):
        self.cluster = cluster
        self.servicer = servicer
        self.channel = channel
        self.configs = ConfigApis(cluster, settings, props or {})

    def handlers(self) -> dict[int, Handler]:
        """The keys every process serves (services.common.kafka.surface.CLUSTER) ->
        handler; the versions are in the surface table."""
        return {METADATA: self.metadata, FIND_COORDINATOR: self.find_coordinator,
                CREATE_TOPICS: self.create_topics, DELETE_TOPICS: self.delete_topics,
                CREATE_PARTITIONS: self.create_partitions, DESCRIBE_CLIENT_QUOTAS: self.describe_client_quotas,
                ALTER_CLIENT_QUOTAS: self.alter_client_quotas, **self.configs.handlers()}

    def elsewhere(self) -> dict[int, Handler]:
        """Handlers for keys of another role that a process answers itself instead of
        with the surface's redirecting error: InitProducerId (see `init_producer_id`)."""
        return {INIT_PRODUCER_ID: self.init_producer_id}

    def brokers(self) -> list[dict]:
        return [{"node_id": n.broker_id, "host": n.host, "port": n.kafka_port, "rack": None}
                for n in sorted(self.cluster.nodes().values(), key=lambda n: n.node_id) if n.kafka_port]

    def controller_id(self) -> int:
        """Metadata's controller_id: the broker id of the first partition leader (by
        node id) with a Kafka listener, else of the first node with one; -1 only when no
        node has one. Always a listed broker, so clients (confluent-kafka's
        describe_cluster) find the controller among the nodes, and a broker id below
        2**24 (`cluster.broker_id`: librdkafka relies on its top byte being zero)."""
        listed = sorted((n for n in self.cluster.nodes().values() if n.kafka_port), key=lambda n: n.node_id)
        leaders = [n for n in listed if n.role == "partition_leader"] or listed
        return leaders[0].broker_id if leaders else -1

    async def metadata(self, req: Any, version: int, ctx: RequestContext) -> dict:
        topics = field(req, "topics")
        names = None if topics is None else [t.name for t in topics if t.name]
        if names == [] and topics is not None and version >= 1:
            resp = pb.MetadataResponse()
        else:
            resp = await self.servicer.Metadata(pb.MetadataRequest(topics=names or []), None)
        out = []
        for t in resp.topics:
            out.append({"error_code": t.error_code, "name": t.name, "is_internal": t.is_internal,
                        "topic_authorized_operations": -2147483648,
                        "partitions": [{"error_code": p.error_code, "partition_index": p.partition,
                                        "leader_id": broker_id(p.leader_id) if p.leader_id else -1,
                                        "leader_epoch": p.leader_epoch,
                                        "replica_nodes": [broker_id(r) for r in p.replicas],
                                        "isr_nodes": [broker_id(r) for r in p.isr], "offline_replicas": []}
                                       for p in t.partitions]})
        return {"throttle_time": 0, "brokers": self.brokers(), "cluster_id": CLUSTER_ID,
                "controller_id": self.controller_id(), "topics": out,
                "cluster_authorized_operations": -2147483648}

    async def _coordinator(self, key: str, key_type: int) -> dict:
        resp = await self.servicer.FindCoordinator(pb.FindCoordinatorRequest(key=key, key_type=key_type), None)
        if resp.error_code != ErrorCode.NONE:
            return {"error_code": resp.error_code, "error_message": resp.error_message, "node_id": -1,
                    "host": "", "port": -1, "key": key}
        node = self.cluster.nodes().get(resp.node_id)
        if node is None or not node.kafka_port:
            return {"error_code": ErrorCode.COORDINATOR_NOT_AVAILABLE, "node_id": -1, "host": "", "port": -1,
                    "key": key, "error_message": f"{resp.node_id} has no Kafka listener"}
        return {"error_code": 0, "error_message": None, "node_id": node.broker_id, "host": node.host,
                "port": node.kafka_port, "key": key}

    async def find_coordinator(self, req: Any, version: int, ctx: RequestContext) -> dict:
        key_type = field(req, "key_type", 0)
        if version >= 4:
            coordinators = [await self._coordinator(k, key_type) for k in field(req, "coordinator_keys", ())]
            return {"throttle_time": 0, "coordinators": coordinators}
        one = await self._coordinator(field(req, "key", ""), key_type)
        one.pop("key")
        return {"throttle_time": 0, **one}

    async def create_topics(self, req: Any, version: int, ctx: RequestContext) -> dict:
        """CreateTopics v2-7. From v5 each created (or, with validate_only, valid)
        topic's result lists its configs as Kafka's controller does (KIP-525): every
        topic config with the value given at creation (source TOPIC_CONFIG) or the
        default (DEFAULT_CONFIG), plus the partition count and replication factor."""
        topics = []
        throttle = 0
        for t in req.topics:
            if t.assignments:
                topics.append({"name": t.name, "error_code": ErrorCode.INVALID_REQUEST,
                               "error_message": "manual replica assignments are not supported"})
                continue
            creatable = pb.CreatableTopic(name=t.name, num_partitions=t.num_partitions if t.num_partitions > 0 else 1,
                                          replication_factor=max(t.replication_factor, 1),
                                          configs={c.name: c.value or "" for c in t.configs})
            if field(req, "validate_only", False):
                topics.append({"name": t.name, "error_code": 0, "num_partitions": creatable.num_partitions,
                               "replication_factor": creatable.replication_factor,
                               "configs": _creatable_configs(creatable.configs)})
                continue
            resp = await self.servicer.CreateTopics(pb.CreateTopicsRequest(topics=[creatable],
                                                                           timeout_ms=field(req, "timeout", 0)), None)
            r = resp.topics[0]
            throttle = max(throttle, resp.throttle_time_ms)
            topics.append({"name": t.name, "error_code": r.error_code, "error_message": r.error_message or None,
                           "num_partitions": creatable.num_partitions,
                           "replication_factor": creatable.replication_factor,
                           "configs": _creatable_configs(creatable.configs) if r.error_code == ErrorCode.NONE
                           else []})
        return {"throttle_time": throttle, "topics": topics}

    async def delete_topics(self, req: Any, version: int, ctx: RequestContext) -> dict:
        names = list(field(req, "topic_names", None) or [t.name for t in field(req, "topics", ())])
        resp = await self.servicer.DeleteTopics(pb.DeleteTopicsRequest(topic_names=names), None)
        return {"throttle_time": resp.throttle_time_ms, "responses": [
            {"name": r.name, "error_code": r.error_code, "error_message": r.error_message or None}
            for r in resp.responses]}

    async def create_partitions(self, req: Any, version: int, ctx: RequestContext) -> dict:
        resp = await self.servicer.CreatePartitions(pb.CreatePartitionsRequest(
            topics=[pb.CreatePartitionsTopic(name=t.name, count=t.count) for t in req.topics],
            validate_only=field(req, "validate_only", False)), None)
        return {"throttle_time": resp.throttle_time_ms, "results": [
            {"name": r.name, "error_code": r.error_code, "error_message": r.error_message or None}
            for r in resp.results]}

    async def describe_client_quotas(self, req: Any, version: int, ctx: RequestContext) -> dict:
        """DescribeClientQuotas v0-1 (KIP-546) over the Cluster servicer's; an entity
        name of null is the default entity."""
        resp = await self.servicer.DescribeClientQuotas(pb.DescribeClientQuotasRequest(
            components=[pb.ClientQuotaFilterComponent(entity_type=c.entity_type, match_type=int(c.match_type),
                                                      match=c.match or "") for c in req.components],
            strict=bool(req.strict)), None)
        return {"throttle_time": 0, "error_code": resp.error_code, "error_message": resp.error_message or None,
                "entries": [{"entity": [_kafka_entity(c) for c in e.entity],
                             "values": [{"key": v.key, "value": v.value} for v in e.values]}
                            for e in resp.entries]}

    async def alter_client_quotas(self, req: Any, version: int, ctx: RequestContext) -> dict:
        """AlterClientQuotas v0-1 (KIP-546) over the Cluster servicer's."""
        resp = await self.servicer.AlterClientQuotas(pb.AlterClientQuotasRequest(
            validate_only=bool(req.validate_only), entries=[pb.ClientQuotaEntry(
                entity=[pb.ClientQuotaEntityComponent(entity_type=c.entity_type, name=c.entity_name or "",
                                                      is_default=c.entity_name is None) for c in e.entity],
                values=[pb.ClientQuotaValue(key=o.key, value=float(o.value), remove=bool(o.remove))
                        for o in e.ops]) for e in req.entries]), None)
        return {"throttle_time": 0, "entries": [
            {"error_code": r.error_code, "error_message": r.error_message or None,
             "entity": [_kafka_entity(c) for c in r.entity]} for r in resp.entries]}

    async def init_producer_id(self, req: Any, version: int, ctx: RequestContext) -> dict:
        """InitProducerId at a process that is not a transaction coordinator. A Kafka
        broker serves an idempotent producer's InitProducerId itself, whoever
        coordinates; here producer ids are allocated and bound to the principal by the
        transaction coordinators, so it is forwarded (KIP-590 style) to the live ones
        in node order until one answers (one owning no loaded `__transaction_state`
        partition answers NOT_COORDINATOR: the next is asked); none answering:
        COORDINATOR_NOT_AVAILABLE (retriable). THROTTLING_QUOTA_EXCEEDED
        (exactly.producer.ids.rate) comes back with its throttle time. A transactional one gets NOT_COORDINATOR: the client asks
        FindCoordinator, then the coordinator."""
        fail = {"throttle_time": 0, "producer_id": -1, "producer_epoch": -1}
        if field(req, "transactional_id"):
            return {**fail, "error_code": ErrorCode.NOT_COORDINATOR}
        try:
            authz.require("TransactionCoordinator/InitProducerId", pb.InitProducerIdRequest())
        except authz.Denied as denied:
            return {**fail, "error_code": denied.error}
        coordinators = sorted((n for n in self.cluster.nodes().values() if n.role == "txn_coordinator"),
                              key=lambda n: n.node_id)
        if not coordinators or self.channel is None:
            return {**fail, "error_code": ErrorCode.COORDINATOR_NOT_AVAILABLE}
        for node in coordinators:
            stub = pbg.TransactionCoordinatorStub(self.channel(node.address))
            try:
                resp = await stub.InitProducerId(pb.InitProducerIdRequest(
                    transaction_timeout_ms=field(req, "transaction_timeout", 60000),
                    principal=current_principal.get()), timeout=30)
            except grpc.RpcError:
                continue
            if resp.error_code == ErrorCode.NOT_COORDINATOR:
                continue  # with producer-id bindings: it owns no loaded __transaction_state partition
            if resp.error_code:
                return {**fail, "error_code": resp.error_code, "throttle_time": resp.throttle_time_ms}
            return {"throttle_time": 0, "error_code": 0, "producer_id": resp.producer_id,
                    "producer_epoch": resp.producer_epoch}
        return {**fail, "error_code": ErrorCode.COORDINATOR_NOT_AVAILABLE}
