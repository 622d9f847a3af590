"""Kafka APIs every service answers: Metadata, FindCoordinator, CreateTopics,
DeleteTopics, CreatePartitions, DescribeClientQuotas, AlterClientQuotas, DescribeCluster, ElectLeaders,
the ACL APIs (acl_api.py), the config APIs (config_api.py) and ListGroups (the union of the group
coordinators') — adapters over the Cluster servicer
(services/common/transport/server.py), so the rules stay in one place (docs/design.md, "Kafka
protocol").

Node ids become int32 broker ids (`cluster.broker_id`); a node is listed as a broker
when it runs a Kafka listener, with its Kafka port. Partition leaders, replicas and
ISR are listed by broker id.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc

from exactly_wire.error_codes import ErrorCode
from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pbg

from ..security import authz
from ..cluster import topic_admin
from ..security.acl import Operation as Op, Resource, ResourceType
from ..security.auth import current_principal
from ..cluster.state import ClusterState, PartitionState
from .acl_api import AclApis
from .codec import field
from .config_api import DEFAULT_CONFIG, DYNAMIC_TOPIC_CONFIG, ConfigApis
from .listener import Handler, RequestContext

log = logging.getLogger(__name__)
CLUSTER_ID = "exactly"
METADATA, FIND_COORDINATOR, CREATE_TOPICS, DELETE_TOPICS, CREATE_PARTITIONS = 3, 10, 19, 20, 37
INIT_PRODUCER_ID, LIST_GROUPS, ELECT_LEADERS = 22, 16, 43
PREFERRED, UNCLEAN = 0, 1  # ElectLeaders election types (KIP-460)
LIST_GROUPS_TIMEOUT_S = 10  # the deadline of each group coordinator's ListGroups
DESCRIBE_CLIENT_QUOTAS, ALTER_CLIENT_QUOTAS, DESCRIBE_CLUSTER = 48, 49, 60


# CreateTopics v5+ gives each config's source as DescribeConfigs does.
_CONFIG_SOURCE = {topic_admin.SOURCE_TOPIC: DYNAMIC_TOPIC_CONFIG, topic_admin.SOURCE_DEFAULT: DEFAULT_CONFIG}


def _creatable_configs(configs: dict[str, str]) -> list[dict]:
    """CreateTopics v5+ `configs` of a topic created with `configs`: every topic config
    (name, value, read_only, config_source, is_sensitive), as DescribeConfigs lists them."""
    return [{"name": e.name, "value": e.value, "read_only": False, "config_source": _CONFIG_SOURCE[e.source],
             "is_sensitive": False} for e in topic_admin.describe_topic_configs(dict(configs))]


def _kafka_entity(c: pb.ClientQuotaEntityComponent) -> dict:
    """A quota entity component as Kafka's EntityData (entity_name null: the default)."""
    return {"entity_type": c.entity_type, "entity_name": None if c.is_default else c.name}


def election_result(election_type: int, replicas: list[str], state: PartitionState | None,
                    live: set[str]) -> tuple[int, str | None]:
    """The ElectLeaders answer (error code, message) for one partition (KIP-183
    preferred, KIP-460 unclean) under Exactly's controller (services.common.cluster.controller),
    which elects only on a leader's failure and only among live in-sync replicas:

    - PREFERRED: ELECTION_NOT_NEEDED when the first assigned replica leads;
      otherwise PREFERRED_LEADER_NOT_AVAILABLE, saying whether that replica is down,
      out of the ISR, or simply not moved to (leadership moves only on failure);
    - UNCLEAN: ELECTION_NOT_NEEDED while a live leader leads; with none,
      ELIGIBLE_LEADERS_NOT_AVAILABLE (no replica outside the ISR is ever elected: it
      could lack acknowledged records and committed transactions).
    `live`: the live partition-leader node ids."""
    leader = state.leader if state is not None else (replicas[0] if replicas else None)
    isr = state.isr if state is not None else tuple(replicas)
    if election_type == UNCLEAN:
        if leader is not None and leader in live:
            return ErrorCode.ELECTION_NOT_NEEDED, None
        return ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE, (
            "no live in-sync replica; Exactly never elects a replica outside the ISR (no unclean election)")
    preferred = replicas[0] if replicas else None
    if preferred is not None and leader == preferred and leader in live:
        return ErrorCode.ELECTION_NOT_NEEDED, None
    if preferred is None or preferred not in live:
        return ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE, f"the preferred replica {preferred} is not live"
    if preferred not in isr:
        return ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE, f"the preferred replica {preferred} is not in the ISR"
    return ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE, (
        f"{leader} leads; Exactly's controller moves leadership only when a leader fails")


class ClusterApis:
    """Handlers over `servicer` (a services.common.transport.server.ClusterServicer).
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
                ALTER_CLIENT_QUOTAS: self.alter_client_quotas, DESCRIBE_CLUSTER: self.describe_cluster,
                LIST_GROUPS: self.list_groups, ELECT_LEADERS: self.elect_leaders,
                **AclApis(self.servicer).handlers(), **self.configs.handlers()}

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
            # v0-3 have no allow_auto_topic_creation: Kafka treats them as allowing it.
            resp = await self.servicer.Metadata(pb.MetadataRequest(
                topics=names or [], allow_auto_topic_creation=bool(field(req, "allow_auto_topic_creation", True))),
                None)
        out = []
        for t in resp.topics:
            out.append({"error_code": t.error_code, "name": t.name, "is_internal": t.is_internal,
                        "topic_authorized_operations": -2147483648,
                        "partitions": [{"error_code": p.error_code, "partition_index": p.partition,
                                        "leader_id": self.cluster.broker_id_of(p.leader_id) if p.leader_id else -1,
                                        "leader_epoch": p.leader_epoch,
                                        "replica_nodes": [self.cluster.broker_id_of(r) for r in p.replicas],
                                        "isr_nodes": [self.cluster.broker_id_of(r) for r in p.isr],
                                        "offline_replicas": []}
                                       for p in t.partitions]})
        return {"throttle_time": 0, "brokers": self.brokers(), "cluster_id": CLUSTER_ID,
                "controller_id": self.controller_id(), "topics": out,
                "cluster_authorized_operations": -2147483648}

    async def describe_cluster(self, req: Any, version: int, ctx: RequestContext) -> dict:
        """DescribeCluster v0-2 (KIP-700): the brokers (every process with a Kafka
        listener, by broker id), the cluster id and the controller id, as Metadata
        lists them. Endpoint type 2 (controllers, KIP-919) answers
        UNSUPPORTED_ENDPOINT_TYPE: Exactly has no separate controller quorum."""
        if field(req, "endpoint_type", 1) != 1:
            return {"throttle_time": 0, "error_code": ErrorCode.UNSUPPORTED_ENDPOINT_TYPE,
                    "error_message": "Exactly serves broker endpoints only", "endpoint_type": 1, "cluster_id": "",
                    "controller_id": -1, "brokers": [], "cluster_authorized_operations": -2147483648}
        return {"throttle_time": 0, "error_code": 0, "error_message": None, "endpoint_type": 1,
                "cluster_id": CLUSTER_ID, "controller_id": self.controller_id(),
                "brokers": [{"broker_id": b["node_id"], "host": b["host"], "port": b["port"], "rack": None,
                             "is_fenced": False} for b in self.brokers()],
                "cluster_authorized_operations": -2147483648}

    async def elect_leaders(self, req: Any, version: int, ctx: RequestContext) -> dict:
        """ElectLeaders v0-2 (v0: preferred only): each partition asked (null: every
        partition of every topic) answered by `election_result`; an unknown one
        UNKNOWN_TOPIC_OR_PARTITION, an unknown election type INVALID_REQUEST. Needs
        Alter on the Cluster, as Kafka (CLUSTER_AUTHORIZATION_FAILED at the top)."""
        election = field(req, "election_type", PREFERRED)
        if not authz.visible(Op.ALTER, authz.CLUSTER):
            return {"throttle_time": 0, "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                    "replica_election_results": []}
        topics = self.cluster.topics()
        asked = field(req, "topic_partitions")
        wanted = [(t.topic, list(t.partitions)) for t in asked] if asked is not None else \
            [(name, sorted(info.partitions)) for name, info in sorted(topics.items()) if not info.internal]
        live = {n.node_id for n in self.cluster.nodes().values() if n.role == "partition_leader"}
        out = []
        for name, partitions in wanted:
            info = topics.get(name)
            results = []
            for p in partitions:
                if election not in (PREFERRED, UNCLEAN):
                    code, msg = ErrorCode.INVALID_REQUEST, f"unknown election type {election}"
                elif info is None or p not in info.partitions:
                    code, msg = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown partition {name}-{p}"
                else:
                    code, msg = election_result(election, info.partitions[p], info.states.get(p), live)
                results.append({"partition_id": p, "error_code": code, "error_message": msg})
            out.append({"topic": name, "partition_result": results})
        return {"throttle_time": 0, "error_code": 0, "replica_election_results": out}

    async def list_groups(self, req: Any, version: int, ctx: RequestContext) -> dict:
        """ListGroups v0-4 at any process: the union of every live group
        coordinator's groups, so a client asking any one port sees every group (a Kafka
        broker lists its own and admin clients union the brokers' answers; the union of
        identical answers is the same list). Each coordinator is asked over gRPC, all at
        once, each call bounded by LIST_GROUPS_TIMEOUT_S; the groups are filtered here
        by the caller's Describe on each group (the coordinators see this process's
        identity). A coordinator not answering: the groups of the others with
        COORDINATOR_NOT_AVAILABLE (retriable); none registered: an empty list.
        `states_filter` (v4) is passed on."""
        states = list(field(req, "states_filter", ()) or ())
        nodes = sorted((n for n in self.cluster.nodes().values() if n.role == "group_coordinator"),
                       key=lambda n: n.node_id)

        async def ask(node) -> pb.ListGroupsResponse | None:
            try:
                return await pbg.GroupCoordinatorStub(self.channel(node.address)).ListGroups(
                    pb.ListGroupsRequest(states_filter=states), timeout=LIST_GROUPS_TIMEOUT_S)
            except grpc.RpcError as exc:
                log.warning("ListGroups of %s failed: %s", node.node_id, exc.code())
                return None
        answers = await asyncio.gather(*(ask(n) for n in nodes)) if nodes and self.channel else []
        code, groups = ErrorCode.NONE, {}
        for resp in answers:
            if resp is None or resp.error_code:
                code = ErrorCode.COORDINATOR_NOT_AVAILABLE if resp is None else resp.error_code
                continue
            for g in resp.groups:
                if authz.visible(Op.DESCRIBE, Resource(ResourceType.GROUP, g.group_id)):
                    groups[g.group_id] = {"group_id": g.group_id, "protocol_type": g.protocol_type,
                                          "group_state": g.group_state}
        return {"throttle_time": 0, "error_code": code, "groups": [groups[k] for k in sorted(groups)]}

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
        in node order until one answers (one owning no loaded `TRANSACTION_STATE_TOPIC`
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
                continue  # with producer-id bindings: it owns no loaded TRANSACTION_STATE_TOPIC partition
            if resp.error_code:
                return {**fail, "error_code": resp.error_code, "throttle_time": resp.throttle_time_ms}
            return {"throttle_time": 0, "error_code": 0, "producer_id": resp.producer_id,
                    "producer_epoch": resp.producer_epoch}
        return {**fail, "error_code": ErrorCode.COORDINATOR_NOT_AVAILABLE}
