"""`exactly-dev up --security` writes the client property files itself (bootstrap.servers
included): with them the SDK reaches the secured cluster as User:admin or as a SASL user.
A client whose transport does not match the service's (no client certificate, plaintext
against TLS, the Kafka port instead of the gRPC port) gets errors.ConnectionSetupError
saying what the service expected, not grpcio's "Socket closed". (The security
walkthrough of docs/security.md runs in tests/docs.)"""
from __future__ import annotations

import subprocess

import pytest

from exactly import AdminClient, errors
from waiting import wait_for

from .test_dev_cluster_cli import VENV_BIN, bash, shell_env

pytestmark = pytest.mark.integration


@pytest.fixture
def secure_dir(tmp_path):
    yield tmp_path
    if (tmp_path / ".run" / "secure" / "cluster.json").exists():
        subprocess.run([str(VENV_BIN / "exactly-dev"), "down", "--dir", ".run/secure"], cwd=tmp_path,
                       env=shell_env(), timeout=120, capture_output=True)


def _properties(path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if line and not line.startswith("#"))


def test_transport_mismatches_say_what_the_service_expected(secure_dir):
    res = bash("exactly-dev up --dir .run/secure --security --partition-leaders 1", secure_dir)
    assert res.returncode == 0, res.stderr[-3000:]
    d = secure_dir / ".run" / "secure"
    admin = _properties(d / "client.properties")
    kafka = _properties(d / "kafka-client.properties")
    sasl = _properties(d / "sasl-client.properties")
    assert admin["bootstrap.servers"] and admin["security.protocol"] == "SSL"
    assert kafka["bootstrap.servers"] != admin["bootstrap.servers"]
    with AdminClient({**admin, "request.timeout.ms": 10000}) as client:
        client.alter_user_scram_credentials({"billing": "billing-secret"})
    creds = {"sasl.username": "billing", "sasl.password": "billing-secret", "request.timeout.ms": 10000}
    cases = {
        # SASL without the certificate the gRPC port requires
        "requires a client certificate": {k: v for k, v in sasl.items() if not k.startswith("ssl.certificate")
                                          and not k.startswith("ssl.key")} | creds,
        "speaks TLS: set security.protocol=SSL": {"bootstrap.servers": admin["bootstrap.servers"],
                                                   "request.timeout.ms": 10000},
        "is a Kafka protocol port": {**admin, "bootstrap.servers": kafka["bootstrap.servers"],
                                     "request.timeout.ms": 10000},
    }
    for expected, conf in cases.items():
        with pytest.raises(errors.ConnectionSetupError) as info:
            with AdminClient(conf) as client:
                client.list_topics()
        assert expected in str(info.value), str(info.value)
        assert info.value.fatal and not info.value.retriable
    # With the settings exactly-dev wrote, the same calls work, once the new user's SCRAM
    # credential reached the service through its ZooKeeper watch (as with Kafka's brokers, a
    # credential takes effect on each service a moment after it is written).
    def sasl_lists() -> bool:
        try:
            with AdminClient({**sasl, **creds}) as client:
                client.list_topics()
            return True
        except errors.SaslAuthenticationFailedError:
            return False
    wait_for(sasl_lists, 30, "the new user's credential to work on the services")
