"""ZooKeeper over TLS settings (services/common/security/zk_tls.py): Kafka's zookeeper.ssl.* keys
mapped to kazoo's TLS arguments, and bad files refused before the service starts."""
from __future__ import annotations

import pytest

from exactly_wire.config import ConfigurationError
from services.common.config import parse_args
from services.common.security.zk_tls import ZkTls


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    from exactly_tools.certs import CertificateAuthority
    work = tmp_path_factory.mktemp("zk-tls-pki")
    ca = CertificateAuthority.create(work / "ca")
    return ca, ca.issue("pl-0"), ca.issue("zk-client")


def test_off_by_default_and_no_file_is_read(tmp_path):
    assert ZkTls.from_props({}).kazoo_kwargs() == {}
    missing = str(tmp_path / "missing.pem")
    props = {"zookeeper.ssl.client.enable": "false", "ssl.ca.location": missing,
             "zookeeper.ssl.truststore.location": missing}
    assert ZkTls.from_props(props).kazoo_kwargs() == {}


def test_the_services_own_identity_and_ca_by_default(pki):
    ca, own, _ = pki
    props = {"zookeeper.ssl.client.enable": "true", "ssl.ca.location": str(ca.ca_path),
             "ssl.certificate.location": str(own.certificate), "ssl.key.location": str(own.key)}
    assert ZkTls.from_props(props).kazoo_kwargs() == {
        "use_ssl": True, "verify_certs": True, "check_hostname": True, "ca": str(ca.ca_path),
        "certfile": str(own.certificate), "keyfile": str(own.key), "keyfile_password": None}


def test_keystore_truststore_and_endpoint_identification_override(pki, tmp_path):
    ca, own, other = pki
    keystore = tmp_path / "keystore.pem"
    keystore.write_bytes(other.key.read_bytes() + other.certificate.read_bytes())
    props = {"zookeeper.ssl.client.enable": "true", "ssl.ca.location": "/nonexistent",
             "ssl.certificate.location": str(own.certificate), "ssl.key.location": str(own.key),
             "zookeeper.ssl.keystore.location": str(keystore), "zookeeper.ssl.truststore.location": str(ca.ca_path),
             "zookeeper.ssl.endpoint.identification.algorithm": ""}
    kwargs = ZkTls.from_props(props).kazoo_kwargs()
    assert kwargs["certfile"] == kwargs["keyfile"] == str(keystore)
    assert kwargs["ca"] == str(ca.ca_path) and kwargs["check_hostname"] is False
    # neither a client certificate nor a CA file: the system's CAs, no certificate presented
    bare = ZkTls.from_props({"zookeeper.ssl.client.enable": "true"}).kazoo_kwargs()
    assert bare["ca"] is None and bare["certfile"] is None and bare["use_ssl"] is True


def test_bad_files_are_refused_naming_the_key(pki, tmp_path):
    ca, own, other = pki
    base = {"zookeeper.ssl.client.enable": "true", "ssl.ca.location": str(ca.ca_path),
            "ssl.certificate.location": str(own.certificate), "ssl.key.location": str(own.key)}
    with pytest.raises(ConfigurationError, match="ssl.certificate.location"):
        ZkTls.from_props({**base, "ssl.key.location": str(other.key)})  # not this certificate's key
    with pytest.raises(ConfigurationError, match="zookeeper.ssl.keystore.location"):
        ZkTls.from_props({**base, "zookeeper.ssl.keystore.location": str(own.certificate)})  # no key in it
    with pytest.raises(ConfigurationError, match="ssl.ca.location"):
        ZkTls.from_props({**base, "ssl.ca.location": str(tmp_path / "missing.crt")})
    with pytest.raises(ConfigurationError, match="zookeeper.ssl.keystore.password needs"):
        ZkTls.from_props({"zookeeper.ssl.keystore.password": "x"})


def test_the_service_command_line_refuses_an_unreadable_truststore(pki, tmp_path, capsys):
    ca, own, _ = pki
    args = ["--node-id", "pl-0", "--zookeeper", "127.0.0.1:2281", "--data-dir", str(tmp_path),
            "--set", "zookeeper.ssl.client.enable=true",
            "--set", f"zookeeper.ssl.truststore.location={tmp_path / 'missing.crt'}"]
    with pytest.raises(SystemExit):
        parse_args("partition_leader", args)
    assert "zookeeper.ssl.truststore.location" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args("partition_leader", args[:-2] + ["--set", "zookeeper.ssl.keystore.type=JKS"])
    assert "zookeeper.ssl.keystore.type" in capsys.readouterr().err
    ok = parse_args("partition_leader", args[:-2] + ["--set", f"zookeeper.ssl.truststore.location={ca.ca_path}"])
    assert ok.props["zookeeper.ssl.client.enable"] == "true"
