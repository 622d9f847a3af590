"""`exactly-dev`: a development cluster of real processes on 127.0.0.1.

    exactly-dev up [--dir DIR] [--partition-leaders 3] [--txn-coordinators 1]
                   [--group-coordinators 1] [--replication-factor 1]
                   [--zookeeper HOST:PORT] [--set key=value ...] [--security] [--postgres] [--json]
    exactly-dev env [--dir DIR]             export EXACTLY_BOOTSTRAP_SERVER=... (for eval)
    exactly-dev restart [--dir DIR] NAME [--python PATH]
                                            start a stopped or killed service again
                                            (with --python: that interpreter's version)
    exactly-dev kill [--dir DIR] NAME [--signal KILL|TERM|STOP|CONT]
    exactly-dev status [--dir DIR]
    exactly-dev down [--dir DIR]

DIR defaults to $EXACTLY_DEV_DIR, else .run/dev (exactly_tools.devfiles), where the
`exactly` command line finds the cluster by itself. `up` starts a ZooKeeper server
(unless --zookeeper) and the services as background processes, saying on stderr what it
starts and when each serves (gRPC health SERVING), and writes DIR/cluster.json:
{"bootstrap_servers", "zookeeper", "services": [{"name", "role", "pid", "address",
"metrics_address", "python"}], "clients": [{"name", "pid"}]} (clients: processes run against the
cluster and registered with DevCluster.track, which `down` stops first; printed with
--json) and DIR/client.properties (bootstrap.servers and, with --security, the admin's TLS
settings: for `exactly --command-config` and the SDK), DIR/kafka-client.properties (the
same for Kafka clients, on the Kafka port) and, with --security, DIR/sasl-client.properties
(SASL_SSL with a client certificate, a user's name and password to add); every service
serves Prometheus /metrics on its own port (`--set metrics.port=P`), at
http://<metrics_address>/metrics. With --postgres a
PostgreSQL server runs too (a private data directory, a free port; as the `postgres`
OS user when run as root), its libpq DSN in cluster.json's "postgres": {"dsn", "port",
"data_dir"}; `down` stops it and deletes its data directory.
A service's "python" (empty: this interpreter) runs it with another installation of
Exactly, e.g. the virtualenv of another release (`restart --python`): a rolling upgrade
or downgrade replaces one service after the other on the same data directory, node id
and ports (docs/operating/upgrades.md).
Service logs go to DIR/logs/NAME.log; data to DIR/NAME/. Nothing under DIR is readable
by other users: the dev cluster creates its directories 0700 and its files 0600, and
ZooKeeper and the services run with umask 077.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from exactly_wire import version
from exactly_wire.config import ConfigurationError
from exactly_wire.security import TransportSecurity, secure_channel
from services.common.settings import settings_by_role

from . import devfiles
from .certs import write_private
from .ports import free_port

Progress = Callable[[str], None]

ROLES = {"pl": "partition_leader", "txn": "txn_coordinator", "group": "group_coordinator"}
ZOOKEEPER_CLASSPATH = ["/usr/share/java/zookeeper.jar", "/usr/share/java/zookeeper-jute.jar",
                       "/usr/share/java/slf4j-api.jar", "/usr/share/java/slf4j-simple.jar",
                       "/usr/share/java/netty-handler.jar", "/usr/share/java/netty-transport.jar",
                       "/usr/share/java/netty-common.jar", "/usr/share/java/netty-buffer.jar",
                       "/usr/share/java/netty-codec.jar", "/usr/share/java/netty-resolver.jar",
                       "/usr/share/java/commons-io.jar", "/usr/share/java/metrics-core.jar"]

# Dev defaults: small internal topics so a cluster starts in seconds.
DEV_DEFAULTS = {
    "transaction.state.log.num.partitions": "4",
    "offsets.topic.num.partitions": "4",
}


PRIVATE_UMASK = 0o077  # ZooKeeper's and the services' files: the owner's only


def _mkdir_private(path: pathlib.Path) -> None:
    """Create directory `path` (and missing parents) mode 0700; an existing one is left as is."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)


def _open_log(path: pathlib.Path):
    """Open log file `path` for appending, created mode 0600."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab")


class DevClusterError(RuntimeError):
    """A service did not start or is unknown."""


def _zookeeper_serving(port: int) -> bool:
    """Whether the ZooKeeper server on 127.0.0.1:`port` serves requests: its `srvr`
    answer names its mode. (`ruok` answers imok while the server still loads its
    data and refuses sessions.)"""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.settimeout(2)
            s.sendall(b"srvr")
            answer = b""
            while chunk := s.recv(4096):
                answer += chunk
    except OSError:
        return False
    return b"Mode:" in answer


def pid_alive(pid: int) -> bool:
    """True when `pid` runs and is not a zombie."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def wait_serving(address: str, timeout_s: float, client_config: dict | None = None) -> bool:
    """Poll grpc.health.v1 until SERVING or the timeout (s) passes; `client_config`:
    SDK security keys for a secured cluster (TLS)."""
    deadline = time.monotonic() + timeout_s
    security = TransportSecurity.from_conf(client_config or {})
    with secure_channel(address, security, []) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while time.monotonic() < deadline:
            try:
                r = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                if r.status == health_pb2.HealthCheckResponse.SERVING:
                    return True
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    return False


@dataclass
class Service:
    name: str
    role: str
    port: int
    pid: int = 0
    metrics_port: int = 0
    kafka_port: int = 0
    # The interpreter the service runs with ("": this one): another installation's,
    # e.g. `.run/releases/<commit>/venv/bin/python`, runs that version.
    python: str = ""

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def kafka_address(self) -> str:
        """host:port of the service's Kafka protocol listener ("" when it has none)."""
        return f"127.0.0.1:{self.kafka_port}" if self.kafka_port else ""

    @property
    def metrics_address(self) -> str:
        """host:port of the service's /metrics endpoint ("" when it has none)."""
        return f"127.0.0.1:{self.metrics_port}" if self.metrics_port else ""


@dataclass
class DevCluster:
    """A cluster rooted at `dir`; usable from Python (tests) and from the CLI."""

    dir: pathlib.Path
    zookeeper: str = ""
    zookeeper_pid: int = 0
    services: dict[str, Service] = field(default_factory=dict)
    props: dict[str, str] = field(default_factory=dict)
    # Secured (`up --security`): TLS on every listener with mutual authentication;
    # `client_config` holds the admin's SDK security keys (certificates under DIR/certs).
    security: bool = False
    client_config: dict[str, str] = field(default_factory=dict)
    # `up --postgres`: a private PostgreSQL server ({"dsn", "port", "data_dir"}), for
    # exactly.postgres (exactly_tools.pgserver); stopped and deleted by down().
    postgres: dict[str, Any] = field(default_factory=dict)
    # Client processes run against the cluster (a demo's pipeline workers), name -> pid,
    # registered by track(); down() stops them first.
    clients: dict[str, int] = field(default_factory=dict)
    # Extra environment variables of a service's process, by service name (not saved;
    # the clock-fault tests preload libfaketime this way, tests/clockfault.py).
    service_env: dict[str, dict[str, str]] = field(default_factory=dict, repr=False)
    # RLIMIT_NOFILE (soft and hard) a service's process starts with, by service name (not
    # saved; the descriptor-budget test starts a leader with a small one).
    service_nofile: dict[str, int] = field(default_factory=dict, repr=False)
    _procs: dict[str, subprocess.Popen] = field(default_factory=dict, repr=False)

    # ------------------------------------------------------------ persistence
    @property
    def state_file(self) -> pathlib.Path:
        return self.dir / "cluster.json"

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(s.address for s in self.services.values() if s.role == "partition_leader")

    @property
    def kafka_bootstrap_servers(self) -> str:
        """The partition leaders' Kafka protocol listeners, for Kafka clients."""
        return ",".join(s.kafka_address for s in self.services.values()
                        if s.role == "partition_leader" and s.kafka_port)

    def save(self) -> None:
        body = {
            "bootstrap_servers": self.bootstrap_servers,
            "kafka_bootstrap_servers": self.kafka_bootstrap_servers,
            "security": self.security,
            "client_config": {"bootstrap.servers": self.bootstrap_servers, **self.client_config},
            "zookeeper": self.zookeeper,
            "zookeeper_pid": self.zookeeper_pid,
            "props": self.props,
            **({"postgres": self.postgres} if self.postgres else {}),
            "clients": [{"name": name, "pid": pid} for name, pid in self.clients.items()],
            "services": [{"name": s.name, "role": s.role, "pid": s.pid, "address": s.address,
                          "metrics_address": s.metrics_address, "kafka_address": s.kafka_address,
                          **({"python": s.python} if s.python else {})}
                         for s in self.services.values()],
        }
        write_private(self.state_file, json.dumps(body, indent=2).encode())

    @classmethod
    def load(cls, dir: str | os.PathLike) -> "DevCluster":
        d = pathlib.Path(dir)
        path = d / "cluster.json"
        if not path.exists():
            raise DevClusterError(f"no cluster at {d} (missing cluster.json): start one with 'exactly-dev up' "
                                  f"(--dir DIR, or ${devfiles.DEV_DIR_ENV}, for another directory)")
        body = json.loads(path.read_text())
        services = {}
        for s in body["services"]:
            metrics = s.get("metrics_address") or ":0"
            kafka = s.get("kafka_address") or ":0"
            services[s["name"]] = Service(s["name"], s["role"], int(s["address"].rsplit(":", 1)[1]), s["pid"],
                                          int(metrics.rsplit(":", 1)[1]), int(kafka.rsplit(":", 1)[1]),
                                          s.get("python", ""))
        client_config = {k: v for k, v in body.get("client_config", {}).items() if k != "bootstrap.servers"}
        return cls(d, body["zookeeper"], body.get("zookeeper_pid", 0), services, body.get("props", {}),
                   bool(body.get("security", False)), client_config, body.get("postgres", {}),
                   {c["name"]: c["pid"] for c in body.get("clients", ())})

    # ------------------------------------------------------------ PostgreSQL
    @property
    def postgres_server(self):
        """The cluster's PostgreSQL server (exactly_tools.pgserver.PostgresServer), or
        None without `up --postgres` / start_postgres()."""
        if not self.postgres:
            return None
        from .pgserver import PostgresServer
        return PostgresServer(self.postgres["data_dir"], self.postgres["port"],
                              log_path=self.dir / "logs" / "postgres.log")

    @property
    def postgres_dsn(self) -> str:
        """The libpq connection string of the cluster's PostgreSQL ("" without one)."""
        return self.postgres.get("dsn", "")

    def start_postgres(self, timeout_s: float = 60.0) -> None:
        """Start a PostgreSQL server with a private data directory on a free port
        (exactly_tools.pgserver) and record it in cluster.json ("postgres": dsn, port,
        data_dir). Raises pgserver.PostgresServerError."""
        from .pgserver import PostgresServer, private_data_dir
        _mkdir_private(self.dir / "logs")
        server = PostgresServer(private_data_dir(), log_path=self.dir / "logs" / "postgres.log")
        self.postgres = {"data_dir": str(server.data_dir)}
        try:
            server.start(timeout_s)
        finally:
            if server.port is not None:
                self.postgres = {"dsn": server.dsn, "port": server.port, "data_dir": str(server.data_dir)}
            self.save()

    # ------------------------------------------------------------ ZooKeeper
    def start_zookeeper(self, timeout_s: float = 30.0, port: int | None = None) -> None:
        """Start the standalone ZooKeeper server on `port` (default: a free one) with
        its data in `<dir>/zookeeper/data` (kept across restarts); returns once it
        answers `ruok`. Raises DevClusterError."""
        zk_dir = self.dir / "zookeeper"
        _mkdir_private(zk_dir)
        port = free_port() if port is None else port
        cfg = zk_dir / "zoo.cfg"
        write_private(cfg, (f"tickTime=500\ninitLimit=10\nsyncLimit=5\ndataDir={zk_dir / 'data'}\n"
                            f"clientPort={port}\nclientPortAddress=127.0.0.1\nmaxSessionTimeout=60000\n"
                            "admin.enableServer=false\n4lw.commands.whitelist=ruok,srvr\n").encode())
        classpath = ":".join(p for p in ZOOKEEPER_CLASSPATH if os.path.exists(p))
        log = _open_log(self.dir / "logs" / "zookeeper.log")
        # umask 077: ZooKeeper's snapshots and transaction logs (znode data, the digest
        # ACLs, SCRAM credentials) readable by the owner only.
        proc = subprocess.Popen(["java", "-Xmx256m", "-Dzookeeper.admin.enableServer=false", "-cp", classpath,
                                 "org.apache.zookeeper.server.quorum.QuorumPeerMain", str(cfg)],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, umask=PRIVATE_UMASK)
        self._procs["zookeeper"] = proc
        self.zookeeper_pid = proc.pid
        self.zookeeper = f"127.0.0.1:{port}"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise DevClusterError(f"ZooKeeper exited with {proc.returncode}; see {log.name}")
            if _zookeeper_serving(port):
                return
            time.sleep(0.1)
        raise DevClusterError("ZooKeeper did not start in time")

    def kill_zookeeper(self) -> None:
        """SIGKILL our ZooKeeper server (a crash: nothing flushed, sessions not closed)."""
        if not self.zookeeper_pid:
            raise DevClusterError("this cluster uses a ZooKeeper it did not start")
        if pid_alive(self.zookeeper_pid):
            os.kill(self.zookeeper_pid, signal.SIGKILL)
            self._reap("zookeeper", self.zookeeper_pid, 10.0)

    def restart_zookeeper(self, timeout_s: float = 30.0) -> None:
        """Start our killed ZooKeeper server again on its port with its data directory
        (znodes and sessions as its transaction log has them). Raises DevClusterError."""
        if not self.zookeeper_pid:
            raise DevClusterError("this cluster uses a ZooKeeper it did not start")
        if pid_alive(self.zookeeper_pid):
            raise DevClusterError(f"ZooKeeper is still running (pid {self.zookeeper_pid})")
        self.start_zookeeper(timeout_s, port=int(self.zookeeper.rsplit(":", 1)[1]))
        self.save()

    # ------------------------------------------------------------ services
    def _spawn(self, svc: Service) -> None:
        data_dir = self.dir.resolve() / svc.name
        _mkdir_private(data_dir)
        cmd = [svc.python or sys.executable, "-m", f"services.{svc.role}", "--node-id", svc.name,
               "--host", "127.0.0.1", "--port", str(svc.port), "--kafka-port", str(svc.kafka_port or -1), "--zookeeper", self.zookeeper,
               "--data-dir", str(data_dir)]
        for k, v in _role_settings(svc.python, self.props)[svc.role].items():
            cmd += ["--set", f"{k}={v}"]
        if self.security:
            certs = self.dir / "certs"
            cmd += ["--config", str(self.zookeeper_properties),
                    "--set", f"ssl.certificate.location={certs / (svc.name + '.pem')}",
                    "--set", f"ssl.key.location={certs / (svc.name + '.key')}"]
        if svc.metrics_port:
            cmd += ["--set", f"metrics.port={svc.metrics_port}"]
        log = _open_log(self.dir / "logs" / f"{svc.name}.log")
        # The service sets umask 077 itself (services.common.transport.server.main_for).
        extra = self.service_env.get(svc.name)
        if svc.name in self.service_nofile:  # util-linux's prlimit execs the service: the pid stays
            n = self.service_nofile[svc.name]
            cmd = ["prlimit", f"--nofile={n}:{n}", "--", *cmd]
        # Another interpreter runs in its data directory: `python -m` puts the working
        # directory first on sys.path, and this one's may hold another version's packages.
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env={**os.environ, **extra} if extra else None,
                                cwd=data_dir if svc.python else None)
        self._procs[svc.name] = proc
        svc.pid = proc.pid

    def _await(self, names: list[str], timeout_s: float, progress: Progress | None = None) -> None:
        started = time.monotonic()
        for name in names:
            svc = self.services[name]
            deadline = time.monotonic() + timeout_s
            while not wait_serving(svc.address, 0.5, self.client_config):
                if not pid_alive(svc.pid):
                    raise DevClusterError(f"{name} exited during start-up; see {self.dir / 'logs' / (name + '.log')}")
                if time.monotonic() > deadline:
                    raise DevClusterError(f"{name} did not serve within {timeout_s:.0f} s")
            if progress is not None:
                progress(f"  {name} serving on {svc.address} (Kafka port {svc.kafka_port}) after "
                         f"{time.monotonic() - started:.1f} s")

    def up(self, partition_leaders: int = 3, txn_coordinators: int = 1, group_coordinators: int = 1,
           zookeeper: str | None = None, timeout_s: float = 60.0, postgres: bool = False,
           progress: Progress | None = None, python: str = "") -> None:
        """Start ZooKeeper (unless given) and the services; wait until all serve.
        postgres: also a PostgreSQL server (start_postgres()). `progress(line)` is told
        each step as it starts and ends (`exactly-dev up` prints them on stderr);
        python: the interpreter of every service (Service.python; "": this one).
        Writes cluster.json and the client property files (`write_client_properties`).
        Raises ConfigurationError for a wrong setting before anything starts."""
        say = progress or (lambda line: None)
        settings_by_role({**DEV_DEFAULTS, **self.props})
        _mkdir_private(self.dir)
        _mkdir_private(self.dir / "logs")
        if zookeeper:
            self.zookeeper = zookeeper
        else:
            started = time.monotonic()
            say("Starting ZooKeeper ...")
            self.start_zookeeper()
            say(f"  ZooKeeper serving on {self.zookeeper} after {time.monotonic() - started:.1f} s")
        self.props = {**DEV_DEFAULTS, **self.props}
        if postgres:
            say("Starting PostgreSQL ...")
            self.start_postgres(timeout_s)
            say(f"  PostgreSQL serving: {self.postgres_dsn}")
        if self.security:
            say(f"Making a CA and certificates in {self.dir / 'certs'} ...")
            self._make_certificates(partition_leaders, txn_coordinators, group_coordinators)
        groups = [("pl", partition_leaders, "partition leader"), ("txn", txn_coordinators, "transaction coordinator"),
                  ("group", group_coordinators, "group coordinator")]
        for prefix, count, what in groups:
            if not count:
                continue
            names = []
            for i in range(count):
                svc = Service(f"{prefix}-{i}", ROLES[prefix], free_port(), metrics_port=free_port(),
                              kafka_port=free_port(), python=python)
                self.services[svc.name] = svc
                self._spawn(svc)
                names.append(svc.name)
            self.save()
            say(f"Starting {count} {what}{'s' if count > 1 else ''} ({', '.join(names)}) ...")
            self._await(names, timeout_s, progress)
        self.save()
        self.write_client_properties()

    # ------------------------------------------------------------ client settings
    @property
    def client_properties(self) -> pathlib.Path:
        """DIR/client.properties: bootstrap.servers and the admin's security settings,
        for `exactly --command-config` and the SDK (devfiles.CLIENT_PROPERTIES)."""
        return self.dir / devfiles.CLIENT_PROPERTIES

    def write_client_properties(self) -> None:
        """Write the client property files of the cluster (mode 0600): client.properties
        (the SDK and `exactly`: the gRPC ports; with security, TLS with the CA and the
        admin's certificate, User:admin), kafka-client.properties (the same keys for
        Kafka clients, on the Kafka ports) and, with security, sasl-client.properties
        (SASL_SSL with SCRAM-SHA-512: the CA and a client certificate, which the gRPC
        port requires of every connection; sasl.username and sasl.password to add)."""
        secured = "secured dev cluster: TLS with client certificates (ssl.client.auth=required), ACLs"
        files = {devfiles.CLIENT_PROPERTIES: ("the SDK and `exactly --command-config` (gRPC ports)"
                                              + ("; User:admin, a super user" if self.security else ""),
                                              {"bootstrap.servers": self.bootstrap_servers, **self.client_config}),
                 devfiles.KAFKA_CLIENT_PROPERTIES: ("Kafka clients (librdkafka, kcat -F, the Java client): the "
                                                    "Kafka ports" + ("; User:admin" if self.security else ""),
                                                    {"bootstrap.servers": self.kafka_bootstrap_servers,
                                                     **self.client_config})}
        if self.security:
            certs = (self.dir / "certs").resolve()
            files["sasl-client.properties"] = (
                "the SDK as a SASL user (gRPC ports): add sasl.username and sasl.password of a user made with "
                "`exactly users add NAME`; the gRPC port also requires a certificate of the cluster's CA "
                "(sasl-client.pem, no ACLs of its own: the principal is the SASL user)",
                {"bootstrap.servers": self.bootstrap_servers, "security.protocol": "SASL_SSL",
                 "sasl.mechanism": "SCRAM-SHA-512", "ssl.ca.location": str(certs / "ca.pem"),
                 "ssl.certificate.location": str(certs / "sasl-client.pem"),
                 "ssl.key.location": str(certs / "sasl-client.key")})
        for name, (comment, props) in files.items():
            header = f"# Written by exactly-dev up for {comment}.\n" + (f"# A {secured}.\n" if self.security else "")
            write_private(self.dir / name, (header + "".join(f"{k}={v}\n" for k, v in props.items())).encode())

    def _make_certificates(self, *counts: int) -> None:
        """A CA, a certificate per service (its node id as common name, valid for
        127.0.0.1 and localhost) and one for the admin principal; TLS on every
        listener with client certificates required (the services' principals come
        from theirs), the ACL authorizer on, the services and User:admin super
        users."""
        from .certs import CertificateAuthority
        # Absolute paths: the settings files are read from any directory.
        ca = CertificateAuthority.create((self.dir / "certs").resolve())
        for prefix, count in zip(("pl", "txn", "group"), counts):
            for i in range(count):
                ca.issue(f"{prefix}-{i}", hosts=["127.0.0.1", "localhost"])
        admin = ca.issue("admin", client=True)
        ca.issue("sasl-client", client=True)  # the certificate of sasl-client.properties
        services = [f"User:{p}-{i}" for p, n in zip(("pl", "txn", "group"), counts) for i in range(n)]
        self.props = {"authorizer": "acl", "super.users": ";".join(["User:admin", *services]),
                      **self.props, "security.protocol": "SSL", "ssl.ca.location": str(ca.ca_path),
                      "ssl.client.auth": "required"}
        # The services' ZooKeeper identity: znodes are created with ACLs that let only it
        # change anything (the password in a file only the owner reads, not on command lines).
        props = self.zookeeper_properties
        if not props.exists():
            write_private(props, ("zookeeper.set.acl=true\nzookeeper.digest.username=exactly\n"
                                  f"zookeeper.digest.password={secrets.token_urlsafe(24)}\n").encode())
        self.client_config = {"security.protocol": "SSL", "ssl.ca.location": str(ca.ca_path),
                              "ssl.certificate.location": str(admin.certificate),
                              "ssl.key.location": str(admin.key)}

    @property
    def zookeeper_properties(self) -> pathlib.Path:
        """Secured clusters: the services' ZooKeeper digest credentials (mode 0600)."""
        return self.dir / "certs" / "zookeeper.properties"

    def _get(self, name: str) -> Service:
        try:
            return self.services[name]
        except KeyError:
            raise DevClusterError(f"unknown service {name!r}; known: {', '.join(self.services)}") from None

    def signal(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to a service (SIGKILL, SIGTERM, SIGSTOP, SIGCONT)."""
        svc = self._get(name)
        if pid_alive(svc.pid):
            os.kill(svc.pid, sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            self._reap(name, svc.pid, 30.0)

    def _reap(self, name: str, pid: int, timeout_s: float) -> None:
        proc = self._procs.get(name)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc is not None and proc.pid == pid:
                try:
                    proc.wait(timeout=0.05)
                    return
                except subprocess.TimeoutExpired:
                    continue
            if not pid_alive(pid):
                return
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)

    def kill(self, name: str) -> None:
        self.signal(name, signal.SIGKILL)

    def stop(self, name: str) -> None:
        self.signal(name, signal.SIGTERM)

    def restart(self, name: str, timeout_s: float = 60.0, python: str | None = None, wait: bool = True) -> None:
        """Start a stopped or killed service again with its data and port; returns once
        it serves (`wait`; else at once). `python`: the interpreter to run it with from
        now on (another installation's, to replace its version; "": this
        interpreter's; None: as before). Raises DevClusterError if it is still
        running, or did not serve."""
        svc = self._get(name)
        if pid_alive(svc.pid):
            raise DevClusterError(f"{name} is still running (pid {svc.pid})")
        if python is not None:
            svc.python = python
        self._spawn(svc)
        self.save()
        if wait:
            self._await([name], timeout_s)

    def track(self, name: str, pid: int) -> None:
        """Record a client process run against this cluster (cluster.json "clients",
        name -> pid; a later one of the same name replaces it), so that down() stops it
        too, from this process or from `exactly-dev down`."""
        self.clients[name] = pid
        self.save()

    def down(self) -> None:
        """Stop the tracked clients (SIGTERM, then SIGKILL after 5 s), every service
        (SIGTERM, then SIGKILL after 20 s) and our ZooKeeper."""
        for pid in self.clients.values():
            if pid_alive(pid):
                with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
                    os.kill(pid, signal.SIGTERM)
        for name, pid in self.clients.items():
            self._reap(name, pid, 5.0)
        order = sorted(self.services.values(), key=lambda s: s.role == "partition_leader")
        for svc in order:
            if pid_alive(svc.pid):
                os.kill(svc.pid, signal.SIGTERM)
        for svc in order:
            self._reap(svc.name, svc.pid, 20.0)
        if self.zookeeper_pid and pid_alive(self.zookeeper_pid):
            os.kill(self.zookeeper_pid, signal.SIGTERM)
            self._reap("zookeeper", self.zookeeper_pid, 10.0)
        server = self.postgres_server
        if server is not None:
            server.remove()


_SPLITS: dict[tuple[str, tuple], dict[str, dict[str, str]]] = {}


def _role_settings(python: str, props: dict[str, str]) -> dict[str, dict[str, str]]:
    """The cluster-wide `props` split into each role's own, as the version that
    `python` runs splits them ("": this one): a key two roles share in one version may
    belong to one role only in another (an older transaction coordinator hosts no
    replicas, so it refuses min.insync.replicas). Another version's split is asked of
    its interpreter once per settings. Raises DevClusterError when it refuses them."""
    if not python or python == sys.executable:
        return settings_by_role(props)
    key = (python, tuple(sorted(props.items())))
    if key not in _SPLITS:
        code = ("import json, sys\nfrom services.common.settings import settings_by_role\n"
                "print(json.dumps(settings_by_role(json.loads(sys.stdin.read()))))")
        try:
            out = subprocess.run([python, "-c", code], input=json.dumps(props), capture_output=True, text=True,
                                 cwd="/", timeout=120, check=True)
        except (OSError, subprocess.SubprocessError) as exc:
            detail = getattr(exc, "stderr", "") or ""
            raise DevClusterError(f"{python} does not take these settings: {exc} {detail[-500:]}") from exc
        _SPLITS[key] = json.loads(out.stdout)
    return _SPLITS[key]


def replication_props(replication_factor: int) -> dict[str, str]:
    """Settings for internal topics replicated `replication_factor` times:
    transaction.state.log.replication.factor, offsets.topic.replication.factor and
    the process-wide min.insync.replicas 2 (capped per topic at its replication
    factor; topics may set their own). Empty for 1."""
    if replication_factor <= 1:
        return {}
    return {"transaction.state.log.replication.factor": str(replication_factor),
            "offsets.topic.replication.factor": str(replication_factor),
            "min.insync.replicas": str(min(2, replication_factor))}


def _parse_props(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep:
            raise SystemExit(f"exactly-dev: --set expects key=value, got {item!r}")
        out[k] = v
    return out


EXAMPLES = {
    "up": "exactly-dev up                       # 3 partition leaders, 1 + 1 coordinators in .run/dev\n"
          "  exactly-dev up --security --dir .run/secure\n"
          "  exactly-dev up --set auto.create.topics.enable=false --postgres",
    "env": 'eval "$(exactly-dev env)"            # sets EXACTLY_BOOTSTRAP_SERVER for the SDK examples',
    "status": "exactly-dev status",
    "kill": "exactly-dev kill txn-0 --signal KILL",
    "restart": "exactly-dev restart txn-0",
    "down": "exactly-dev down",
}


def summary(cluster: DevCluster) -> str:
    """What `exactly-dev up` prints once the cluster serves: where it is, how to reach it."""
    roles = [s.role for s in cluster.services.values()]

    def count(role: str, what: str) -> str:
        n = roles.count(role)
        return f"{n} {what}{'' if n == 1 else 's'}"

    lines = [f"Dev cluster serving in {cluster.dir}: {count('partition_leader', 'partition leader')}, "
             f"{count('txn_coordinator', 'transaction coordinator')}, "
             f"{count('group_coordinator', 'group coordinator')}.",
             f"  SDK and `exactly` (gRPC):  {cluster.bootstrap_servers}",
             f"  Kafka clients:             {cluster.kafka_bootstrap_servers}",
             f"  client settings:           {cluster.client_properties} (and kafka-client.properties"
             + (", sasl-client.properties)" if cluster.security else ")")]
    if cluster.postgres_dsn:
        lines.append(f"  PostgreSQL:                {cluster.postgres_dsn}")
    if cluster.security:
        lines.append(f"  secured: use --command-config {cluster.client_properties} (User:admin)")
    lines.append(f"  logs:                      {cluster.dir / 'logs'}")
    if cluster.dir.resolve() == devfiles.default_dir().resolve():
        lines.append("The `exactly` command finds this cluster by itself; for the SDK examples:")
    else:
        lines.append(f"`exactly` finds it with {devfiles.DEV_DIR_ENV}={cluster.dir}; for the SDK examples:")
    lines.append(f"  export {devfiles.BOOTSTRAP_ENV}={cluster.bootstrap_servers}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="exactly-dev", description="Run an Exactly development cluster.",
                                     epilog="Examples:\n  exactly-dev up\n  exactly-dev status\n  exactly-dev down",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"exactly-dev, version {version()}")
    sub = parser.add_subparsers(dest="cmd", required=True)

    def command(name: str, helptext: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=helptext, description=helptext, epilog="Example:\n  " + EXAMPLES[name],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--dir", type=pathlib.Path, default=devfiles.default_dir(),
                       help=f"the cluster's directory (default ${devfiles.DEV_DIR_ENV}, else "
                            f"{devfiles.DEFAULT_DEV_DIR}; now {devfiles.default_dir()})")
        return p

    up = command("up", "start ZooKeeper and the services")
    up.add_argument("--partition-leaders", type=int, default=3)
    up.add_argument("--txn-coordinators", type=int, default=1)
    up.add_argument("--group-coordinators", type=int, default=1)
    up.add_argument("--replication-factor", type=int, default=1,
                    help="replication factor of the internal topics (user topics choose their own); "
                         "above 1 also min.insync.replicas=2")
    up.add_argument("--zookeeper", help="use this ZooKeeper (HOST:PORT) instead of starting one")
    up.add_argument("--set", dest="props", action="append", default=[], metavar="KEY=VALUE")
    up.add_argument("--fresh", action="store_true", help="delete DIR first")
    up.add_argument("--security", action="store_true",
                    help="TLS with client certificates on every listener (a CA and certificates under DIR/certs); "
                         "DIR/client.properties holds the admin's settings for exactly --command-config and the SDK")
    up.add_argument("--postgres", action="store_true",
                    help="also a PostgreSQL server (private data directory, free port) for exactly.postgres; "
                         "its DSN is cluster.json's postgres.dsn")
    up.add_argument("--json", action="store_true",
                    help="print cluster.json on stdout when the cluster serves (progress stays on stderr)")
    command("env", "print `export EXACTLY_BOOTSTRAP_SERVER=...` for the cluster (eval \"$(exactly-dev env)\")")
    for name, helptext in (("restart", "start a stopped or killed service again"),
                           ("kill", "send a signal to a service")):
        p = command(name, helptext)
        p.add_argument("name")
        if name == "kill":
            p.add_argument("--signal", default="KILL", choices=["KILL", "TERM", "STOP", "CONT"])
        else:
            p.add_argument("--python", help="run the service with this interpreter from now on (the virtualenv "
                                             "of another version of Exactly; '' for exactly-dev's own)")
    command("down", "stop everything")
    command("status", "show the services")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "up":
            if args.fresh and args.dir.exists():
                shutil.rmtree(args.dir)
            if (args.dir / "cluster.json").exists():
                old = DevCluster.load(args.dir)
                if any(pid_alive(s.pid) for s in old.services.values()):
                    raise DevClusterError(f"a cluster is already running in {args.dir}; "
                                          "run 'exactly-dev down' first")
            props = {**replication_props(args.replication_factor), **_parse_props(args.props)}
            cluster = DevCluster(args.dir, props=props, security=args.security)
            started = time.monotonic()
            cluster.up(args.partition_leaders, args.txn_coordinators, args.group_coordinators, args.zookeeper,
                       postgres=args.postgres, progress=lambda line: print(line, file=sys.stderr, flush=True))
            print(f"Up in {time.monotonic() - started:.1f} s.", file=sys.stderr)
            if args.json:
                print(json.dumps(json.loads(cluster.state_file.read_text()), indent=2))
            else:
                print(summary(cluster))
        else:
            cluster = DevCluster.load(args.dir)
            if args.cmd == "env":
                print(f"export {devfiles.BOOTSTRAP_ENV}={cluster.bootstrap_servers}")
            elif args.cmd == "restart":
                cluster.restart(args.name, python=args.python)
                print(f"{args.name} serving, pid {cluster.services[args.name].pid}")
            elif args.cmd == "kill":
                cluster.signal(args.name, signal.Signals["SIG" + args.signal])
            elif args.cmd == "down":
                cluster.down()
                print(f"Dev cluster in {args.dir} stopped.", file=sys.stderr)
            elif args.cmd == "status":
                for s in cluster.services.values():
                    state = "running" if pid_alive(s.pid) else "stopped"
                    print(f"{s.name:10} {s.role:18} {s.address:22} pid {s.pid:<8} {state}")
    except (DevClusterError, ConfigurationError) as exc:
        print(f"exactly-dev: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
