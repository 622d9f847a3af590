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

WILDCARD_HOSTS = ("0.0.0.0", "::", "[::]")


@dataclass
class ServiceConfig:
    """Identity and settings of one service process.

    node_id: unique, stable name (e.g. "pl-0"); role: partition_leader |
    txn_coordinator | group_coordinator; host: address the gRPC server binds;
    port 0 binds a free port; zookeeper: "host:port[,host:port]"; props: Kafka-style
    keys -> string values; advertised_host: name other processes connect to ("" =
    `host`; see `advertised`).
    """

    node_id: str
    role: str
    host: str = "127.0.0.1"
    port: int = 0
    zookeeper: str = "127.0.0.1:2181"
    data_dir: pathlib.Path = pathlib.Path(".")
    props: dict[str, str] = field(default_factory=dict)
    advertised_host: str = ""

    @property
    def advertised(self) -> str:
        """The host registered in ZooKeeper: `advertised_host`, else `host`."""
        return self.advertised_host or self.host

    def get_str(self, key: str, default: str) -> str:
        return self.props.get(key, default)

    def get_bool(self, key: str, default: bool) -> bool:
        """Boolean setting ("true"/"false", any case); raises ValueError naming the key
        for anything else."""
        raw = self.props.get(key)
        if raw is None:
            return default
        if raw.strip().lower() in ("true", "false"):
            return raw.strip().lower() == "true"
        raise ValueError(f"setting {key}={raw!r} is not true or false")

    def get_int(self, key: str, default: int) -> int:
        """Integer setting; raises ValueError naming the key when malformed."""
        raw = self.props.get(key)
        if raw is None:
            return default
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"setting {key}={raw!r} is not an integer") from None


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    return key.strip(), value.strip()


def parse_args(role: str, argv: list[str] | None = None) -> ServiceConfig:
    """Parse a service command line into a ServiceConfig (see module docstring)."""
    parser = argparse.ArgumentParser(prog=f"python -m services.{role}",
                                     description=f"Exactly {role.replace('_', ' ')}")
    parser.add_argument("--node-id", required=True, help="stable unique id of this process")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address the gRPC server binds (0.0.0.0: every interface)")
    parser.add_argument("--advertised-host", default="",
                        help="host name or address registered for clients and other services "
                             "(default: --host; required when --host binds every interface)")
    parser.add_argument("--port", type=int, default=0, help="gRPC port (0: pick a free one)")
    parser.add_argument("--zookeeper", required=True, help="ZooKeeper connect string host:port")
    parser.add_argument("--data-dir", required=True, type=pathlib.Path, help="directory for this process's data")
    parser.add_argument("--set", dest="props", action="append", type=_key_value, default=[],
                        metavar="KEY=VALUE", help="Kafka-style setting (repeatable)")
    args = parser.parse_args(argv)
    if args.host in WILDCARD_HOSTS and not args.advertised_host:
        parser.error(f"--host {args.host} binds every interface; give --advertised-host, the name "
                     "clients and other services connect to")
    return ServiceConfig(node_id=args.node_id, role=role, host=args.host, port=args.port,
                         zookeeper=args.zookeeper, data_dir=args.data_dir, props=dict(args.props),
                         advertised_host=args.advertised_host or args.host)
