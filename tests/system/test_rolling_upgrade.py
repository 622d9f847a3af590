"""Rolling upgrade from the previous release to the current code with traffic flowing,
and downgrade (docs/operating/upgrades.md), in the spirit of Kafka's upgrade system
tests (tests/kafkatest/tests/core/upgrade_test.py, downgrade_test.py).

A cluster of the previous release (PREVIOUS, installed into a virtualenv of its own by
tests/releases.py): 3 partition leaders, 2 transaction and 2 group coordinators, the
topics and the internal topics with replication factor 3 and min.insync.replicas 2.
One exactly-once copier per input partition (tests/system/copier.py) copies the input
to the output in consume-transform-produce transactions, one in five aborted on
purpose. While they run, every service in turn is stopped (SIGTERM) and started again
from the current code on the same data directory, node id and ports, in one of two
orders (partition leaders first, or coordinators first); as long as one process of
the previous release runs, `exactly features upgrade` is refused and names it. Then
metadata.version is raised (`exactly features upgrade`), every __transaction_state
partition records it, both transaction coordinators are restarted (they load the
partitions at the new level), and the copy goes on. With security on, every listener
speaks TLS, the ACL authorizer is on, and the copiers authenticate with SASL
(SCRAM-SHA-512) as a principal of their own that the ACLs allow only what a copier
needs.

Checked after the copy: every input record is in the output exactly once
(read_committed), no copier went more than MAX_STALL_S without a commit while it had
input, no copier failed a transaction or restarted, the aborted transactions are in
the log and hidden, ListTransactions lists only the copiers' transactional.ids, and no
service logged an error of its own.

The downgrade test rolls the cluster to the current code and back to the previous
release before the level is raised, with the same checks. After the level is raised
(the secured upgrade variant), a transaction coordinator of the previous release is
started once more: it does not know feature levels, so it cannot refuse to start, but
it refuses every __transaction_state partition it is given (the feature-level record
reads to it as a value of an unknown version, "version 3": the level) instead of serving them,
and lists no transactional.id it made up; the current code then takes over again.

`make test` runs one variant per order (secured with the leaders first, plaintext
with the coordinators first) and the downgrade; `make upgrade-test`
(EXACTLY_UPGRADE_FULL=1) all four orders x security.
"""
from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import sys
import time
from typing import Callable

import pytest

import releases
from clusters import new_chroot
from exactly import AclBinding, AdminClient, Producer, errors
from exactly_tools.certs import CertificateAuthority
from exactly_tools.devcluster import DevCluster
from waiting import wait_for

from .harness import (Comparison, copier_phases, create_topics, end_offsets, finish_copiers,
                      load_input, make_copiers, read_values, wait_gate, wait_in_sync)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500)]

PREVIOUS = "5f0f6d9"  # the previous release, 0.1.0
CURRENT = ""  # DevCluster's own interpreter: the current code
FULL = os.environ.get("EXACTLY_UPGRADE_FULL", "") not in ("", "0")
EXACTLY = pathlib.Path(sys.executable).parent / "exactly"
INPUT, OUTPUT = "input", "output"
INPUT_PARTITIONS, OUTPUT_PARTITIONS = 3, 3
RECORDS = 6_000
REPLICATION_FACTOR, MIN_INSYNC = 3, 2
TRANSACTION_SIZE = 50
ABORT_EVERY = 5  # one transaction in five aborted on purpose
MAX_RATE = 150.0
MAX_STALL_S = 30.0
PHASE_TIMEOUT_S = 180.0
TXN_PARTITIONS = 4  # transaction.state.log.num.partitions of a dev cluster
GROUP = "upgrade-copiers"
PASSWORD = "upgrade copier password"
LEADERS = ["pl-0", "pl-1", "pl-2"]
COORDINATORS = ["txn-0", "txn-1", "group-0", "group-1"]
ORDERS = {"leaders-first": LEADERS + COORDINATORS, "coordinators-first": COORDINATORS + LEADERS}
VARIANTS = [("leaders-first", True), ("coordinators-first", False)]
if FULL:
    VARIANTS += [("leaders-first", False), ("coordinators-first", True)]
CLUSTER_PROPS = {
    "zookeeper.session.timeout.ms": "6000",
    "transaction.state.log.replication.factor": str(REPLICATION_FACTOR),
    "offsets.topic.replication.factor": str(REPLICATION_FACTOR),
    "min.insync.replicas": str(MIN_INSYNC),
}
TOPICS = [INPUT, OUTPUT, "__transaction_state", "__consumer_offsets"]
# What a service of ours logs as an error (kazoo's own errors while a session closes are not).
SERVICE_ERROR = re.compile(r" (ERROR|CRITICAL) services\.")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


@pytest.fixture(scope="module")
def previous() -> releases.Release:
    return releases.install(PREVIOUS)


class Run:
    """One cluster of the previous release with its input loaded, and its copiers."""

    def __init__(self, zk: str, tmp_path: pathlib.Path, previous: releases.Release, security: bool):
        self.previous = str(previous.python)
        self.cluster = DevCluster(tmp_path / "cluster", props=dict(CLUSTER_PROPS), security=security)
        try:
            self.cluster.up(3, 2, 2, zookeeper=new_chroot(zk, "upgrade"), python=self.previous, timeout_s=120)
        except BaseException:
            self.cluster.down()
            raise
        self.admin = self.cluster.client_config
        self.bootstrap = self.cluster.bootstrap_servers
        create_topics(self.bootstrap, {INPUT: INPUT_PARTITIONS, OUTPUT: OUTPUT_PARTITIONS}, REPLICATION_FACTOR,
                      MIN_INSYNC, self.admin)
        self.expected = load_input(self.bootstrap, INPUT, INPUT_PARTITIONS, RECORDS, self.admin)
        self.ends = end_offsets(self.bootstrap, INPUT, INPUT_PARTITIONS, self.admin)
        self.copier_config = self._copier_config()
        self.command_config = tmp_path / "admin.properties"
        self.command_config.write_text("".join(f"{k}={v}\n" for k, v in self.admin.items()))
        self.gate, self.copiers = make_copiers(tmp_path, self.bootstrap, INPUT, OUTPUT, self.ends, GROUP,
                                               TRANSACTION_SIZE, MAX_RATE, ABORT_EVERY, self.copier_config)

    def _copier_config(self) -> dict:
        """The copiers' SDK settings: none without security; with it SASL over TLS as
        User:copier, whom ACLs allow the input, the output, the group and the
        transactional.ids of the copiers (prefix "copier-")."""
        if not self.cluster.security:
            return {}
        ca = CertificateAuthority.load(self.cluster.dir / "certs")
        cert = ca.issue("copier", client=True)
        with AdminClient({"bootstrap.servers": self.bootstrap, **self.admin}) as admin:
            admin.alter_user_scram_credentials({"copier": PASSWORD})
            admin.create_acls([AclBinding("User:copier", "Topic", INPUT, "Read"),
                               AclBinding("User:copier", "Topic", OUTPUT, "Write"),
                               AclBinding("User:copier", "Group", GROUP, "Read"),
                               AclBinding("User:copier", "TransactionalId", "copier-", "Write",
                                          pattern="Prefixed")])
        return {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "copier",
                "sasl.password": PASSWORD, "ssl.ca.location": str(ca.ca_path),
                "ssl.certificate.location": str(cert.certificate), "ssl.key.location": str(cert.key)}

    # ------------------------------------------------------------ operator steps
    def exactly(self, *args: str) -> subprocess.CompletedProcess:
        """The `exactly` command line against this cluster, as its admin."""
        return subprocess.run([str(EXACTLY), *args, "--bootstrap-server", self.bootstrap,
                               "--command-config", str(self.command_config)],
                              capture_output=True, text=True, timeout=120)

    def replace(self, name: str, python: str) -> None:
        """Stop `name` (SIGTERM) and start it with `python`'s version on the same data
        directory, node id and ports; a partition leader until its replicas are in sync."""
        self.cluster.signal(name, signal.SIGTERM)
        self.cluster.restart(name, timeout_s=120, python=python)
        if name.startswith("pl-"):
            wait_in_sync(self.bootstrap, TOPICS, PHASE_TIMEOUT_S, self.admin)

    def old(self) -> list[str]:
        return sorted(n for n, s in self.cluster.services.items() if s.python == self.previous)

    def upgrade_refused(self) -> str:
        """`exactly features upgrade` while processes of the previous release run: refused,
        naming each of them. Returns the message."""
        out = self.exactly("features", "upgrade")
        assert out.returncode == 1, (out.stdout, out.stderr)
        assert "InvalidUpdateVersionError" in out.stderr and all(f"{n} (supports 1)" in out.stderr
                                                                  for n in self.old()), out.stderr
        return out.stderr.strip()

    def raise_level(self) -> str:
        """`exactly features upgrade`: metadata.version 1 -> 3, then until every
        __transaction_state partition records it."""
        out = self.exactly("features", "upgrade")
        assert out.returncode == 0 and "metadata.version is now 3 (was 1)" in out.stdout, (out.stdout, out.stderr)
        described = self.exactly("features", "describe", "--json")
        assert '"metadata.version": 3' in described.stdout, described.stdout
        wait_for(lambda: len(set(re.findall(r"__transaction_state-(\d+) records metadata.version 3",
                                            self.logs("txn-0", "txn-1")))) == TXN_PARTITIONS,
                 PHASE_TIMEOUT_S, "every __transaction_state partition to record metadata.version 3")
        return out.stdout.strip()

    # ------------------------------------------------------------ observations
    def logs(self, *names: str) -> str:
        return "".join((self.cluster.dir / "logs" / f"{n}.log").read_text(errors="replace") for n in names)

    def service_errors(self) -> list[str]:
        return [line for n in self.cluster.services for line in self.logs(n).splitlines()
                if SERVICE_ERROR.search(line)]

    def transactional_ids(self) -> set[str]:
        """ListTransactions' transactional.ids, asked again while a coordinator answers
        a retriable error (it loads a partition)."""
        def listed() -> list[set[str]] | None:
            with AdminClient({"bootstrap.servers": self.bootstrap, **self.admin}) as admin:
                try:
                    return [{t.transactional_id for t in admin.list_transactions()}]
                except errors.ExactlyError as exc:
                    if exc.retriable:
                        return None
                    raise
        return wait_for(listed, PHASE_TIMEOUT_S, "ListTransactions to answer")[0]

    def copy_through(self, steps: list[tuple[str, Callable[[], str | None]]]) -> None:
        """Run the copiers while `steps` (what, step) run one per phase of the input,
        then to the end of the input; logs each step."""
        try:
            for k, fraction in copier_phases(self.gate, self.copiers, len(steps), PHASE_TIMEOUT_S):
                what, step = steps[k]
                time.sleep(0.5)  # the copiers inside a transaction
                t0 = time.monotonic()
                note = step()
                log(f"{what} in {time.monotonic() - t0:.1f} s{f': {note}' if note else ''} "
                    f"(copiers at {', '.join(f'{c.progress:.0%}' for c in self.copiers)})")
                wait_gate(self.copiers, fraction, PHASE_TIMEOUT_S)
            finish_copiers(self.copiers, self.gate, PHASE_TIMEOUT_S)
        finally:
            for c in self.copiers:
                c.stop()

    def check_exactly_once(self) -> dict:
        """The checks of the module docstring; returns the copiers' totals."""
        committed = read_values(self.bootstrap, OUTPUT, OUTPUT_PARTITIONS, "read_committed", config=self.admin)
        uncommitted = read_values(self.bootstrap, OUTPUT, OUTPUT_PARTITIONS, "read_uncommitted", config=self.admin)
        result = Comparison.of(self.expected, committed)
        totals = {c.name: {**c.totals(), "starts": c.starts,
                           "max_commit_gap_s": c.status().get("max_commit_gap_s")} for c in self.copiers}
        ids = self.transactional_ids()
        log(f"output (read_committed): {result.found:,} records of {result.expected:,} expected; duplicates "
            f"{result.duplicates}, missing {result.missing}, unexpected {result.unexpected}; read_uncommitted "
            f"{len(uncommitted):,}; copiers {totals}; ListTransactions {sorted(ids)}")
        assert result.exactly_once, result
        assert all(t["failed_txns"] == 0 and t["starts"] == 1 for t in totals.values()), totals
        assert all(t["max_commit_gap_s"] <= MAX_STALL_S for t in totals.values()), totals
        assert all(t["aborted_txns"] >= 3 for t in totals.values()), totals
        assert len(uncommitted) > len(committed)
        assert ids <= {c.transactional_id for c in self.copiers}, ids
        assert self.service_errors() == []
        return totals


@pytest.fixture
def make_run(zk, tmp_path, previous):
    runs: list[Run] = []

    def factory(security: bool) -> Run:
        run = Run(zk, tmp_path, previous, security)
        runs.append(run)
        log(f"{PREVIOUS} cluster up ({'secured' if security else 'plaintext'}), {RECORDS:,} input records")
        return run
    yield factory
    for run in runs:
        for c in run.copiers:
            c.stop()
        run.cluster.down()


def _replace_step(run: Run, name: str, python: str, first: bool = False) -> Callable[[], str | None]:
    def step() -> str | None:
        run.replace(name, python)
        if first:  # one process replaced, the others still of the previous release
            return f"exactly features upgrade refused: {run.upgrade_refused()}"
        return None
    return step


@pytest.mark.parametrize("order,security", VARIANTS,
                         ids=[f"{o}-{'secured' if s else 'plaintext'}" for o, s in VARIANTS])
def test_rolling_upgrade_keeps_exactly_once(make_run, order, security):
    started = time.monotonic()
    run = make_run(security)
    names = ORDERS[order]
    steps = [(f"{n} replaced by the current code", _replace_step(run, n, CURRENT, first=i == 0))
             for i, n in enumerate(names)]
    steps.append(("metadata.version raised", run.raise_level))
    steps += [(f"{n} restarted at metadata.version 3", _replace_step(run, n, CURRENT)) for n in ("txn-0", "txn-1")]
    run.copy_through(steps)
    run.check_exactly_once()
    log(f"upgrade checked in {time.monotonic() - started:.1f} s")
    if security:
        _previous_coordinator_after_the_raise(run)


def _previous_coordinator_after_the_raise(run: Run) -> None:
    """After the raise, a transaction coordinator of the previous release refuses every
    partition it is given (it cannot refuse to start: it knows no feature levels) and
    makes nothing up; the current code takes over again and serves transactions."""
    t0 = time.monotonic()
    run.cluster.signal("txn-0", signal.SIGTERM)
    run.cluster.restart("txn-0", python=run.previous, wait=False)
    # txn-0 owns the partitions p with p % 2 == 0 of two coordinators (sorted node ids).
    owned = {str(p) for p in range(0, TXN_PARTITIONS, 2)}
    refused = wait_for(lambda: (lambda found: found if set(found) >= owned else None)(re.findall(
        r"__transaction_state-(\d+) is corrupt; disabled: unknown transaction log value version 3",
        run.logs("txn-0"))), PHASE_TIMEOUT_S, "the previous release's coordinator to refuse its partitions")
    ids = run.transactional_ids()
    assert ids <= {c.transactional_id for c in run.copiers}, ids
    log(f"{PREVIOUS} txn-0 after the raise: refused __transaction_state partitions {sorted(set(refused))} "
        f"(unknown transaction log value version 3); ListTransactions {sorted(ids)}")
    run.cluster.kill("txn-0")  # it waits for partitions it will never load before it heeds SIGTERM
    run.cluster.restart("txn-0", timeout_s=120, python=CURRENT)
    producer = Producer({"bootstrap.servers": run.bootstrap, **run.admin, "transactional.id": "after-the-raise"})
    try:
        producer.init_transactions(60)
        producer.begin_transaction()
        producer.send(OUTPUT, b"after the raise")
        producer.commit_transaction(60)
    finally:
        producer.close(30)
    log(f"current txn-0 back, a transaction committed, in {time.monotonic() - t0:.1f} s")


def test_downgrade_before_the_raise_leaves_no_garbage(make_run):
    """Previous -> current -> previous, metadata.version never raised, secured, with the
    copiers running throughout: the same checks as the upgrade."""
    started = time.monotonic()
    run = make_run(True)
    steps = [(f"{n} replaced by the current code", _replace_step(run, n, CURRENT)) for n in ORDERS["leaders-first"]]
    steps += [(f"{n} downgraded to {PREVIOUS}", _replace_step(run, n, run.previous))
              for n in ORDERS["coordinators-first"]]
    run.copy_through(steps)
    assert run.old() == sorted(run.cluster.services)
    run.check_exactly_once()
    log(f"downgrade checked in {time.monotonic() - started:.1f} s")
