"""A service process imports what its role needs, nothing more (restart time,
docs/design.md "Layout"): starting a partition leader, a transaction coordinator
or a group coordinator loads neither Spark, Kubernetes, the CLI and dev tools, the
client SDK, nor another role's package.

Each role's start modules (`services.<role>.__main__`, which `python -m` runs, and
the `service` module it sets up) are imported in a fresh interpreter, which
reports its `sys.modules`."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

ROLES = ("partition_leader", "txn_coordinator", "group_coordinator")
# Top-level packages no service role needs at start.
UNRELATED = ("pyspark", "pyarrow", "pandas", "numpy", "kubernetes", "kubernetes_validate", "helm", "yaml",
             "exactly_tools", "exactly", "demo", "bench", "confluent_kafka", "redis", "psycopg", "pytest")


def loaded_modules(*modules: str) -> set[str]:
    """Names in `sys.modules` of a new interpreter after importing `modules`."""
    code = ("import importlib, json, sys\n"
            f"for m in {list(modules)!r}: importlib.import_module(m)\n"
            "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return set(json.loads(out.stdout))


# A transaction coordinator hosts replicas of its internal topic (metadata.version 3) with
# the partition leader's replica code as a library (services.partition_leader.host), not
# with its process: its Kafka APIs and its service wiring stay out.
LIBRARIES = {"txn_coordinator": ("services.partition_leader",)}
NOT_LIBRARY = ("services.partition_leader.kafka_api", "services.partition_leader.service",
               "services.partition_leader.__main__")


def unrelated(names: set[str], role: str | None) -> list[str]:
    """The modules among `names` that a service of `role` should not have loaded."""
    others = {f"services.{r}" for r in ROLES if r != role} - set(LIBRARIES.get(role, ()))
    return sorted(n for n in names if n.split(".")[0] in UNRELATED or ".".join(n.split(".")[:2]) in others
                  or (role in LIBRARIES and n in NOT_LIBRARY))


@pytest.mark.parametrize("role", ROLES)
def test_a_service_start_imports_only_its_role(role):
    names = loaded_modules(f"services.{role}.__main__", f"services.{role}.service")
    assert f"services.{role}.service" in names
    assert unrelated(names, role) == []


def test_the_check_sees_an_unrelated_import():
    # The CLI imports the SDK and the dev tools: the same probe must report them.
    names = loaded_modules("exactly_tools.cli")
    found = unrelated(names, "partition_leader")
    assert any(n.startswith("exactly_tools.cli") for n in found)
    assert unrelated({"services.txn_coordinator.state", "services.partition_leader.log"}, "partition_leader") == \
        ["services.txn_coordinator.state"]
