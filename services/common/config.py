"""Service configuration: identity, addresses and Kafka-style settings.

Every service process is started as `python -m services.<role> --node-id ID
--zookeeper HOST:PORT --data-dir DIR [--host H] [--advertised-host A] [--port P]
[--set key=value ...]`. The gRPC server binds `--host` (0.0.0.0: every interface) and
registers `--advertised-host` (default: `--host`) in ZooKeeper, which is what clients
and other services connect to (Kafka's listeners / advertised.listeners).
Settings use Kafka's configuration key names (e.g. `transaction.max.timeout.ms`).
"""
from __future__ import annotations

import argparse
import pathlib
from dataclasses import dataclass, field
from typing import Any

import jproperties

from exactly_wire import version
from exactly_wire.config import ConfigurationError, parse
from exactly_wire.security import TLS_PROTOCOLS, TransportSecurity

from .settings import SERVICE_SCHEMAS, ServiceSchema, key_of
from .security.zk_security import ZkSecurity
from .security.zk_tls import ZkTls

WILDCARD_HOSTS = ("0.0.0.0", "::", "[::]")


@dataclass
class ServiceConfig:
    """Identity and settings of one service process.

    node_id: unique, stable name (e.g. "pl-0"); role: partition_leader |
    txn_coordinator | group_coordinator; host: address the gRPC server binds;
    port 0 binds a free port; kafka_port: the Kafka protocol listener's port (0: a free
    one, -1: none; docs/design.md, "Kafka protocol"); link_port: the tunnel's link
    listener's port (0: a free one, -1: none; services.common.transport.link); zookeeper: "host:port[,host:port]"; props: Kafka-style
    keys -> string values; advertised_host: name other processes connect to ("" =
    `host`; see `advertised`).
    """

    node_id: str
    role: str
    host: str = "127.0.0.1"
    port: int = 0
    kafka_port: int = 0
    link_port: int = 0
    zookeeper: str = "127.0.0.1:2181"
    data_dir: pathlib.Path = pathlib.Path(".")
    props: dict[str, str] = field(default_factory=dict)
    advertised_host: str = ""
    settings: ServiceSchema = field(init=False, repr=False)

    @property
    def advertised(self) -> str:
        """The host registered in ZooKeeper: `advertised_host`, else `host`."""
        return self.advertised_host or self.host

    def __post_init__(self) -> None:
        """Parse `props` once with the role's schema (services.common.settings):
        `settings` is what the process reads, as attributes. Raises ConfigurationError."""
        self.settings = parse(SERVICE_SCHEMAS.get(self.role, ServiceSchema), self.props)

    def _value(self, key: str, default: Any) -> Any:
        """The validated value of `key` when it was set, else `default` (the get_*
        lookups are for tools and tests; the services read `settings`)."""
        if key not in self.props:
            return default
        value = self.settings.get(key)
        return default if value is None else value

    def get_str(self, key: str, default: str) -> str:
        """String setting `key`, or `default` when unset."""
        return self._value(key, default)

    def get_bool(self, key: str, default: bool) -> bool:
        """Boolean setting `key` (validated true/false), or `default` when unset."""
        return self._value(key, default)

    def get_int(self, key: str, default: int) -> int:
        """Integer setting `key` (validated), or `default` when unset."""
        return self._value(key, default)

    def get_float(self, key: str, default: float) -> float:
        """Number setting `key` (validated), or `default` when unset."""
        return float(self._value(key, default))


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    return key.strip(), value.strip()


def parse_args(role: str, argv: list[str] | None = None) -> ServiceConfig:
    """Parse a service command line into a ServiceConfig (see module docstring)."""
    parser = argparse.ArgumentParser(prog=f"python -m services.{role}",
                                     description=f"Exactly {role.replace('_', ' ')}")
    parser.add_argument("--version", action="version", version=f"Exactly {role} {version()}")
    parser.add_argument("--node-id", required=True, help="stable unique id of this process")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address the gRPC server binds (0.0.0.0: every interface)")
    parser.add_argument("--advertised-host", default="",
                        help="host name or address registered for clients and other services "
                             "(default: --host; required when --host binds every interface)")
    parser.add_argument("--port", type=int, default=0, help="gRPC port (0: pick a free one)")
    parser.add_argument("--kafka-port", type=int, default=0,
                        help="Kafka protocol port (0: pick a free one; -1: no Kafka listener)")
    parser.add_argument("--link-port", type=int, default=0,
                        help="port of the links other services open for their calls to this one, on the "
                             "--host address (0: pick a free one; -1: none, their calls go on the gRPC port)")
    parser.add_argument("--zookeeper", required=True, help="ZooKeeper connect string host:port")
    parser.add_argument("--data-dir", required=True, type=pathlib.Path, help="directory for this process's data")
    parser.add_argument("--config", type=pathlib.Path, metavar="FILE",
                        help="Java properties file of settings (key=value lines); --set overrides it")
    parser.add_argument("--set", dest="props", action="append", type=_key_value, default=[],
                        metavar="KEY=VALUE", help="Kafka-style setting (repeatable)")
    args = parser.parse_args(argv)
    props: dict[str, str] = {}
    if args.config is not None:
        try:
            props.update(read_properties(args.config))
        except OSError as exc:
            parser.error(f"--config {args.config}: {exc.strerror or exc}")
    props.update(dict(args.props))
    if args.host in WILDCARD_HOSTS and not args.advertised_host:
        parser.error(f"--host {args.host} binds every interface; give --advertised-host, the name "
                     "clients and other services connect to")
    try:
        cfg = ServiceConfig(node_id=args.node_id, role=role, host=args.host, port=args.port,
                            kafka_port=args.kafka_port, link_port=args.link_port,
                            zookeeper=args.zookeeper, data_dir=args.data_dir, props=props,
                            advertised_host=args.advertised_host or args.host)
        service_security(cfg)  # cross-key checks and readable certificate files, before starting
        ZkSecurity(cfg.settings)  # zookeeper.set.acl needs both digest credentials
        ZkTls.from_settings(cfg.settings)  # zookeeper.ssl.*: readable certificate, key and CA files
        return cfg
    except ConfigurationError as exc:
        parser.error(str(exc))


def service_security(cfg: ServiceConfig) -> TransportSecurity:
    """The process's TLS material from its settings (security.protocol SSL/SASL_SSL
    needs ssl.ca.location, ssl.certificate.location and ssl.key.location: the
    service's identity for its listeners and for its calls to other services).
    Raises ConfigurationError naming the key."""
    protocol = cfg.settings.security_protocol
    outbound = cfg.settings.model_copy(update={
        "sasl_username": None, "sasl_password": None,
        "security_protocol": "SSL" if protocol in TLS_PROTOCOLS else "PLAINTEXT"})
    security = TransportSecurity.from_settings(outbound, ConfigurationError, role=cfg.role)
    if security.tls and security.certificate is None:
        certificate = key_of(ServiceSchema, "ssl_certificate_location")
        raise ConfigurationError(f"security.protocol={protocol} needs {certificate} and "
                                 f"{key_of(ServiceSchema, 'ssl_key_location')} for the service",
                                 key=certificate, allowed="a PEM file")
    return security


def read_properties(path: pathlib.Path) -> dict[str, str]:
    """Settings from a Java properties file (`key=value` or `key: value` lines, `#`
    and `!` comments, `\\` continuations), parsed by jproperties. Raises OSError."""
    props = jproperties.Properties()
    with open(path, "rb") as f:
        props.load(f, "utf-8")
    return {str(k): str(v.data) for k, v in props.items()}
