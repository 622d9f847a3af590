"""A secured release's Secrets: the chart makes the ZooKeeper passwords itself; without
cert-manager, `helm install` fails naming the certificates' Secrets to create and how to
name them, instead of rendering pods that wait for Secrets nobody creates. For every value
set, each Secret a rendered pod needs is made by the chart (or cert-manager) or named by
the user."""
from __future__ import annotations

import base64

import helm_python as helm
import pytest

from tests.deploy.test_helm_chart import (CERT_MANAGER, EXTERNAL_ZK, PLAINTEXT, RELEASE, USER_SECRETS, by_kind,
                                          merged, render, secrets_missing)

pytestmark = pytest.mark.integration

NAMED = {USER_SECRETS["security"]["tls"]["existingSecret"], USER_SECRETS["security"]["tls"]["clientSecret"]}


def test_a_secured_install_without_certificates_fails_naming_what_to_create():
    with pytest.raises(helm.errors.HelmRenderError) as info:
        render({}, user_secrets=False)
    message = str(info.value)
    assert "security.tls.certManager.enabled=true" in message
    assert f"--set security.tls.existingSecret={RELEASE}-tls" in message
    assert f"{RELEASE}-partition-leader-2, {RELEASE}-txn-coordinator-0" in message and f"{RELEASE}-zookeeper-0" in message
    assert f"--set security.tls.clientSecret={RELEASE}-admin-tls" in message
    assert "The ZooKeeper passwords the chart makes itself" in message
    with pytest.raises(helm.errors.HelmRenderError) as info:
        render({"security": {"tls": {"existingSecret": "mine"}}}, user_secrets=False)
    assert "existingSecret" not in str(info.value) and "clientSecret" in str(info.value)
    # Plaintext needs no certificate; cert-manager issues them.
    assert render(PLAINTEXT, user_secrets=False) and render(CERT_MANAGER, user_secrets=False)


@pytest.mark.parametrize("name,values,by_hand", [
    ("certificates named", {}, NAMED),
    ("cert-manager", CERT_MANAGER, set()),
    ("ensemble of 3", {"zookeeper": {"replicas": 3}}, NAMED),
    ("cert-manager, ensemble of 3", merged(CERT_MANAGER, {"zookeeper": {"replicas": 3}}), set()),
    ("external ZooKeeper", EXTERNAL_ZK, NAMED),
    ("plaintext", PLAINTEXT, set()),
])
def test_every_secret_a_pod_needs_is_made_or_named(name, values, by_hand):
    objects = render(values, user_secrets=bool(by_hand))
    assert secrets_missing(objects, by_hand) == set(), name


def test_the_chart_makes_random_zookeeper_passwords():
    objects = render({"zookeeper": {"replicas": 3}})
    secrets = by_kind(objects, "Secret")
    for name in (f"{RELEASE}-zookeeper", f"{RELEASE}-zookeeper-quorum"):
        password = base64.b64decode(secrets[name]["data"]["password"]).decode()
        assert len(password) == 32 and password.isalnum(), name
        assert secrets[name]["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    again = by_kind(render({"zookeeper": {"replicas": 3}}), "Secret")
    assert again[f"{RELEASE}-zookeeper"]["data"] != secrets[f"{RELEASE}-zookeeper"]["data"]  # random per install
    # A Secret of the user's is used instead.
    named = render({"security": {"zookeeper": {"existingSecret": "zk-mine"}}})
    assert f"{RELEASE}-zookeeper" not in by_kind(named, "Secret")
