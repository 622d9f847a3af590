"""One configuration schema for the SDK clients and the services: unknown keys,
unsupported keys and wrong values are refused naming the key, the value and what is
allowed; the configuration reference tables (docs/reference/configuration.md) are generated from the schemas."""
from __future__ import annotations

import subprocess
import sys

import pytest

from exactly import AdminClient, Consumer, Producer, errors
from exactly.config import ConsumerSchema, ProducerSchema, parse
from exactly_tools import config_docs, design_docs
from exactly_wire.config import ConfigurationError, keys
from services.common.config import ServiceConfig, parse_args
from services.common.settings import SERVICE_SCHEMAS, PartitionLeaderSchema, settings_by_role
from services.partition_leader.partition import PartitionConfig

ROOT = design_docs.ROOT
BOOT = {"bootstrap.servers": "127.0.0.1:1"}


# ---------------------------------------------------------------- SDK

@pytest.mark.parametrize("client, conf, key, words", [
    (Consumer, {"group_id": "g"}, "group_id", "did you mean 'group.id'"),
    (Producer, {"group.id": "g"}, "group.id", "a setting of the consumer"),
    (Consumer, {"linger.ms": 5}, "linger.ms", "a setting of the producer"),
    (Producer, {"lingerms": 5}, "lingerms", "did you mean 'linger.ms'"),
    (AdminClient, {"transactional.id": "t"}, "transactional.id", "a setting of the producer"),
    (Producer, {"linger.ms": "soon"}, "linger.ms", "a number >= 0"),
    (Producer, {"acks": 2}, "acks", "one of: all, -1, 0, 1"),
    (Producer, {"batch.size": 0}, "batch.size", "an integer >= 1"),
    (Producer, {"compression.type": "brotli"}, "compression.type", "none, gzip, snappy, lz4, zstd"),
    (Producer, {"enable.idempotence": "yes"}, "enable.idempotence", "true or false"),
    (Consumer, {"enable.auto.commit": "1"}, "enable.auto.commit", "true or false"),
    (Consumer, {"isolation.level": "serializable"}, "isolation.level", "read_uncommitted, read_committed"),
    (Consumer, {"max.poll.records": -5}, "max.poll.records", "an integer >= 1"),
    (Producer, {"security.protocol": "TLS"}, "security.protocol", "one of: PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"),
    (Producer, {"security.protocol": "SSL"}, "ssl.ca.location", "needs ssl.ca.location"),
    (Consumer, {"security.protocol": "SSL", "ssl.ca.location": "/no/such/ca.pem"}, "ssl.ca.location",
     "No such file"),
    (Producer, {"security.protocol": "SASL_PLAINTEXT", "sasl.username": "u"}, "sasl.password",
     "needs sasl.username and sasl.password"),
    (Producer, {"sasl.mechanism": "GSSAPI"}, "sasl.mechanism", "one of: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"),
    (Producer, {"ssl.endpoint.identification.algorithm": "none"}, "ssl.endpoint.identification.algorithm",
     "one of: https"),
    (Producer, {"value.serializer": "x"}, "value.serializer", "serialize in the application"),
    (Consumer, {"partition.assignment.strategy": "roundrobin"}, "partition.assignment.strategy", "range"),
    (Producer, {"transactional.id": "t", "enable.idempotence": False}, "enable.idempotence", "requires"),
    (Producer, {"enable.idempotence": True, "acks": 1}, "enable.idempotence", "acks=all"),
])
def test_sdk_refuses_bad_settings_naming_the_key(client, conf, key, words):
    with pytest.raises(errors.ConfigurationError) as info:
        client({**BOOT, **conf})
    e = info.value
    assert e.key == key and key in str(e) and words in str(e)
    assert isinstance(e, ValueError) and isinstance(e, errors.ExactlyError)


def test_bootstrap_servers_is_required():
    with pytest.raises(errors.ConfigurationError, match="bootstrap.servers is required") as info:
        Producer({"linger.ms": 1})
    assert info.value.key == "bootstrap.servers"


def test_values_are_read_once_with_one_boolean_parser():
    p = parse(ProducerSchema, {**BOOT, "acks": -1, "linger.ms": "7", "enable.idempotence": "FALSE",
                               "compression.type": "ZSTD", "transactional.id": None})
    assert (p.acks, p.linger_ms, p.enable_idempotence, p.compression_type, p.transactional_id) == \
        ("-1", 7.0, False, "zstd", None)
    c = parse(ConsumerSchema, {**BOOT, "check.crcs": "True", "auto.offset.reset": "smallest",
                               "isolation.level": "READ_COMMITTED"})
    assert (c.check_crcs, c.auto_offset_reset, c.isolation_level) == (True, "earliest", "read_committed")
    assert (c.fetch_max_wait_ms, c.max_poll_records) == (500, 500)


# ---------------------------------------------------------------- services

def _args(role: str, *extra: str) -> list[str]:
    return ["--node-id", "n", "--zookeeper", "127.0.0.1:1", "--data-dir", "/tmp/unused", *extra]


@pytest.mark.parametrize("role, setting, words", [
    ("partition_leader", "min.insync.replica=2", "did you mean 'min.insync.replicas'"),
    ("partition_leader", "min.insync.replicas=two", "min.insync.replicas='two'"),
    ("partition_leader", "transaction.partition.verification.enable=yes", "true or false"),
    ("partition_leader", "transaction.state.log.num.partitions=3", "a setting of the transaction coordinator"),
    ("txn_coordinator", "transaction.max.timeout.ms=0", "an integer >= 1"),
    ("txn_coordinator", "ssl.keystore.location=/k", "give PEM files"),
    ("group_coordinator", "group.max.size=-1", "group.max.size"),
    ("group_coordinator", "broker.id=3", "use --node-id"),
    ("txn_coordinator", "transaction.prepared.max.ms=3600000", "never aborts a prepared transaction"),
])
def test_service_command_line_refuses_bad_settings(role, setting, words, capsys):
    with pytest.raises(SystemExit) as info:
        parse_args(role, _args(role, "--set", setting))
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert setting.partition("=")[0] in err and words in err


def test_service_properties_file_is_read_and_set_overrides_it(tmp_path, capsys):
    f = tmp_path / "pl.properties"
    f.write_text("# partition leader\nmin.insync.replicas = 2\nsegment.bytes: 1048576\n")
    cfg = parse_args("partition_leader", _args("partition_leader", "--config", str(f),
                                               "--set", "segment.bytes=2097152"))
    assert cfg.get_int("min.insync.replicas", 1) == 2 and cfg.get_int("segment.bytes", 0) == 2097152
    f.write_text("min.insync.replicas=2\nlinger.ms=5\n")
    with pytest.raises(SystemExit):
        parse_args("partition_leader", _args("partition_leader", "--config", str(f)))
    assert "linger.ms" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args("partition_leader", _args("partition_leader", "--config", str(tmp_path / "missing")))
    assert "missing" in capsys.readouterr().err


def test_service_config_values_are_typed_and_unset_keys_take_the_default():
    cfg = ServiceConfig("n", "txn_coordinator", props={"transaction.max.timeout.ms": "5000",
                                                       "exactly.txn.retry.backoff.ms": "7"})
    assert cfg.get_int("transaction.max.timeout.ms", 1) == 5000
    assert cfg.get_int("transactional.id.expiration.ms", 42) == 42
    with pytest.raises(ConfigurationError):
        ServiceConfig("n", "group_coordinator", props={"group.max.size": "many"})


def test_cluster_wide_settings_are_split_by_role():
    split = settings_by_role({"min.insync.replicas": "2", "transaction.state.log.num.partitions": "4",
                              "offsets.topic.num.partitions": "4", "zookeeper.session.timeout.ms": "6000"})
    assert split["partition_leader"] == {"min.insync.replicas": "2", "zookeeper.session.timeout.ms": "6000"}
    # A transaction coordinator hosts replicas of its internal topic (metadata.version 3).
    assert split["txn_coordinator"] == {"min.insync.replicas": "2", "transaction.state.log.num.partitions": "4",
                                        "zookeeper.session.timeout.ms": "6000"}
    assert split["group_coordinator"] == {"offsets.topic.num.partitions": "4",
                                          "zookeeper.session.timeout.ms": "6000"}
    with pytest.raises(ConfigurationError, match="did you mean 'offsets.topic.num.partitions'"):
        settings_by_role({"offsets.topic.num.partition": "4"})
    with pytest.raises(ConfigurationError, match="min.insync.replicas"):
        settings_by_role({"min.insync.replicas": "0"})
    # A removed key of a role is refused with its reason, not as an unknown key.
    with pytest.raises(ConfigurationError, match="removed: the coordinator never aborts a prepared transaction"):
        settings_by_role({"transaction.prepared.max.ms": "3600000"})


def test_a_service_process_with_a_bad_setting_exits_before_starting(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "services.partition_leader",
                           *_args("partition_leader", "--set", "replica.lag.time.max.ms=fast")],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2
    assert "replica.lag.time.max.ms='fast'" in proc.stderr and "an integer >= 1" in proc.stderr


def _schema_default(schema, key):
    return schema.model_fields[{i.alias: n for n, i in schema.model_fields.items()}[key]].default


def test_schema_defaults_are_the_defaults_the_services_use():
    pl_defaults = {k: str(_schema_default(PartitionLeaderSchema, k)) for k in keys(PartitionLeaderSchema)
                   if _schema_default(PartitionLeaderSchema, k) is not None and k in
                   ("min.insync.replicas", "producer.snapshot.interval.ms", "producer.snapshot.retained",
                    "producer.id.expiration.ms")}
    assert PartitionConfig.from_settings(pl_defaults) == PartitionConfig.from_settings({})


def test_producer_id_expiration_is_one_setting_of_every_role_that_uses_it():
    """The leaders' producer-state expiry and binding cache, the transaction coordinators'
    binding expiry and the group coordinators' binding cache read one definition."""
    fields = [schema.model_fields["producer_id_expiration_ms"] for schema in SERVICE_SCHEMAS.values()]
    assert len({(f.alias, f.default, f.description) for f in fields}) == 1
    assert fields[0].default == PartitionConfig().producer_id_expiration_ms


def test_every_role_has_a_schema():
    assert set(SERVICE_SCHEMAS) == {"partition_leader", "txn_coordinator", "group_coordinator"}


# ---------------------------------------------------------------- docs/reference/configuration.md

def test_the_configuration_tables_are_generated_from_the_schemas():
    text = config_docs.PAGE.read_text()
    assert config_docs.blocks(text) == list(config_docs.TABLES)
    assert config_docs.render(text) == text, "run: python -m exactly_tools.config_docs"
    for key in keys(ProducerSchema) + keys(PartitionLeaderSchema):
        assert f"| `{key}` |" in text
