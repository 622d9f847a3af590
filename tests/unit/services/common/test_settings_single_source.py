"""Each setting is defined once: the schemas (services.common.settings for the service
roles, services.common.topic_config for topic configs) hold every key, default and
doc; the services read typed settings objects built from them; the configuration
reference's tables are generated from them. These tests fail when a key, a default or a
doc differs between the schemas, what the services use and the reference, and when code under
services/, clients/ (the SDK) or tools/ reads a dotted configuration key by string: the SDK's
clients parse their settings once with their schemas (exactly.config) and pass the parsed
object on."""
from __future__ import annotations

import ast
import re

import pytest

from exactly._client import ClientCore
from exactly._sender import SenderConfig
from exactly.config import AdminSchema, ConsumerSchema, ProducerSchema
from exactly_tools import design_docs
from exactly_wire import compression
from exactly_wire.config import keys, parse
from services.common import topic_config
from services.common.kafka.config_api import INT, LIST, LONG, topic_config_entries
from services.common.settings import (SERVICE_SCHEMAS, GroupCoordinatorSchema, PartitionLeaderSchema,
                                      TxnCoordinatorSchema, role_settings)
from services.group_coordinator.coordinator import GroupCoordinator
from services.group_coordinator.group import GroupMetadata
from services.group_coordinator.offsets_log import OffsetsLog
from services.group_coordinator.state import OffsetsPartitionState
from services.partition_leader.log import LogConfig
from services.partition_leader.partition import PartitionConfig
from services.partition_leader.replica_fetcher import ReplicaFetchers
from services.txn_coordinator.coordinator import TransactionCoordinator

ROOT = design_docs.ROOT
PAGE = ROOT / "docs" / "reference" / "configuration.md"


def _field(schema, key):
    return schema.model_fields[{i.alias: n for n, i in schema.model_fields.items()}[key]]


# ---------------------------------------------------------------- topic configs

def test_every_topic_config_has_a_broker_level_setting_with_the_same_default():
    leader_keys = set(keys(PartitionLeaderSchema))
    for spec in topic_config.SCHEMA:
        assert spec.broker_key in leader_keys, spec.key
        broker_default = _field(PartitionLeaderSchema, spec.broker_key).default
        # A broker-level key without a default of its own (an alias such as
        # log.segment.bytes) takes the topic config's.
        assert broker_default in (None, spec.default), (spec.key, broker_default, spec.default)
        assert spec.doc and spec.doc.endswith((".", ")")), spec.key
        assert spec.check(spec.default_text) is None, spec.key  # the default is a valid value


def test_the_partition_leader_resolves_the_schema_defaults():
    resolved = PartitionConfig.from_settings(PartitionLeaderSchema())
    assert resolved == PartitionConfig() == PartitionConfig.from_settings({})
    d = topic_config.DEFAULTS
    assert resolved.log == LogConfig(d.segment_bytes, d.index_interval_bytes, d.flush_messages, d.segment_ms)
    assert (resolved.retention_ms, resolved.retention_bytes, resolved.delete_retention_ms,
            resolved.max_message_bytes, resolved.min_insync_replicas) == \
        (d.retention_ms, d.retention_bytes, d.delete_retention_ms, d.max_message_bytes, d.min_insync_replicas)
    assert resolved.cleanup_policy == frozenset({d.cleanup_policy})


def test_each_topic_config_is_resolved_from_its_broker_level_setting():
    for spec in topic_config.SCHEMA:
        value = "compact" if spec.kind == topic_config.LIST else str(max(spec.low, 2) + 5)
        from_broker = PartitionConfig.from_settings({spec.broker_key: value})
        from_topic = PartitionConfig.from_settings({}, {spec.key: value})
        assert from_broker == from_topic != PartitionConfig(), spec.key


def test_describe_configs_types_and_defaults_come_from_the_schema():
    kinds = {topic_config.INT: INT, topic_config.LONG: LONG, topic_config.LIST: LIST}
    entries = {e["name"]: e for e in topic_config_entries({}, {}, None, True, True)}
    assert set(entries) == set(topic_config.BY_KEY)
    for spec in topic_config.SCHEMA:
        e = entries[spec.key]
        assert (e["config_type"], e["value"], e["documentation"]) == (kinds[spec.kind], spec.default_text, spec.doc)
        assert e["synonyms"][-1]["name"] == spec.broker_key


# ---------------------------------------------------------------- service roles

def test_the_services_settings_objects_default_to_the_schemas():
    # The coordinators hold their role's schema object itself: no second definition
    # of a key or a default exists to drift.
    assert TransactionCoordinator.build(None, None, None, None).config == TxnCoordinatorSchema()
    assert GroupCoordinator(None, lambda group: 0, lambda: {}).config == GroupCoordinatorSchema()
    assert GroupMetadata("g", 0).config == GroupCoordinatorSchema()
    leader = PartitionLeaderSchema()
    fetchers = ReplicaFetchers(None, lambda node: None, lambda address: None)
    assert (fetchers.max_wait_ms, fetchers.max_bytes, fetchers.backoff_s * 1000) == \
        (leader.replica_fetch_wait_max_ms, leader.replica_fetch_max_bytes, leader.replica_fetch_backoff_ms)


def test_a_set_value_reaches_the_services_settings_objects():
    txn = role_settings(TxnCoordinatorSchema, {"max.transaction.timeout.ms": "7000",
                                               "exactly.txn.batch.linger.ms": "3"})
    coordinator = TransactionCoordinator.build(None, None, None, None, txn)
    assert (coordinator.config.max_timeout_ms, coordinator.config.txn_batch_linger_ms) == (7000, 3)
    group = role_settings(GroupCoordinatorSchema, {"group.max.size": "4", "offsets.commit.timeout.ms": "7"})
    state = OffsetsPartitionState(0, group)
    state.groups["g"] = GroupMetadata("g", 0, state.config)
    olog = OffsetsLog(None, state, config=group, clock=lambda: 0, wall_clock=lambda: 0)
    assert (state.groups["g"].config.group_max_size, olog.config.offsets_commit_timeout_ms) == (4, 7)
    fetchers = ReplicaFetchers(None, lambda node: None, lambda address: None, {"replica.fetch.wait.max.ms": "9"})
    assert fetchers.max_wait_ms == 9


def test_no_service_module_restates_a_roles_defaults():
    # The pattern a second definition takes: a module-level instance of a role's
    # schema whose attributes become another class's field defaults.
    schemas = {"ServiceSchema", "PartitionLeaderSchema", "TxnCoordinatorSchema", "GroupCoordinatorSchema"}
    found = []
    for path in (ROOT / "services").rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                    isinstance(node.value.func, ast.Name) and node.value.func.id in schemas:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


# ---------------------------------------------------------------- docs/reference/configuration.md

def _rows(block: str) -> dict[str, list[str]]:
    text = PAGE.read_text()
    m = re.search(rf"<!-- config-table: {block} -->\n(.*?)<!-- /config-table -->", text, re.S)
    assert m, f"{PAGE} has no {block} table"
    rows = {}
    for line in m.group(1).splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        rows[cells[0].strip("`")] = cells
    return rows


def test_the_topic_config_table_is_the_schema():
    rows = _rows("topic")
    assert list(rows) == [spec.key for spec in topic_config.SCHEMA]
    for spec in topic_config.SCHEMA:
        _key, broker, _allowed, default, doc = rows[spec.key]
        assert (broker, default, doc) == (f"`{spec.broker_key}`", f"`{spec.default}`", spec.doc)


@pytest.mark.parametrize("block, schema", [("partition_leader", PartitionLeaderSchema),
                                           ("txn_coordinator", TxnCoordinatorSchema),
                                           ("group_coordinator", GroupCoordinatorSchema)])
def test_the_readme_service_tables_have_each_key_default_and_doc_of_the_schema(block, schema):
    rows = _rows(block)
    for key in keys(schema):
        info = _field(schema, key)
        _key, _allowed, default, _importance, doc = rows[key]
        assert doc == info.description, key
        if info.default is None:
            assert default == "unset", key
        elif not isinstance(info.default, bool):
            assert default.strip("`") == str(info.default) or (default == '""' and info.default == ""), key


# ---------------------------------------------------------------- no key read by string

# Modules that may name keys: the schemas, and the Kafka config API that maps names;
# and dotted names that are not settings: the feature metadata.version, the keys of a
# data directory's meta.properties.
_ALLOWED = {"services/common/settings.py", "services/common/topic_config.py", "services/common/kafka/config_api.py",
            "services/common/cluster/features.py", "services/common/cluster/meta.py"}
_KEY = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z0-9_]+)+$")
# Dotted names that are not settings: a feature (KIP-584) and a module.
_NOT_SETTINGS = {"metadata.version", "pyspark.context"}
_GETTERS = {"get", "get_int", "get_str", "get_bool", "get_float", "pop", "setdefault"}


def _key_constants(trees: dict[str, ast.Module]) -> set[str]:
    """Module-level names bound to a dotted key string, in any of `trees`."""
    names = set()
    for tree in trees.values():
        for node in tree.body:
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                    and isinstance(node.value.value, str) and _KEY.match(node.value.value)
                    and node.value.value not in _NOT_SETTINGS):
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def _names_a_key(node: ast.AST, constants: set[str]) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and bool(_KEY.match(node.value)) and node.value not in _NOT_SETTINGS
    if isinstance(node, ast.Name):
        return node.id in constants
    if isinstance(node, ast.Attribute):
        return node.attr in constants
    if isinstance(node, ast.JoinedStr):  # f"{prefix}.num.partitions"
        return any(isinstance(v, ast.Constant) and re.search(r"\.[a-z]+\.?", str(v.value)) and
                   not str(v.value).startswith("/") for v in node.values)
    return False


def key_reads(trees: dict[str, ast.Module]) -> list[str]:
    """`path:line` of every read of a configuration key by string: a getter call
    (`props.get("a.b", ...)`, `cfg.get_int(KEY, ...)`) or a subscript (`props["a.b"]`)
    whose key is a dotted literal, an f-string of one, or a constant bound to one."""
    constants = _key_constants(trees)
    found = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            key = None
            if isinstance(node, ast.Call) and node.args:
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if name in _GETTERS:
                    key = node.args[0]
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
                key = node.slice
            if key is not None and _names_a_key(key, constants):
                found.append(f"{path}:{node.lineno}")
    return found


def test_the_key_read_check_finds_reads_by_string():
    sample = {"x.py": ast.parse('KEY = "replica.lag.time.max.ms"\n'
                                'a = props.get("replica.fetch.wait.max.ms", 500)\n'
                                'b = cfg.get_int(KEY, 10000)\n'
                                'c = props["log.retention.ms"]\n'
                                'd = int(props.get(f"{prefix}.num.partitions", 8))\n'
                                'e = settings.replica_lag_time_max_ms\n'
                                'f = zk.get(f"{TOPICS}/{name}")\n'
                                'options["grpc.max_concurrent_streams"] = 5\n')}
    assert key_reads(sample) == ["x.py:2", "x.py:3", "x.py:4", "x.py:5"]


def _domain_trees() -> dict[str, ast.Module]:
    """The parsed modules of services/ that may not name keys (all but `_ALLOWED`)."""
    paths = ((path, path.relative_to(ROOT).as_posix()) for path in sorted((ROOT / "services").rglob("*.py")))
    return {rel: ast.parse(path.read_text(), rel) for path, rel in paths if rel not in _ALLOWED}


def test_domain_code_reads_no_configuration_key_by_string():
    assert key_reads(_domain_trees()) == [], "read typed settings attributes instead (services.common.settings)"


def _docstrings(tree: ast.Module) -> set[int]:
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}


def key_spellings(trees: dict[str, ast.Module], known: set[str]) -> list[str]:
    """`path:line: key` of every string in code (docstrings aside) that is a whole
    configuration key of `known`: a key named for a message, a metric label or a
    topic's configs is taken from its schema (`settings.key_of`, the constants of
    `topic_config`), not written again."""
    return [f"{path}:{node.lineno}: {node.value}"
            for path, tree in trees.items() for docs in [_docstrings(tree)] for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and node.value in known and id(node) not in docs]


def test_the_key_spelling_check_finds_a_key_written_again():
    sample = {"x.py": ast.parse('"""Reads max.connections."""\n'
                                'MAX = "max.connections"\n'
                                'refused(f"{MAX}: too many")\n'
                                'create(name, {"cleanup.policy": "compact"})\n'
                                'why = "max.connections is reached"\n')}
    assert key_spellings(sample, {"max.connections", "cleanup.policy"}) == \
        ["x.py:2: max.connections", "x.py:4: cleanup.policy"]


def test_domain_code_spells_no_configuration_key():
    known = {k for schema in SERVICE_SCHEMAS.values() for k in keys(schema)} | set(topic_config.BY_KEY) | \
        set(topic_config.BROKER_SYNONYMS.values())
    assert key_spellings(_domain_trees(), known) == [], "name a key by settings.key_of or topic_config's constants"


# Modules of clients/ and tools/ that may name keys: the schemas (the clients', the shared
# machinery's, the security keys') and the Spark data source's options, which it parses
# where Spark hands them over.
_CLIENT_SCHEMAS = {"clients/exactly/config.py", "clients/exactly_wire/config.py", "clients/exactly_wire/security.py",
                   "clients/exactly/spark/_options.py"}


def test_the_sdk_and_the_tools_read_no_configuration_key_by_string():
    trees = {}
    for folder in ("clients", "tools"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel not in _CLIENT_SCHEMAS and not path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                trees[rel] = ast.parse(path.read_text(), rel)
    assert key_reads(trees) == [], "parse the settings with their schema (exactly.config) and read its attributes"


def test_the_sdk_takes_its_settings_from_the_schemas():
    """The client core and the producer's sender hold what the parsed schema says, defaults
    included: no second definition of a key or a default in the SDK."""
    boot = {"bootstrap.servers": "a:1, b:2,"}
    for schema in (ProducerSchema, ConsumerSchema, AdminSchema):
        settings = parse(schema, boot)
        core = ClientCore(settings)
        try:
            assert core.bootstrap == ["a:1", "b:2"] == settings.bootstrap_addresses
            assert core.settings is settings and core.request_timeout_s == settings.request_timeout_ms / 1000
        finally:
            core.close()
    producer = parse(ProducerSchema, {**boot, "acks": "1", "compression.type": "zstd", "retry.backoff.ms": 7})
    sender = SenderConfig.from_settings(producer)
    assert (sender.acks, sender.compression, sender.backoff_ms, sender.request_timeout_ms, sender.txn_timeout_ms,
            sender.max_in_flight, sender.delivery_timeout_ms) == \
        (1, compression.codec_for("zstd"), 7, producer.request_timeout_ms, producer.transaction_timeout_ms,
         producer.max_in_flight_requests_per_connection, producer.delivery_timeout_ms)
    assert SenderConfig.from_settings(parse(ProducerSchema, boot)).acks == -1  # "all"
