"""Every section of the README as it was before the documentation site (commit 5f0f6d9, a
2,416-line README) has a home in the site: each `##` and `###` heading of that README maps,
in `HOMES`, to the page that holds it now and the heading it has there, and that page has
that heading. Nothing is dropped silently: a heading missing from `HOMES`, or a page without
the heading, fails."""
from __future__ import annotations

import re
import subprocess

from docs.codeblocks import ROOT
from exactly_tools import design_docs

OLD_README = "5f0f6d9"
# old heading -> (page under docs/, its heading there; None: the same text)
HOMES: dict[str, tuple[str, str | None]] = {
    "Two commands": ("getting-started.md", None),
    "Using the SDK": ("sdk.md", None),
    "One producer per process: group-aware transactions (KIP-447 draft)": ("sdk.md", None),
    "Porting from confluent-kafka, kafka-python and aiokafka": ("sdk.md", None),
    "The consumer's calls": ("sdk.md", None),
    "asyncio": ("sdk.md", None),
    "Timeouts: what each one bounds": ("sdk.md", None),
    "Processes: what is safe across fork()": ("sdk.md", None),
    "Using Kafka clients": ("kafka-clients.md", None),
    "Config admin APIs": ("kafka-clients.md", None),
    "Quix Streams": ("kafka-clients.md", None),
    "Static membership and describe_cluster through the Kafka port": ("kafka-clients.md", None),
    "Compatibility": ("kafka-clients.md", None),
    "Security": ("security.md", None),
    "Quotas": ("security.md", None),
    "Connections": ("security.md", None),
    "SASL": ("security.md", None),
    "On Kubernetes": ("security.md", None),
    "Dev cluster": ("getting-started.md", None),
    "Operating Exactly: the `exactly` command": ("operating/cli.md", None),
    "Retention and compaction": ("operating/cli.md", None),
    "What to do about a hanging transaction": ("operating/cli.md", None),
    "Alerts": ("operating/alerts.md", None),
    "Architecture": ("index.md", None),
    "Benchmarks": ("benchmarks.md", None),
    "Exactly-once pipelines on Spark": ("spark.md", None),
    "Atomic writes to PostgreSQL and Exactly": ("postgres.md", None),
    "Operating on Kubernetes": ("operating/kubernetes.md", None),
    "Install with Helm": ("operating/kubernetes.md", None),
    "Metrics port": ("operating/kubernetes.md", None),
    "Dashboards": ("operating/kubernetes.md", None),
    "Health checks": ("operating/kubernetes.md", None),
    "The `kubernetes` package: `exactly-k8s`": ("operating/kubernetes.md", None),
    "Replication and failure model": ("operating/failures.md", None),
    "ZooKeeper faults": ("operating/failures.md", None),
    "Clocks": ("operating/failures.md", None),
    "Disk faults and durability": ("operating/failures.md", None),
    "Security and robustness": ("security.md", None),
    "Hostile input": ("security.md", None),
    "Tunnel, parked fetches and topic names": ("security.md", None),
    "Configuration reference": ("reference/configuration.md", "Configuration"),
    "Producer": ("reference/configuration.md", None),
    "Consumer": ("reference/configuration.md", None),
    "AdminClient": ("reference/configuration.md", None),
    "Partition leader": ("reference/configuration.md", None),
    "Transaction coordinator": ("reference/configuration.md", None),
    "Group coordinator": ("reference/configuration.md", None),
    "Topic configs": ("reference/configuration.md", None),
}


def headings(text: str, levels: tuple[int, ...] = (1, 2, 3, 4, 5, 6)) -> list[str]:
    """The headings of Markdown `text` (of the given levels), outside code fences."""
    return [title for level, title in design_docs.headings(text) if level in levels]


def old_readme() -> str:
    return subprocess.run(["git", "show", f"{OLD_README}:README.md"], cwd=ROOT, check=True, capture_output=True,
                          text=True, timeout=60).stdout


def test_every_old_readme_section_has_a_home_in_the_site():
    old = headings(old_readme(), (2, 3))
    assert len(old) > 40
    unmapped = [h for h in old if h not in HOMES]
    assert not unmapped, f"sections of the old README without a home in HOMES: {unmapped}"
    assert not set(HOMES) - set(old), f"HOMES names headings the old README lacks: {set(HOMES) - set(old)}"
    for heading, (page, there) in HOMES.items():
        assert (there or heading) in headings((ROOT / "docs" / page).read_text()), \
            f"old README section {heading!r}: docs/{page} has no heading {there or heading!r}"


def test_the_readme_is_a_door():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 200
    assert "## Quick start" in readme and "make demo" in readme and "make test" in readme
    linked = set(re.findall(r"\]\(docs/([^)#]+)", readme))
    missing = [p for p in linked if not (ROOT / "docs" / p).exists()]
    assert not missing, missing
