"""Feature levels and format versions (services.common.cluster.features), a data
directory's meta.properties (services.common.cluster.meta), the per-principal partition
counts below and at the level that introduces them (partition_usage), and calls a peer
does not implement (transport.rpc, transport.tunnel): answered as not supported by
that version, never as a network error to retry."""
from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import grpc
import pytest
from kazoo.exceptions import NoNodeError

from exactly_tools import design_docs
from exactly_wire.error_codes import RETRIABLE, ErrorCode
from exactly_wire.v1 import exactly_pb2 as pb
from services.common.cluster import features, meta
from services.common.cluster.partition_usage import PartitionUsage
from services.common.cluster.state import NodeInfo, broker_id, broker_id_collision
from services.common.transport.rpc import transport_error_code
from services.common.transport.tunnel import TunnelChannel, TunnelError, method_path

Range = features.SupportedRange


def test_a_process_refuses_a_finalized_level_it_does_not_support_naming_it():
    features.check_finalized(1)
    features.check_finalized(features.STABLE_LEVEL)
    features.check_finalized(features.MAX_LEVEL, features.supported_range(unstable=True))
    with pytest.raises(features.FeatureLevelError, match=r"metadata.version 4 is finalized in ZooKeeper "
                                                         r"\(/exactly/features\), and this version of Exactly "
                                                         r"supports metadata.version 1-3"):
        features.check_finalized(4, features.KNOWN)
    with pytest.raises(features.FeatureLevelError, match="metadata.version 2 .* supports metadata.version 1:"):
        features.check_finalized(2, features.PRE_FEATURES)


def test_every_level_this_version_knows_is_stable():
    assert features.MAX_LEVEL == features.STABLE_LEVEL == 3
    assert features.supported_range(unstable=False) == features.SUPPORTED == features.KNOWN == Range(1, 3)
    assert features.supported_range(unstable=True) == features.KNOWN


def test_an_unstable_level_runs_only_where_it_is_enabled(monkeypatch):
    # While level 3 was still being built (stable up to 2), a process without
    # unstable.feature.versions.enable ran at 1-2 only.
    stable_only = Range(1, 2)
    monkeypatch.setattr(features, "STABLE_LEVEL", 2)
    with pytest.raises(features.FeatureLevelError, match="metadata.version 3 is finalized .* an unstable level "
                                                         r"of this version of Exactly \(it runs at 1-2\): set "
                                                         "unstable.feature.versions.enable=true"):
        features.check_finalized(3, stable_only)
    assert "set unstable.feature.versions.enable=true on every process" in features.upgrade_refusal(
        3, 2, {}, stable_only)
    assert features.upgrade_refusal(3, 2, {"pl-0": Range(1, 3)}, features.KNOWN) is None
    why = features.upgrade_refusal(3, 2, {"pl-0": Range(1, 3), "txn-0": Range(1, 2)}, features.KNOWN)
    assert why == ("metadata.version 3 is not supported by every live process: txn-0 (supports 1-2); "
                   "upgrade them first")
    assert features.registration_features(features.KNOWN) == {"metadata.version": {"min_version": 1,
                                                                                    "max_version": 3}}


def test_a_new_cluster_starts_at_the_newest_level_it_runs_at_an_existing_one_at_the_baseline():
    assert features.initial_level(existing_cluster=False) == features.STABLE_LEVEL == 3
    assert features.initial_level(existing_cluster=False, supported=Range(1, 2)) == 2
    assert features.initial_level(existing_cluster=True) == features.BASELINE_LEVEL == 1
    assert features.initial_level(existing_cluster=True, supported=features.KNOWN) == 1
    assert features.decode_finalized(features.encode_finalized(2)) == 2


def test_an_upgrade_is_refused_while_a_live_process_lacks_the_level_naming_each():
    processes = {"pl-0": Range(1, 2), "txn-1": features.PRE_FEATURES, "group-0": Range(1, 1)}
    why = features.upgrade_refusal(2, 1, processes)
    assert why == ("metadata.version 2 is not supported by every live process: group-0 (supports 1), "
                   "txn-1 (supports 1); upgrade them first")
    assert features.upgrade_refusal(2, 1, {"pl-0": Range(1, 2), "txn-0": Range(1, 3)}) is None
    assert "not a level this version supports" in features.upgrade_refusal(4, 2, {})
    assert "that is a downgrade" in features.upgrade_refusal(1, 2, {})


def test_a_downgrade_below_a_raised_level_is_refused():
    assert features.downgrade_refusal(2, 2) is None  # the same level: nothing changes
    why = features.downgrade_refusal(1, 2)
    assert why.startswith("metadata.version 2 cannot be lowered to 1") and "before the level is raised" in why
    assert "that is an upgrade" in features.downgrade_refusal(2, 1)


def test_registrations_advertise_their_range_and_old_ones_support_the_baseline():
    assert features.supported_of({"role": "partition_leader"}) is features.PRE_FEATURES
    assert features.supported_of({"features": features.registration_features()}) == features.SUPPORTED
    node = NodeInfo.from_registration("pl-0", json.dumps({"role": "partition_leader", "host": "h", "port": 1}).encode())
    assert (node.supported, node.broker_id) == (features.PRE_FEATURES, broker_id("pl-0"))
    node = NodeInfo.from_registration("pl-0", features.zk_json("zk-registration", {
        "role": "partition_leader", "host": "h", "port": 1, "broker_id": 77, "features": features.registration_features()}))
    assert (node.supported, node.broker_id) == (features.SUPPORTED, 77)
    with pytest.raises(features.UnknownFormatVersion, match="/exactly/services/pl-0: zk-registration version 9"):
        NodeInfo.from_registration("pl-0", json.dumps({"version": 9, "role": "x", "host": "h", "port": 1}).encode())


def test_every_format_names_the_level_of_each_version():
    for fmt in features.FORMATS.values():
        assert fmt.versions and all(level in features.LEVELS for level in fmt.versions.values()), fmt
        assert fmt.version_for(features.MAX_LEVEL) == fmt.newest
    assert features.write_version("txn-log-value", 1) == 0 and features.write_version("txn-log-value", 2) == 1
    assert features.zk_read("zk-topic", b'{"partitions": {}}', "/t") == {"partitions": {}}  # no field: version 1
    with pytest.raises(features.UnknownFormatVersion, match="/t: zk-topic version 2 is not one"):
        features.zk_read("zk-topic", b'{"version": 2}', "/t")


def test_meta_properties_keep_the_broker_id_of_the_derivation_and_the_node(tmp_path):
    assert meta.load_or_create(tmp_path, "pl-0", broker_id) == broker_id("pl-0")
    assert meta.load_or_create(tmp_path, "pl-0", lambda n: 5) == broker_id("pl-0")  # read back, not derived again
    with pytest.raises(meta.MetaPropertiesError, match="belongs to node 'pl-0', not 'pl-1'"):
        meta.load_or_create(tmp_path, "pl-1", broker_id)
    path = tmp_path / meta.META_FILE
    path.write_text(path.read_text().replace("version=0", "version=1"))
    with pytest.raises(features.UnknownFormatVersion, match="data-directory version 1"):
        meta.load_or_create(tmp_path, "pl-0", broker_id)


def test_a_registered_broker_id_counts_for_collisions():
    assert broker_id_collision("pl-1", ["pl-0", "pl-1"], mine=77, registered={"pl-0": 77}) == "pl-0"
    assert broker_id_collision("pl-1", ["pl-0", "pl-1"], mine=78, registered={"pl-0": 77}) is None


class _Zk:
    """get/set/ensure_path over a dict, like kazoo's."""

    def __init__(self):
        self.nodes: dict[str, tuple[bytes, int]] = {}

    def ensure_path(self, path):
        pass

    def get(self, path):
        if path not in self.nodes:
            raise NoNodeError()
        data, version = self.nodes[path]
        return data, SimpleNamespace(version=version)

    def set(self, path, data, version=-1):
        self.nodes[path] = (data, self.nodes.get(path, (b"", -1))[1] + 1)
        return SimpleNamespace(version=self.nodes[path][1])


class _Tx:
    def __init__(self):
        self.ops = []

    def create(self, path, data):
        self.ops.append(("create", path, data))

    def set_data(self, path, data, version):
        self.ops.append(("set", path, data))


def test_partition_counts_are_kept_only_from_the_level_that_introduces_them():
    zk, level = _Zk(), [1]
    usage = PartitionUsage(zk, lambda principal: 6, enabled=lambda: level[0] >= 2)
    path = usage.path("User:alice")
    zk.nodes[path] = (b'{"partitions": 1}', 3)  # written before counts were versioned
    tx = _Tx()
    assert usage.read("User:alice") == (6, None)  # below the level: counted from the topics
    assert usage.write(tx, "User:alice", 8, None) is False and tx.ops == []
    usage.adjust("User:alice", -1)
    assert zk.nodes[path] == (b'{"partitions": 1}', 3)
    level[0] = 2
    assert usage.read("User:alice") == (6, 3)  # an unversioned count is counted again
    assert usage.write(tx, "User:alice", 8, 3) is True
    assert json.loads(tx.ops[0][2]) == {"version": 1, "partitions": 8}
    zk.nodes[path] = (b'{"version": 1, "partitions": 4}', 4)
    assert usage.read("User:alice") == (4, 4)
    zk.nodes[path] = (b'{"version": 7, "partitions": 4}', 5)
    with pytest.raises(features.UnknownFormatVersion):
        usage.read("User:alice")


class _Error(grpc.RpcError):
    def __init__(self, code, details=""):
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


def test_an_unimplemented_call_is_not_supported_there_not_a_network_error():
    code = transport_error_code(_Error(grpc.StatusCode.UNIMPLEMENTED, "Method not found!"))
    assert code == ErrorCode.UNSUPPORTED_VERSION and code not in RETRIABLE
    assert transport_error_code(_Error(grpc.StatusCode.UNAVAILABLE)) == ErrorCode.NETWORK_EXCEPTION


def test_a_peer_without_the_tunnel_fails_tunneled_calls_as_unimplemented():
    """A server of a version without Tunnel/Calls: the stream's UNIMPLEMENTED is every
    call's answer (not UNAVAILABLE, which callers retry)."""
    async def body():
        server = grpc.aio.server()
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            tunnel = TunnelChannel(channel)
            # gRPC's core now and then loses the stream's status to a write racing the
            # refusal (INTERNAL): that call fails as a broken stream would, retriable,
            # and the next stream gets the refusal.
            codes = []
            while len(codes) < 5 and grpc.StatusCode.UNIMPLEMENTED not in codes:
                with pytest.raises(TunnelError) as refused:
                    await tunnel.call(method_path("Cluster", "Metadata"), pb.MetadataRequest(), pb.MetadataResponse,
                                      10)
                codes.append(refused.value.code())
            assert codes[-1] == grpc.StatusCode.UNIMPLEMENTED and set(codes[:-1]) <= {grpc.StatusCode.UNAVAILABLE}
            assert transport_error_code(refused.value) == ErrorCode.UNSUPPORTED_VERSION
            await tunnel.close()
        await server.stop(0)
    asyncio.run(body())


def test_the_formats_page_names_every_format_and_level():
    page = (design_docs.ROOT / "docs" / "operating" / "upgrade-formats.md").read_text()
    for name in features.FORMATS:
        assert f"| `{name}` |" in page, name
    for level in features.LEVELS:
        assert f"\n| {level} | " in page, level
