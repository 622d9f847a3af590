"""Process bootstrap shared by every service: gRPC server, ZooKeeper registration,
the Cluster RPCs (Metadata, CreateTopics, FindCoordinator), health, metrics, clean
shutdown.

A service module provides `async setup(server, cluster, client, cfg) -> service` where
`service` has `async start()` (after the port is bound, before registration),
`async stop()` (SIGTERM/SIGINT), optionally `async wait_ready()` and optionally a
`loading` attribute (bool, e.g. a property: True while a coordinator loads a
partition it was elected for); then `main_for(role, setup)` runs it as
`python -m services.<role> ...`.

Health (grpc.health.v1): service "" is NOT_SERVING until `wait_ready()` returned,
then SERVING, and NOT_SERVING again whenever `service.loading` is true (polled every
`exactly.health.poll.ms`, default 100) and from SIGTERM on; readiness and start-up
checks use it. Service "liveness" is SERVING from start-up to SIGTERM, for liveness
checks that must not fail while a long partition load runs.

Metrics (services/common/metrics.py): every unary RPC is timed and its error codes
counted by an interceptor; with `metrics.port` > 0 the process serves /metrics on that
port, bound to `metrics.bind.address` (default: the gRPC bind host, `--host`).
"""
from __future__ import annotations

import asyncio
import logging
import os
import platform
import re
import signal
import sys
from typing import Any, Awaitable, Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from exactly_wire import DISTRIBUTION, keepalive, version
from exactly_wire.error_codes import ErrorCode
from exactly_wire.security import TransportSecurity, load_pem_chain
from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pbg

from ..security import authz, quotas
from . import connections, memory
from .. import metrics
from ..cluster import topic_admin
from ..security.acl import Operation as Op, Resource, ResourceType
from ..security.acl import AclCache, AclStore, Authorizer, parse_super_users
from ..security.pid_binding import ProducerIdBindings
from ..security.auth import (ANONYMOUS, SCRAM_ITERATIONS, USERS, AuthInterceptor, Authenticator, UserStore,
                             check_iterations, create_user_credentials, current_principal)
from ..cluster import features, meta
from ..cluster.state import KIND_FOR_KEY_TYPE, ClusterState, broker_id
from ..protocol import INTERNAL_TOPIC_FOR_KIND
from ..config import ServiceConfig, parse_args, service_security
from .guard import RequestGuard
from .link import LinkServer
from .tunnel import (CLIENT_CARRIED, CLIENT_OPEN_METHOD, HandlerRegistry, TunnelServicer,
                     add_client_calls_to_server, add_tunnel_to_server)
from ..kafka.acl_api import acl_message, binding_of_message
from ..kafka.cluster_api import ClusterApis
from ..kafka import surface as kafka_surface
from ..kafka.listener import KafkaListener
from .rpc import CHANNEL_OPTIONS, ClusterClient

log = logging.getLogger(__name__)

Setup = Callable[[grpc.aio.Server, ClusterState, ClusterClient, ServiceConfig], Awaitable[Any]]

# gRPC service (exactly.v1) of each role, besides Cluster and Health which every process serves.
ROLE_SERVICES = {"partition_leader": "PartitionLeader", "txn_coordinator": "TransactionCoordinator",
                 "group_coordinator": "GroupCoordinator"}
LIVENESS = "liveness"
# The finalized transaction version Metadata advertises (Kafka's `transaction.version`
# feature): 2, every transaction ends under a bumped epoch and partition leaders add a
# producer's partitions implicitly (KIP-890 part 2; ProduceRequest.add_partitions_to_txn).
TRANSACTION_VERSION = 2


class ClusterServicer(pbg.ClusterServicer):
    """Metadata, CreateTopics and FindCoordinator from the ZooKeeper cache (docs/design.md,
    "Architecture"); DeleteTopics, CreatePartitions, DescribeConfigs and
    IncrementalAlterConfigs on the topic znodes (docs/design.md, "Administration")."""

    def __init__(self, cluster: ClusterState, tls: bool = False, quota_manager: quotas.QuotaManager | None = None):
        self.cluster = cluster
        self.security = SecurityAdmin(cluster, tls)
        # Client quotas (services.common.security.quotas): controller_mutation_rate and
        # max_partitions are checked here, for both ports; None: no quotas.
        self.quotas = quota_manager

    async def Metadata(self, request, context):
        nodes = self.cluster.nodes()
        topics = self.cluster.topics()
        names = list(request.topics) or sorted(topics)
        resp = pb.MetadataResponse(nodes=[pb.Node(node_id=n.node_id, role=n.role, host=n.host, port=n.port)
                                          for n in nodes.values()],
                                   transaction_version=TRANSACTION_VERSION)
        for name in names:
            t = topics.get(name)
            if not authz.visible(Op.DESCRIBE, Resource(ResourceType.TOPIC, name)):
                if request.topics:  # asked by name: say so; listing all: leave it out
                    resp.topics.append(pb.TopicMetadata(name=name, error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED))
                continue
            if t is None:
                code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                if request.topics and request.allow_auto_topic_creation:
                    code = await self._auto_create(name)
                resp.topics.append(pb.TopicMetadata(name=name, error_code=code))
                continue
            tm = pb.TopicMetadata(name=name, is_internal=t.internal)
            for p in sorted(t.partitions):
                leader = t.leader(p)
                st = t.states.get(p)
                live = leader in nodes
                tm.partitions.append(pb.PartitionMetadata(
                    partition=p, leader_id=leader if live else "",
                    error_code=ErrorCode.NONE if live else ErrorCode.LEADER_NOT_AVAILABLE,
                    leader_epoch=st.leader_epoch if st else 0, replicas=t.partitions[p],
                    isr=list(st.isr) if st else t.partitions[p]))
            resp.topics.append(tm)
        return resp

    async def _auto_create(self, name: str) -> ErrorCode:
        """Create topic `name`, asked for by a Metadata request that allows it, when
        auto.create.topics.enable is on and the caller may Create it (num.partitions,
        default.replication.factor, the caller's partition quota); returns the error
        Metadata answers for it (topic_admin.auto_created_error)."""
        settings = self.cluster.settings
        may_create = authz.visible(Op.CREATE, authz.CLUSTER) or \
            authz.visible(Op.CREATE, Resource(ResourceType.TOPIC, name))
        if not topic_admin.auto_create_wanted(True, settings.auto_create_topics_enable, may_create):
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        principal = _owner(current_principal.get())
        code, msg = await asyncio.to_thread(self.cluster.create_topic, name, settings.num_partitions,
                                            settings.default_replication_factor, {}, False, principal,
                                            self._partition_quota(principal))
        if code == ErrorCode.NONE:
            log.info("created topic %r automatically (%d partitions, replication factor %d; "
                     "auto.create.topics.enable)", name, settings.num_partitions,
                     settings.default_replication_factor)
        elif code != ErrorCode.TOPIC_ALREADY_EXISTS:
            log.info("topic %r not created automatically: %s %s", name, ErrorCode(code).name, msg)
        return topic_admin.auto_created_error(code)

    def _mutation_throttle(self) -> int:
        """ms the caller must wait before mutating again (controller_mutation_rate,
        KIP-599); 0 when it may mutate now or there are no quotas."""
        if self.quotas is None:
            return 0
        return self.quotas.mutation_throttle(current_principal.get(), quotas.current_client_id.get())

    def _record_mutations(self, partitions: int) -> int:
        if self.quotas is None:
            return 0
        return self.quotas.record_mutations(current_principal.get(), quotas.current_client_id.get(), partitions)

    def _partition_quota(self, principal: str) -> float | None:
        """`principal`'s max_partitions (None: none), which the cluster state reserves
        with the topic it creates (services.common.cluster.partition_usage)."""
        return self.quotas.partition_quota(principal) if self.quotas is not None and principal else None

    @staticmethod
    def _throttled(throttle_ms: int) -> str:
        return f"the controller mutation rate quota is exceeded; retry in {throttle_ms} ms (controller_mutation_rate)"

    async def _mutate_each(self, items, mutate) -> tuple[list[tuple[Any, int, str | None]], int]:
        """The controller mutation quota over one request's topics (KIP-599): `mutate(item)`
        returns (error code, message, partitions created or deleted) and runs only while
        the caller is not throttled; once it is, each remaining item is answered
        THROTTLING_QUOTA_EXCEEDED. Returns ([(item, code, message)], throttle ms)."""
        throttle = self._mutation_throttle()
        results = []
        for item in items:
            if throttle > 0:
                results.append((item, ErrorCode.THROTTLING_QUOTA_EXCEEDED, self._throttled(throttle)))
                continue
            code, msg, mutated = await mutate(item)
            if code == ErrorCode.NONE and mutated:
                throttle = max(throttle, self._record_mutations(mutated))
            results.append((item, code, msg))
        return results, throttle

    async def CreateTopics(self, request, context):
        principal = _owner(current_principal.get())

        async def create(t):
            bad = topic_admin.validate_topic_configs(dict(t.configs))
            if bad is not None:
                return ErrorCode.INVALID_CONFIG, bad, 0
            code, msg = await asyncio.to_thread(self.cluster.create_topic, t.name, t.num_partitions,
                                                t.replication_factor or 1, dict(t.configs), False, principal,
                                                self._partition_quota(principal))
            return code, msg, t.num_partitions

        results, throttle = await self._mutate_each(request.topics, create)
        return pb.CreateTopicsResponse(throttle_time_ms=throttle, topics=[
            pb.CreatableTopicResult(name=t.name, error_code=code, error_message=msg) for t, code, msg in results])

    async def DeleteTopics(self, request, context):
        async def delete(name):
            known = self.cluster.topic(name)
            code, msg = await asyncio.to_thread(self.cluster.delete_topic, name)
            return code, msg, len(known.partitions) if known is not None else 0

        results, throttle = await self._mutate_each(request.topic_names, delete)
        return pb.DeleteTopicsResponse(throttle_time_ms=throttle, responses=[
            pb.DeletableTopicResult(name=name, error_code=code, error_message=msg) for name, code, msg in results])

    async def CreatePartitions(self, request, context):
        async def grow(t):
            known = self.cluster.topic(t.name)
            more = t.count - len(known.partitions) if known is not None else 0
            # The new partitions count against the topic's creator (the caller for a topic without one).
            code, msg = await asyncio.to_thread(self.cluster.create_partitions, t.name, t.count,
                                                request.validate_only, _owner(current_principal.get()),
                                                self._partition_quota)
            return code, msg, 0 if request.validate_only else more

        results, throttle = await self._mutate_each(request.topics, grow)
        return pb.CreatePartitionsResponse(throttle_time_ms=throttle, results=[
            pb.CreatePartitionsTopicResult(name=t.name, error_code=code, error_message=msg)
            for t, code, msg in results])

    async def DescribeConfigs(self, request, context):
        resp = pb.DescribeConfigsResponse()
        for r in request.resources:
            configs = await asyncio.to_thread(self.cluster.topic_configs, r.resource_name)
            out = resp.results.add(resource_name=r.resource_name)
            if configs is None:
                out.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                out.error_message = f"unknown topic {r.resource_name!r}"
                continue
            for entry in topic_admin.describe_topic_configs(configs, list(r.configuration_keys)):
                out.configs.add(name=entry.name, value=entry.value, source=entry.source,
                                read_only=False, documentation=entry.documentation)
        return resp

    async def IncrementalAlterConfigs(self, request, context):
        resp = pb.IncrementalAlterConfigsResponse()
        for r in request.resources:
            ops = [(c.name, c.config_operation, c.value) for c in r.configs]
            code, msg = await asyncio.to_thread(self.cluster.alter_topic_configs, r.resource_name,
                                                lambda configs, ops=ops: topic_admin.apply_config_ops(configs, ops),
                                                request.validate_only)
            resp.responses.append(pb.AlterConfigsResourceResponse(resource_name=r.resource_name, error_code=code,
                                                                  error_message=msg))
        return resp

    async def CreateAcls(self, request, context):
        return await self.security.change_acls(request.creations, add=True)

    async def DeleteAcls(self, request, context):
        return await self.security.change_acls(request.deletions, add=False)

    async def DescribeAcls(self, request, context):
        return await self.security.describe_acls()

    async def AlterUserScramCredentials(self, request, context):
        return await self.security.alter_users(request)

    async def DescribeUserScramCredentials(self, request, context):
        return await self.security.describe_users()

    async def DescribeClientQuotas(self, request, context):
        return await self.security.describe_quotas(request)

    async def AlterClientQuotas(self, request, context):
        return await self.security.alter_quotas(request)

    async def SaslAuthenticate(self, request, context):
        return await sasl_authenticate(getattr(self.cluster, "sasl", None), request,
                                       context.peer() if context is not None else "")

    async def DescribeFeatures(self, request, context):
        return await asyncio.to_thread(describe_features, self.cluster)

    async def UpdateFeatures(self, request, context):
        return await asyncio.to_thread(update_features, self.cluster, request)

    async def FindCoordinator(self, request, context):
        kind = KIND_FOR_KEY_TYPE.get(request.key_type)
        if kind is None:
            return pb.FindCoordinatorResponse(error_code=ErrorCode.INVALID_REQUEST,
                                              error_message=f"unknown key_type {request.key_type}")
        if not request.key:
            return pb.FindCoordinatorResponse(error_code=ErrorCode.INVALID_REQUEST,
                                              error_message="empty coordinator key")
        partition, node, epoch = await self.cluster.lookup_coordinator(kind, request.key)
        if node is None:
            what = INTERNAL_TOPIC_FOR_KIND[kind]
            return pb.FindCoordinatorResponse(error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE, partition=partition,
                                              error_message=f"no live owner of {what}-{partition}")
        return pb.FindCoordinatorResponse(node_id=node.node_id, host=node.host, port=node.port,
                                          partition=partition, coordinator_epoch=epoch)


UPGRADE, SAFE_DOWNGRADE = 1, 2  # Kafka's FeatureUpdate.UpgradeType (3, UNSAFE_DOWNGRADE, is refused)


def describe_features(cluster: ClusterState) -> pb.DescribeFeaturesResponse:
    """DescribeFeatures: this process's supported range, the finalized
    metadata.version and its epoch, and every live process's advertised range, read
    from ZooKeeper (features.py). Blocking (kazoo)."""
    def supported(rng: features.SupportedRange) -> pb.SupportedFeature:
        return pb.SupportedFeature(name=features.METADATA_VERSION, min_version=rng.min_version,
                                   max_version=rng.max_version)
    data, stat = cluster.zk.get(features.FEATURES_PATH)
    resp = pb.DescribeFeaturesResponse(
        supported=[supported(cluster.supported)], finalized_epoch=stat.version,
        finalized=[pb.FinalizedFeature(name=features.METADATA_VERSION, level=features.decode_finalized(data))])
    for node_id, (role, rng) in sorted(cluster.feature_processes().items()):
        resp.processes.append(pb.ProcessFeatures(node_id=node_id, role=role, supported=[supported(rng)],
                                                 advertised=rng is not features.PRE_FEATURES))
    return resp


def update_features(cluster: ClusterState, request: pb.UpdateFeaturesRequest) -> pb.UpdateFeaturesResponse:
    """UpdateFeatures (KIP-584): each update of metadata.version goes through
    ClusterState.update_metadata_version (an upgrade only when every live process
    supports the level; an unsafe downgrade refused). Another feature name is
    INVALID_UPDATE_VERSION. Blocking (kazoo)."""
    resp = pb.UpdateFeaturesResponse()
    for u in request.updates:
        if u.name != features.METADATA_VERSION:
            code, why = ErrorCode.INVALID_UPDATE_VERSION, f"unknown feature {u.name!r} (known: metadata.version)"
        elif u.upgrade_type not in (UPGRADE, SAFE_DOWNGRADE):
            code, why = ErrorCode.INVALID_UPDATE_VERSION, "an unsafe downgrade of metadata.version is not supported"
        else:
            code, why = cluster.update_metadata_version(u.level, u.upgrade_type == UPGRADE, request.validate_only)
        resp.results.append(pb.FeatureUpdateResult(name=u.name, error_code=code, error_message=why))
    return resp


async def sasl_authenticate(gateway, request: pb.SaslAuthenticateRequest, peer: str) -> pb.SaslAuthenticateResponse:
    """One step of Cluster/SaslAuthenticate (docs/design.md, "SASL"): the first step
    (no session_id) starts an exchange of `request.mechanism`; a SCRAM exchange's
    second step finishes it. Once complete the answer carries a session token
    (SessionTokens) good for session_lifetime_ms. Refusals: UNSUPPORTED_SASL_MECHANISM,
    SASL_AUTHENTICATION_FAILED (bad credentials after the failed-authentication delay,
    throttled, unknown or expired session_id), ILLEGAL_SASL_STATE without TLS."""
    from ..security.sasl import SaslFailure, UnsupportedMechanism
    if gateway is None or gateway.tokens is None:
        return pb.SaslAuthenticateResponse(error_code=ErrorCode.ILLEGAL_SASL_STATE,
                                           error_message="SASL is available on TLS listeners only")
    # "ipv4:127.0.0.1:5000" / "ipv6:[::1]:5000" -> the address; the throttle keys on its host.
    peer = peer.split(":", 1)[1] if peer.startswith(("ipv4:", "ipv6:")) else peer
    try:
        if len(request.auth_bytes) > gateway.max_receive_bytes:
            raise SaslFailure(f"a SASL message of {len(request.auth_bytes)} bytes is larger than "
                              f"sasl.server.max.receive.size={gateway.max_receive_bytes}")
        if request.session_id:
            server = gateway.resume(request.session_id)
            if server is None:
                raise SaslFailure("unknown or expired SASL session_id; start the exchange again")
        else:
            server = gateway.server(request.mechanism, peer)
        reply = await server.step(request.auth_bytes)
    except UnsupportedMechanism as exc:
        return pb.SaslAuthenticateResponse(error_code=ErrorCode.UNSUPPORTED_SASL_MECHANISM, error_message=str(exc))
    except SaslFailure as exc:
        log.info("SASL authentication from %s failed: %s", peer, exc)
        return pb.SaslAuthenticateResponse(error_code=ErrorCode.SASL_AUTHENTICATION_FAILED, error_message=str(exc))
    if not server.done:
        return pb.SaslAuthenticateResponse(auth_bytes=reply, session_id=gateway.begin(server))
    token, lifetime_ms = gateway.tokens.issue(server.username, server.mechanism, server.fingerprint)
    return pb.SaslAuthenticateResponse(auth_bytes=reply, token=token, session_lifetime_ms=lifetime_ms)


class SecurityAdmin:
    """CreateAcls, DeleteAcls, DescribeAcls, AlterUserScramCredentials and
    DescribeUserScramCredentials of the Cluster service, on ZooKeeper (the ACL store
    and /exactly/config/users, which every service watches)."""

    def __init__(self, cluster: ClusterState, tls: bool):
        self.cluster = cluster
        self.tls = tls

    async def change_acls(self, acls, add: bool) -> pb.AclsResponse:
        resp = pb.AclsResponse()
        store = await asyncio.to_thread(AclStore, self.cluster.zk, None, self.cluster.zk_security.sensitive_acl)
        for m in acls:
            try:
                binding = binding_of_message(m)
            except (ValueError, KeyError) as exc:
                resp.results.add(error_code=ErrorCode.INVALID_REQUEST, error_message=f"invalid ACL: {exc}")
                continue
            await asyncio.to_thread(store.add if add else store.remove, binding)
            resp.results.add(error_code=ErrorCode.NONE)
        return resp

    async def describe_acls(self) -> pb.DescribeAclsResponse:
        store = await asyncio.to_thread(AclStore, self.cluster.zk, None, self.cluster.zk_security.sensitive_acl)
        return pb.DescribeAclsResponse(acls=[acl_message(b) for b in await asyncio.to_thread(store.list)])

    async def alter_users(self, request: pb.AlterUserScramCredentialsRequest) -> pb.AlterUserScramCredentialsResponse:
        resp = pb.AlterUserScramCredentialsResponse()
        zk = self.cluster.zk
        for u in request.upsertions:
            if not self.tls:
                resp.results.add(user=u.name, error_code=ErrorCode.SECURITY_DISABLED,
                                 error_message="passwords are accepted over TLS listeners only")
                continue
            bad = _invalid_user_name(u.name) or (None if u.password else "a user needs a password")
            if bad:
                resp.results.add(user=u.name, error_code=ErrorCode.INVALID_REQUEST, error_message=bad)
                continue
            iterations = u.iterations or SCRAM_ITERATIONS
            try:
                check_iterations(iterations)
            except ValueError as exc:  # Kafka's bounds: a cheap credential, or a check costly to trigger
                resp.results.add(user=u.name, error_code=ErrorCode.UNACCEPTABLE_CREDENTIAL, error_message=str(exc))
                continue
            # SCRAM-SHA-512 and SCRAM-SHA-256 credentials (two PBKDF2s: off the event loop).
            data = await asyncio.to_thread(create_user_credentials, u.password, iterations)
            path = f"{USERS}/{u.name}"

            def write(path=path, data=data):
                if zk.exists(path):
                    zk.set(path, data)
                else:
                    zk.create(path, data, acl=self.cluster.zk_security.sensitive_acl)
            await asyncio.to_thread(self.cluster.ensure_sensitive_path, USERS)
            await asyncio.to_thread(write)
            resp.results.add(user=u.name, error_code=ErrorCode.NONE)
        for name in request.deletions:
            bad = _invalid_user_name(name)
            if bad:
                resp.results.add(user=name, error_code=ErrorCode.INVALID_REQUEST, error_message=bad)
                continue

            def delete(path=f"{USERS}/{name}"):
                from kazoo.exceptions import NoNodeError
                try:
                    zk.delete(path)
                    return True
                except NoNodeError:
                    return False
            found = await asyncio.to_thread(delete)
            resp.results.add(user=name, error_code=ErrorCode.NONE if found else ErrorCode.INVALID_REQUEST,
                             error_message="" if found else f"no user {name!r}")
        return resp

    async def alter_quotas(self, request: pb.AlterClientQuotasRequest) -> pb.AlterClientQuotasResponse:
        """Each entry's quota keys set or removed in the quotas znode (one version-checked
        write per entry; a bad entry is refused alone, with INVALID_REQUEST)."""
        resp = pb.AlterClientQuotasResponse()
        store = quotas.QuotaStore(self.cluster.zk)
        for entry in request.entries:
            out = resp.entries.add(entity=entry.entity)
            try:
                entity = _quota_entity(entry.entity)
                ops = [(v.key, None if v.remove else v.value) for v in entry.values]
                quotas.alter({}, entity, ops)  # validates before anything is written
                if not request.validate_only:
                    await asyncio.to_thread(store.change, lambda c, e=entity, o=ops: quotas.alter(c, e, o))
            except quotas.QuotaError as exc:
                out.error_code, out.error_message = ErrorCode.INVALID_REQUEST, str(exc)
        return resp

    async def describe_quotas(self, request: pb.DescribeClientQuotasRequest) -> pb.DescribeClientQuotasResponse:
        """The quota entries whose entity matches every filter component (match_type 0:
        the name, 1: the default entity, 2: any entity of the type; `strict`: the entity
        has no other component)."""
        configs = await asyncio.to_thread(quotas.QuotaStore(self.cluster.zk).read)
        resp = pb.DescribeClientQuotasResponse()
        for entity, values in sorted(configs.items(), key=lambda kv: kv[0].key()):
            names = {quotas.USER: entity.user, quotas.CLIENT_ID: entity.client_id}
            if not _quota_filter_matches(names, request.components, request.strict):
                continue
            resp.entries.add(entity=_quota_components(entity),
                             values=[pb.ClientQuotaValue(key=k, value=v) for k, v in sorted(values.items())])
        return resp

    async def describe_users(self) -> pb.DescribeUserScramCredentialsResponse:
        await asyncio.to_thread(self.cluster.ensure_sensitive_path, USERS)
        return pb.DescribeUserScramCredentialsResponse(users=sorted(await asyncio.to_thread(
            self.cluster.zk.get_children, USERS)))


def _quota_entity(components) -> quotas.QuotaEntity:
    """The QuotaEntity of AlterClientQuotas' entity components; QuotaError when malformed."""
    names: dict[str, str] = {}
    for c in components:
        if c.entity_type not in (quotas.USER, quotas.CLIENT_ID) or c.entity_type in names:
            raise quotas.QuotaError(f"bad entity type {c.entity_type!r}: user and client-id, each at most once")
        names[c.entity_type] = quotas.DEFAULT if c.is_default else c.name
    entity = quotas.QuotaEntity(names.get(quotas.USER), names.get(quotas.CLIENT_ID))
    entity.validate()
    return entity


def _quota_components(entity: quotas.QuotaEntity) -> list[pb.ClientQuotaEntityComponent]:
    out = []
    for kind, name in ((quotas.USER, entity.user), (quotas.CLIENT_ID, entity.client_id)):
        if name is not None:
            out.append(pb.ClientQuotaEntityComponent(entity_type=kind, name="" if name == quotas.DEFAULT else name,
                                                     is_default=name == quotas.DEFAULT))
    return out


def _quota_filter_matches(names: dict[str, str | None], components, strict: bool) -> bool:
    """DescribeClientQuotas' filter (KIP-546) over an entity's names by type."""
    for c in components:
        name = names.get(c.entity_type)
        if name is None:
            return False
        if c.match_type == 0 and name != c.match:
            return False
        if c.match_type == 1 and name != quotas.DEFAULT:
            return False
    if strict:
        filtered = {c.entity_type for c in components}
        if any(n is not None and kind not in filtered for kind, n in names.items()):
            return False
    return True


def _owner(principal: str) -> str:
    """The principal a new topic is recorded as created by ("" for User:ANONYMOUS,
    which has no partition quota of its own)."""
    return "" if principal == ANONYMOUS else principal


_USER_NAME = re.compile(r"[A-Za-z0-9._@+=-]{1,255}")


def _invalid_user_name(name: str) -> str | None:
    """Why `name` cannot be a SCRAM user (None when it can): 1-255 of letters, digits
    and . _ @ + = -, and not "." or ".." (each user is a znode under
    /exactly/config/users, so a name must never reach another path)."""
    if not _USER_NAME.fullmatch(name or "") or name in (".", ".."):
        return (f"invalid user name {name!r}: 1-255 letters, digits or . _ @ + = -, "
                "and not '.' or '..'")
    return None


async def serve(cfg: ServiceConfig, setup: Setup) -> None:
    """Run one service process until SIGTERM/SIGINT (see module docstring)."""
    cfg.data_dir.mkdir(parents=True, exist_ok=True)
    nofile = connections.raise_nofile_limit()
    for listener in ("grpc", "kafka"):
        connections.declare_series(listener)
    auth_interceptor = AuthInterceptor()
    quota_interceptor = quotas.QuotaInterceptor()  # after authentication: it reads the principal
    auth_interceptor.gate = quota_interceptor  # holds muted callers' calls, refused ones included
    # The guard outside authentication: an undecodable body is refused before anything reads it.
    interceptors = [metrics.RpcMetricsInterceptor(), RequestGuard(), auth_interceptor, quota_interceptor]
    server = grpc.aio.server(options=server_options(cfg, nofile), interceptors=interceptors)
    registry = HandlerRegistry(server)  # the unary handlers, which tunneled calls reach too
    security = service_security(cfg)
    bind = f"{_bracketed(cfg.host)}:{cfg.port}"
    port = server.add_secure_port(bind, server_credentials(cfg, security)) if security.tls \
        else server.add_insecure_port(bind)
    metrics.set_topic_labels(cfg.settings.metrics_topic_labels)
    metrics.set_group_labels(cfg.settings.metrics_group_labels)
    metrics_server = _start_metrics(cfg)
    metrics.declare_build_info()
    _declare_rpc_series(cfg.role)
    cluster = ClusterState(cfg.zookeeper, cfg.node_id, cfg.role, cfg.advertised, port,
                           session_timeout_s=cfg.settings.zookeeper_session_timeout_ms / 1000,
                           props=cfg.settings, assigned_broker_id=meta.load_or_create(cfg.data_dir, cfg.node_id, broker_id))
    await asyncio.to_thread(cluster.start)  # FeatureLevelError: this version cannot run at the finalized level
    stop = asyncio.Event()
    unsupported: list[str] = []
    loop = asyncio.get_running_loop()

    def on_level(level: int) -> None:
        """A level raised above what this version supports while it runs (it
        registered after `exactly features upgrade` checked the live processes):
        stop, and exit with the error, as at start-up."""
        try:
            features.check_finalized(level, cluster.supported)
        except features.FeatureLevelError as exc:
            unsupported.append(str(exc))
            loop.call_soon_threadsafe(stop.set)
    cluster.add_feature_listener(on_level)
    client = ClusterClient(cluster, security, cfg.settings.keepalive_time_ms)
    await asyncio.to_thread(_start_security, cfg, cluster, security, auth_interceptor, client)
    quota_manager = await asyncio.to_thread(_start_quotas, cfg, cluster)
    quota_interceptor.manager = quota_manager
    cluster_servicer = ClusterServicer(cluster, tls=security.tls, quota_manager=quota_manager)
    pbg.add_ClusterServicer_to_server(cluster_servicer, registry)
    health_servicer = health.aio.HealthServicer() if hasattr(health, "aio") else health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    await _set_health(health_servicer, health_pb2.HealthCheckResponse.NOT_SERVING)
    await _set_health(health_servicer, health_pb2.HealthCheckResponse.SERVING, LIVENESS)
    service = await setup(registry, cluster, client, cfg)
    tunnel = TunnelServicer(registry, interceptors, cfg.settings.tunnel_max_in_flight_calls,
                            cfg.settings.tunnel_max_queued_replies)
    add_tunnel_to_server(tunnel, server)
    client_calls = TunnelServicer(registry, interceptors, cfg.settings.client_stream_max_in_flight_calls,
                                  cfg.settings.tunnel_max_queued_replies,
                                  open_method=CLIENT_OPEN_METHOD, carried=CLIENT_CARRIED)
    add_client_calls_to_server(client_calls, server)
    await server.start()
    if cfg.link_port >= 0:
        tunnel.link = client_calls.link = LinkServer(
            tunnel, cfg.settings.socket_request_max_bytes,
            idle_timeout_s=cfg.settings.connections_max_idle_ms / 1000,
            handshake_timeout_s=cfg.settings.ssl_handshake_timeout_ms / 1000,
            keepalive_s=cfg.settings.keepalive_time_ms / 1000,
            client_servicer=client_calls, max_client_links=cfg.settings.client_link_max_links,
            max_client_links_per_principal=cfg.settings.client_link_max_links_per_principal)
        # The gRPC port's rule on client certificates (ssl.client.auth): a ticket alone does not
        # pass where a certificate is required.
        await tunnel.link.start(cfg.host, cfg.link_port, ssl_context(cfg, security) if security.tls else None)
    sweeper, kafka_limits = connection_sweeper(cfg, port, nofile)
    sweeper = asyncio.create_task(sweeper.run(), name="connection-sweeper")
    trimmer = memory.MemoryTrim.from_settings(cfg.settings)
    trimmer = asyncio.create_task(trimmer.run(), name="memory-trim") if trimmer is not None else None
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await service.start()
    kafka = None
    if cfg.kafka_port >= 0:
        cluster_apis = ClusterApis(cluster, authz.AuthorizedServicer(cluster_servicer, "Cluster"), client.channel,
                                   settings=cfg.settings, props=cfg.props)
        own = service.kafka_handlers() if hasattr(service, "kafka_handlers") else {}
        apis = kafka_surface.apis_for(cfg.role, {**cluster_apis.handlers(), **own}, cluster_apis.elsewhere())
        sasl = cluster.sasl if security.tls and cluster.sasl.mechanisms else None
        required = cfg.settings.ssl_client_auth == "required"
        kafka = KafkaListener(apis, principal_rules=cfg.settings.ssl_principal_mapping_rules,
                              sasl=sasl, require_authentication=required,
                              quota_manager=quota_manager,
                              limits=kafka_limits,
                              idle_timeout_s=cfg.settings.connections_max_idle_ms / 1000,
                              handshake_timeout_s=cfg.settings.ssl_handshake_timeout_ms / 1000,
                              max_preauth_bytes=cfg.settings.sasl_server_max_receive_size,
                              auth_timeout_s=cfg.settings.exactly_sasl_authentication_timeout_ms / 1000,
                              reauth_ms=cfg.settings.connections_max_reauth_ms)
        cluster.kafka_port = await kafka.start(cfg.host, cfg.kafka_port,
                                               ssl_context(cfg, security, sasl is not None) if security.tls else None)
    await asyncio.to_thread(cluster.register)
    if hasattr(service, "wait_ready"):
        await service.wait_ready()
    await _set_health(health_servicer, health_pb2.HealthCheckResponse.SERVING)
    watcher = None
    if hasattr(service, "loading"):
        poll_s = max(cfg.settings.health_poll_ms, 10) / 1000
        watcher = asyncio.create_task(_follow_loading(service, health_servicer, poll_s), name="health")
    (cfg.data_dir / "port").write_text(str(port))
    if kafka is not None:
        (cfg.data_dir / "kafka-port").write_text(str(cluster.kafka_port))
    if tunnel.link is not None:
        (cfg.data_dir / "link-port").write_text(str(tunnel.link.port))
    log.info("%s %s (Exactly %s) serving on %s:%d (advertised as %s:%d), Kafka protocol on port %s, links on "
             "port %s, event loop %s", cfg.role, cfg.node_id, version(), cfg.host, port, cfg.advertised, port,
             cluster.kafka_port or "none", tunnel.link.port if tunnel.link else "none",
             type(loop).__module__.split(".")[0])
    await stop.wait()
    if unsupported:
        log.critical("%s", unsupported[0])
    log.info("%s %s stopping", cfg.role, cfg.node_id)
    for task in (watcher, sweeper, trimmer):
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    await _set_health(health_servicer, health_pb2.HealthCheckResponse.NOT_SERVING)
    await _set_health(health_servicer, health_pb2.HealthCheckResponse.NOT_SERVING, LIVENESS)
    if kafka is not None:
        await kafka.stop()
    if tunnel.link is not None:
        await tunnel.link.stop()
    await server.stop(grace=1.0)
    await service.stop()
    await client.close()
    await asyncio.to_thread(cluster.stop)
    if metrics_server is not None:
        metrics_server.close()
    for name in ("port", "kafka-port", "link-port"):
        try:
            os.unlink(cfg.data_dir / name)
        except FileNotFoundError:
            pass
    if unsupported:
        raise features.FeatureLevelError(unsupported[0])


def server_options(cfg: ServiceConfig, nofile: int | None = None) -> list[tuple[str, int]]:
    """gRPC server options: `socket.request.max.bytes` (Kafka's name, default
    104857600) is the largest request the server receives (a larger one is refused
    with RESOURCE_EXHAUSTED before it is parsed); `exactly.max.concurrent.streams`
    (default 1000) the calls in flight per connection (more wait in HTTP/2 flow
    control, Kafka's muted channel). Connections (docs/design.md, "Connections"):
    grpcio's core closes a connection whose TLS handshake has not ended after
    `exactly.ssl.handshake.timeout.ms`, one without calls for `connections.max.idle.ms`
    (an HTTP/2 GOAWAY), and refuses any beyond `max.connections` bounded by the fd
    budget (`nofile`: RLIMIT_NOFILE, default the current soft limit, less
    `exactly.connections.fd.reserve`, halved between the two listeners). Keepalive
    (exactly_wire.keepalive.server_options): the server accepts a client's pings every
    half of `exactly.keepalive.time.ms` (capped at the SDK's interval), calls open or
    not, so it never answers its clients' keepalive with GOAWAY too_many_pings."""
    settings = cfg.settings
    options = {**dict(CHANNEL_OPTIONS), **dict(keepalive.server_options(settings.keepalive_time_ms))}
    options["grpc.server_handshake_timeout_ms"] = settings.ssl_handshake_timeout_ms
    options["grpc.max_connection_idle_ms"] = settings.connections_max_idle_ms
    options["grpc.max_allowed_incoming_connections"] = _connection_cap(cfg, nofile)
    options["grpc.max_receive_message_length"] = settings.socket_request_max_bytes
    options["grpc.max_concurrent_streams"] = settings.max_concurrent_streams
    return list(options.items())


def _connection_cap(cfg: ServiceConfig, nofile: int | None) -> int:
    """Connections one listener may hold: max.connections within the fd budget."""
    if nofile is None:
        import resource
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return connections.connection_budget(nofile, cfg.settings.connections_fd_reserve, cfg.settings.max_connections)


def connection_limits(cfg: ServiceConfig, nofile: int) -> connections.ConnectionLimits:
    """One listener's ConnectionLimits from max.connections (within the fd budget),
    max.connections.per.ip, max.connections.per.ip.overrides and
    max.connection.creation.rate."""
    return connections.ConnectionLimits(
        _connection_cap(cfg, nofile), cfg.settings.max_connections_per_ip,
        connections.parse_overrides(cfg.settings.max_connections_per_ip_overrides),
        cfg.settings.max_connection_creation_rate)


def connection_sweeper(cfg: ServiceConfig, port: int,
                       nofile: int) -> tuple[connections.GrpcConnectionSweeper, connections.ConnectionLimits]:
    """(the gRPC port's sweeper, the Kafka port's ConnectionLimits): the sweeper applies
    the per-IP limits (max.connections.per.ip has a default), the creation rate and
    max.connections within the descriptor budget, which it recomputes at every sweep for
    both listeners (DescriptorBudget: the descriptors of the partitions' files, ZooKeeper
    and the channels count)."""
    grpc_limits, kafka_limits = connection_limits(cfg, nofile), connection_limits(cfg, nofile)
    budget = connections.DescriptorBudget(cfg.settings.connections_fd_reserve, cfg.settings.max_connections,
                                          [grpc_limits, kafka_limits])
    sweeper = connections.GrpcConnectionSweeper(port, grpc_limits, connections.RefusalLog("grpc"),
                                                cfg.settings.connections_sweep_interval_ms / 1000, budget)
    return sweeper, kafka_limits


async def _set_health(servicer, status, name: str = "") -> None:
    res = servicer.set(name, status)
    if asyncio.iscoroutine(res):
        await res


async def _follow_loading(service, health_servicer, poll_s: float) -> None:
    """Keep health "" NOT_SERVING while `service.loading` is true, SERVING otherwise."""
    serving = True
    while True:
        try:
            loading = bool(service.loading)
        except Exception:  # noqa: BLE001 - a broken probe must not stop the process; logged
            log.exception("reading the service's loading state failed")
            loading = False
        if loading == serving:
            serving = not loading
            log.info("health: %s", "SERVING" if serving else "NOT_SERVING (loading a partition)")
            await _set_health(health_servicer, health_pb2.HealthCheckResponse.SERVING if serving
                              else health_pb2.HealthCheckResponse.NOT_SERVING)
        await asyncio.sleep(poll_s)


def _start_security(cfg: ServiceConfig, cluster: ClusterState, security: TransportSecurity,
                    interceptor: AuthInterceptor, client: ClusterClient) -> None:
    """Authentication (SCRAM users from ZooKeeper) and, with authorizer=acl, the ACL
    authorizer fed by a ZooKeeper watch and the producer-id binding check over
    `client` (docs/design.md, "Security")."""
    users = UserStore(cluster.zk, cluster.ensure_sensitive_path)
    gateway = sasl_gateway(cfg, cluster, users, security)
    interceptor.authenticator = Authenticator(users, tls=security.tls,
                                              mapping_rules=cfg.settings.ssl_principal_mapping_rules,
                                              tokens=gateway.tokens)
    if cfg.settings.authorizer == "acl":
        authorizer = Authorizer(super_users=parse_super_users(cfg.settings.super_users),
                                allow_if_no_acl=cfg.settings.allow_everyone_if_no_acl_found)
        AclStore(cluster.zk, AclCache(authorizer), cluster.zk_security.sensitive_acl)
        interceptor.authorizer = authorizer
        authz.active_authorizer = authorizer
        cluster.pid_bindings = ProducerIdBindings(cluster, client, cfg.settings.producer_id_expiration_ms)
    cluster.users = users
    cluster.sasl = gateway


def sasl_gateway(cfg: ServiceConfig, cluster: ClusterState, users: UserStore, security: TransportSecurity):
    """The process's SASL (services.common.security.sasl.SaslGateway) from its settings:
    sasl.enabled.mechanisms, connection.failed.authentication.delay.ms,
    exactly.sasl.failed.authentication.attempts.per.second, sasl.server.max.receive.size
    and exactly.sasl.session.lifetime.ms; session tokens (TLS listeners only) signed with
    the cluster's key from ZooKeeper."""
    from ..security.sasl import AuthThrottle, SaslGateway, SessionTokens, load_token_key, parse_mechanisms
    tokens = None
    if security.tls:
        key = load_token_key(cluster.zk, cluster.zk_security.sensitive_acl)
        tokens = SessionTokens(key, users, cfg.settings.exactly_sasl_session_lifetime_ms)
    return SaslGateway(users, parse_mechanisms(cfg.settings.sasl_enabled_mechanisms),
                       AuthThrottle(float(cfg.settings.exactly_sasl_failed_authentication_attempts_per_second)),
                       cfg.settings.connection_failed_authentication_delay_ms, tokens,
                       max_receive_bytes=cfg.settings.sasl_server_max_receive_size)


def _start_quotas(cfg: ServiceConfig, cluster: ClusterState) -> quotas.QuotaManager:
    """The process's client quotas (services.common.security.quotas), kept current by a watch
    on /exactly/config/quotas; super users (the services) are not throttled."""
    manager = quotas.QuotaManager(samples=cfg.settings.quota_window_num,
                                  window_s=cfg.settings.quota_window_size_seconds,
                                  super_users=parse_super_users(cfg.settings.super_users),
                                  sensor_expiration_ms=cfg.settings.quota_sensor_expiration_ms)
    metrics.QUOTA_SENSORS.set_function(manager.sensors)
    quotas.QuotaStore(cluster.zk).watch(manager)
    return manager


def server_credentials(cfg: ServiceConfig, security: TransportSecurity) -> grpc.ServerCredentials:
    """gRPC server credentials: the service's certificate; client certificates of the
    CA required, or verified when presented, as `ssl.client.auth` says."""
    client_auth = cfg.settings.ssl_client_auth
    return grpc.ssl_server_credentials([(security.key, security.certificate)],
                                       root_certificates=security.ca if client_auth != "none" else None,
                                       require_client_auth=client_auth == "required")


def ssl_context(cfg: ServiceConfig, security: TransportSecurity, sasl: bool = False):
    """The Kafka listener's TLS context, with the same certificate and client-auth rule;
    with `sasl`, ssl.client.auth=required asks for a certificate without requiring one
    (a connection without one must then authenticate with SASL: KafkaListener)."""
    import ssl
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    load_pem_chain(ctx, security.certificate, security.key)
    client_auth = cfg.settings.ssl_client_auth
    if client_auth != "none":
        ctx.load_verify_locations(cadata=security.ca.decode())
        ctx.verify_mode = ssl.CERT_REQUIRED if client_auth == "required" and not sasl else ssl.CERT_OPTIONAL
    return ctx


def _bracketed(host: str) -> str:
    """An IPv6 literal in brackets, as gRPC addresses need ("::" -> "[::]")."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _start_metrics(cfg: ServiceConfig) -> metrics.MetricsServer | None:
    """Start /metrics when `metrics.port` > 0 (bound to `metrics.bind.address`,
    default the gRPC bind host)."""
    port = cfg.settings.metrics_port
    if port <= 0:
        return None
    address = cfg.settings.metrics_bind_address or cfg.host
    server = metrics.start_metrics_server(port, address)
    log.info("metrics on http://%s:%d/metrics", _bracketed(server.address[0]), server.address[1])
    return server


def _declare_rpc_series(role: str) -> None:
    """Create the RPC series of every method this process serves, at 0."""
    metrics.declare_service(pb.DESCRIPTOR.services_by_name["Cluster"])
    metrics.declare_service(health_pb2.DESCRIPTOR.services_by_name["Health"])
    name = ROLE_SERVICES.get(role)
    if name is not None:
        metrics.declare_service(pb.DESCRIPTOR.services_by_name[name])


def main_for(role: str, setup: Setup, argv: list[str] | None = None) -> None:
    """Entry point of `python -m services.<role>`. Sets the process's umask to 077
    first: every directory and file the service creates (its data directory, logs,
    snapshots, port files) is its owner's only (0700 / 0600)."""
    os.umask(0o077)
    cfg = parse_args(role, argv)
    logging.basicConfig(level=os.environ.get("EXACTLY_LOG_LEVEL", "INFO"), stream=sys.stderr,
                        format=f"%(asctime)s {cfg.node_id} %(levelname)s %(name)s: %(message)s")
    log.info("%s %s starting: Exactly %s (%s), Python %s", role, cfg.node_id, version(), DISTRIBUTION,
             platform.python_version())
    logging.getLogger("kazoo").setLevel(logging.WARNING)
    try:
        with asyncio.Runner(loop_factory=loop_factory(cfg.settings.event_loop)) as runner:
            runner.run(serve(cfg, setup))
    except (features.FeatureLevelError, features.UnknownFormatVersion, meta.MetaPropertiesError) as exc:
        # Refusals that name what this version cannot run with: one line, no traceback.
        log.critical("%s %s does not start: %s", role, cfg.node_id, exc)
        sys.exit(2)


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event-loop factory for setting exactly.event.loop: "uvloop" -> uvloop's
    (libuv; the same calls cost the services less CPU, `python -m bench.server_cost
    --event-loop`), or None (asyncio's default loop) when uvloop is not installed (a
    warning says so) or for "asyncio"."""
    if name == "uvloop":
        try:
            import uvloop
        except ImportError:
            log.warning("exactly.event.loop=uvloop but the uvloop package is not installed; using asyncio's loop")
            return None
        return uvloop.new_event_loop
    return None
