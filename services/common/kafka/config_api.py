"""Kafka's config admin APIs on every Kafka port: DescribeConfigs (32, v1-4),
AlterConfigs (33, v0-2) and IncrementalAlterConfigs (44, v0-1) — KIP-133 (describe
and alter configs), KIP-226 (synonyms), KIP-339 (incremental alter) and KIP-569
(documentation, config types); docs/design.md, "Administration".

Adapters over the topic-config domain code (services.common.cluster.topic_admin, the
topic-config schema services.common.topic_config, ClusterState.alter_topic_configs), so a
change made here is the change `exactly topics alter-config` and Cluster/
IncrementalAlterConfigs make: a compare-and-set of the topic's znode that the
partition leaders apply when their watch fires.

Resources:
- TOPIC (2): every topic config with its value and source: DYNAMIC_TOPIC_CONFIG (set
  on the topic), STATIC_BROKER_CONFIG (the answering process's `--set` of the
  broker-level synonym, e.g. log.retention.ms for retention.ms) or DEFAULT_CONFIG;
  read_only false, is_sensitive false. Alter changes it for real (validate_only:
  checked, not written). Unknown keys and bad values: INVALID_CONFIG, nothing of that
  topic changed; unknown topic: UNKNOWN_TOPIC_OR_PARTITION.
- BROKER (4): the answering process's settings (services.common.settings; its broker
  id, or "" for the cluster-wide defaults, which are the built-in defaults): source
  STATIC_BROKER_CONFIG (set at start) or DEFAULT_CONFIG, read_only true, secrets
  (passwords) is_sensitive with a null value. Settings change only at a restart, so
  altering a known key answers INVALID_REQUEST saying so; an unknown key
  INVALID_CONFIG; another broker's id INVALID_REQUEST (clients send BROKER resources
  to the broker they name).
- other resource types (BROKER_LOGGER, ...): INVALID_REQUEST.

Authorization as Kafka's: DescribeConfigs on the topic (TOPIC_AUTHORIZATION_FAILED)
or the Cluster (CLUSTER_AUTHORIZATION_FAILED) to describe, AlterConfigs to alter
(which implies DescribeConfigs), decided per resource.
"""
from __future__ import annotations

import asyncio
import typing
from typing import Any, Callable, Iterable, Mapping

from exactly_wire.config import ConfigSchema
from exactly_wire.error_codes import ErrorCode

from ..security import authz
from ..cluster import topic_admin
from .. import topic_config
from ..security.acl import CLUSTER_NAME, Operation as Op, Resource, ResourceType
from .codec import field
from .listener import Handler, RequestContext

DESCRIBE_CONFIGS, ALTER_CONFIGS, INCREMENTAL_ALTER_CONFIGS = 32, 33, 44

# Kafka's ConfigResource.Type ids.
TOPIC, BROKER = 2, 4
# Kafka's DescribeConfigsResponse.ConfigSource ids.
DYNAMIC_TOPIC_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 1, 4, 5
# Kafka's ConfigEntry.ConfigType ids (DescribeConfigs v3+).
BOOLEAN, STRING, INT, LONG, DOUBLE, LIST, PASSWORD = 1, 2, 3, 5, 6, 7, 9

# The topic-config schema's Kafka types -> ConfigEntry.ConfigType ids.
_TOPIC_CONFIG_TYPES = {topic_config.INT: INT, topic_config.LONG: LONG, topic_config.LIST: LIST}


def _is_sensitive(key: str) -> bool:
    return "password" in key or "secret" in key or key.endswith(".jaas.config")


def _show(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _setting_type(annotation: Any, key: str) -> int:
    if _is_sensitive(key):
        return PASSWORD
    kinds = {a for a in (annotation, *typing.get_args(annotation)) if isinstance(a, type)}  # Optional, Annotated
    for py, kafka in ((bool, BOOLEAN), (int, LONG), (float, DOUBLE)):
        if py in kinds:
            return kafka
    return STRING


def topic_config_entries(configs: Mapping[str, str], props: Mapping[str, str], keys: Iterable[str] | None,
                         synonyms: bool, documentation: bool) -> list[dict]:
    """DescribeConfigs `configs` of a topic whose znode holds `configs`, described by a
    process started with settings `props` (Kafka key -> value): every topic config (or
    only `keys`, unknown ones left out, as Kafka does), each with its value and source
    (DYNAMIC_TOPIC_CONFIG, STATIC_BROKER_CONFIG via the broker-level synonym, or
    DEFAULT_CONFIG), read_only false, is_sensitive false, its synonyms in precedence
    order when `synonyms`, its config type and, when `documentation`, its doc."""
    aliases = topic_config.BROKER_SYNONYMS
    out = []
    for entry in topic_admin.describe_topic_configs(configs, list(keys or ())):
        chain = []
        if entry.source == topic_admin.SOURCE_TOPIC:
            chain.append({"name": entry.name, "value": entry.value, "source": DYNAMIC_TOPIC_CONFIG})
        for name in (entry.name, aliases.get(entry.name)):
            if name and name in props:
                chain.append({"name": name, "value": str(props[name]), "source": STATIC_BROKER_CONFIG})
        default = topic_admin.describe_topic_configs({}, [entry.name])
        if default:
            chain.append({"name": aliases.get(entry.name, entry.name), "value": default[0].value,
                          "source": DEFAULT_CONFIG})
        first = chain[0] if chain else {"value": entry.value, "source": DEFAULT_CONFIG}
        spec = topic_config.BY_KEY.get(entry.name)
        kind = _TOPIC_CONFIG_TYPES[spec.kind] if spec is not None else LONG
        out.append({"name": entry.name, "value": first["value"], "read_only": False,
                    "config_source": first["source"], "is_sensitive": False,
                    "synonyms": chain if synonyms else [], "config_type": kind,
                    "documentation": entry.documentation if documentation else None})
    return out


def broker_config_entries(settings: ConfigSchema | None, props: Mapping[str, str], keys: Iterable[str] | None,
                          synonyms: bool, documentation: bool) -> list[dict]:
    """DescribeConfigs `configs` of a BROKER resource: every setting of the process's
    schema (or only `keys`), value as set (`props`, STATIC_BROKER_CONFIG) or the
    default (DEFAULT_CONFIG), read_only true (settings change at a restart only),
    sensitive ones (passwords) with a null value."""
    if settings is None:
        return []
    schema = type(settings)
    fields = {info.alias: info for info in schema.model_fields.values()}
    wanted = [k for k in keys if k in fields] if keys else list(fields)
    out = []
    for key in wanted:
        info = fields[key]
        sensitive = _is_sensitive(key)
        source = STATIC_BROKER_CONFIG if key in props else DEFAULT_CONFIG
        value = None if sensitive else _show(settings.get(key))
        chain = [{"name": key, "value": value, "source": source}]
        if source == STATIC_BROKER_CONFIG:
            chain.append({"name": key, "value": None if sensitive else _show(info.default),
                          "source": DEFAULT_CONFIG})
        out.append({"name": key, "value": value, "read_only": True, "config_source": source,
                    "is_sensitive": sensitive, "synonyms": chain if synonyms else [],
                    "config_type": _setting_type(info.annotation, key),
                    "documentation": info.description if documentation else None})
    return out


def replace_configs(configs: dict[str, str], wanted: Mapping[str, str]) -> tuple[ErrorCode, str]:
    """AlterConfigs (the non-incremental API) on a topic's `configs`, in place: the
    topic's configs become exactly `wanted` (keys left out go back to their default).
    (INVALID_CONFIG, message) for an unknown key or a bad value; `configs` must then
    not be stored."""
    configs.clear()
    return topic_admin.apply_config_ops(configs, [(k, topic_admin.OP_SET, v) for k, v in wanted.items()])


class ConfigApis:
    """Handlers of the config APIs for a process: `cluster` (ClusterState: topic
    znodes, this process's node id), `settings` (its parsed settings, None when it has
    no schema) and `props` (the keys it was started with)."""

    def __init__(self, cluster: Any, settings: ConfigSchema | None, props: Mapping[str, str]):
        self.cluster = cluster
        self.settings = settings
        self.props = dict(props)

    def handlers(self) -> dict[int, Handler]:
        """API key -> handler (services.common.kafka.surface, CLUSTER role)."""
        return {DESCRIBE_CONFIGS: self.describe_configs, ALTER_CONFIGS: self.alter_configs,
                INCREMENTAL_ALTER_CONFIGS: self.incremental_alter_configs}

    def _broker_name_error(self, name: str) -> str | None:
        own = str(self.cluster.broker_id)
        if name in ("", own):
            return None
        return f"unexpected broker id {name!r}: this broker is {own} (or use the empty name for the defaults)"

    @staticmethod
    def _authorized(rtype: int, name: str, op: Op) -> ErrorCode | None:
        """None when the caller may `op` on the resource, else the error to answer."""
        if rtype == TOPIC:
            return None if authz.visible(op, Resource(ResourceType.TOPIC, name)) else authz.TOPIC_DENIED
        return None if authz.visible(op, Resource(ResourceType.CLUSTER, CLUSTER_NAME)) else authz.CLUSTER_DENIED

    async def describe_configs(self, req: Any, version: int, ctx: RequestContext) -> dict:
        """DescribeConfigs v1-4 (KIP-133; synonyms KIP-226, v1+; documentation and
        config types KIP-569, v3+): one result per resource, its own error code."""
        synonyms = bool(field(req, "include_synonyms", False))
        documentation = bool(field(req, "include_documentation", False))
        results = []
        for r in req.resources:
            rtype, name = int(r.resource_type), r.resource_name
            keys = r.configuration_keys
            out = {"resource_type": rtype, "resource_name": name, "error_code": 0, "error_message": None,
                   "configs": []}
            results.append(out)
            if rtype not in (TOPIC, BROKER):
                out.update(error_code=ErrorCode.INVALID_REQUEST,
                           error_message=f"resource type {rtype} is not supported (2 TOPIC, 4 BROKER)")
                continue
            denied = self._authorized(rtype, name, Op.DESCRIBE_CONFIGS)
            if denied is not None:
                out.update(error_code=denied, error_message=f"{denied.name}: DescribeConfigs on {name!r}")
                continue
            if rtype == BROKER:
                bad = self._broker_name_error(name)
                if bad:
                    out.update(error_code=ErrorCode.INVALID_REQUEST, error_message=bad)
                    continue
                out["configs"] = broker_config_entries(self.settings, self.props, keys, synonyms, documentation)
                continue
            configs = await asyncio.to_thread(self.cluster.topic_configs, name)
            if configs is None:
                out.update(error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, error_message=f"unknown topic {name!r}")
                continue
            out["configs"] = topic_config_entries(configs, self.props, keys, synonyms, documentation)
        return {"throttle_time": 0, "results": results}

    async def _alter(self, req: Any, update_for: Callable[[Any], Callable[[dict[str, str]], tuple]],
                     check_broker: Callable[[Any], tuple[ErrorCode, str]]) -> dict:
        validate_only = bool(field(req, "validate_only", False))
        responses = []
        for r in req.resources:
            rtype, name = int(r.resource_type), r.resource_name
            code, msg = ErrorCode.NONE, ""
            denied = self._authorized(rtype, name, Op.ALTER_CONFIGS) if rtype in (TOPIC, BROKER) else None
            if rtype not in (TOPIC, BROKER):
                code, msg = ErrorCode.INVALID_REQUEST, f"resource type {rtype} is not supported (2 TOPIC, 4 BROKER)"
            elif denied is not None:
                code, msg = denied, f"{denied.name}: AlterConfigs on {name!r}"
            elif rtype == BROKER:
                bad = self._broker_name_error(name)
                code, msg = (ErrorCode.INVALID_REQUEST, bad) if bad else check_broker(r)
            else:
                code, msg = await asyncio.to_thread(self.cluster.alter_topic_configs, name, update_for(r),
                                                    validate_only)
            responses.append({"error_code": int(code), "error_message": msg or None, "resource_type": rtype,
                              "resource_name": name})
        return {"throttle_time": 0, "responses": responses}

    def _refuse_broker(self, names: Iterable[str]) -> tuple[ErrorCode, str]:
        """Settings are fixed for the life of a process: INVALID_CONFIG naming an
        unknown key, else INVALID_REQUEST naming the keys that cannot change."""
        known = {info.alias for info in type(self.settings).model_fields.values()} if self.settings else set()
        names = list(names)
        unknown = [n for n in names if n not in known]
        if unknown:
            return ErrorCode.INVALID_CONFIG, f"unknown broker config {unknown[0]!r}"
        if not names:
            return ErrorCode.NONE, ""
        return (ErrorCode.INVALID_REQUEST,
                f"cannot update these configs dynamically: {', '.join(names)} (broker settings are read-only; "
                "set them with --set or --config and restart the service)")

    async def alter_configs(self, req: Any, version: int, ctx: RequestContext) -> dict:
        """AlterConfigs v0-2 (KIP-133): a topic's configs become exactly the ones given
        (the others go back to their default), atomically."""
        def update(r):
            wanted = {c.name: c.value if c.value is not None else "" for c in r.configs}
            return lambda configs: replace_configs(configs, wanted)
        return await self._alter(req, update, lambda r: self._refuse_broker(c.name for c in r.configs))

    async def incremental_alter_configs(self, req: Any, version: int, ctx: RequestContext) -> dict:
        """IncrementalAlterConfigs v0-1 (KIP-339): SET (0) and DELETE (1) per key;
        APPEND (2) and SUBTRACT (3) answer INVALID_CONFIG (topic configs here are not
        lists)."""
        def update(r):
            ops = [(c.name, int(c.config_operation), c.value if c.value is not None else "") for c in r.configs]
            return lambda configs: topic_admin.apply_config_ops(configs, ops)
        return await self._alter(req, update, lambda r: self._refuse_broker(c.name for c in r.configs))
