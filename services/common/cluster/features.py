"""Feature levels and format versions: what each process of the cluster may write
(KIP-584 feature versioning; Kafka's `metadata.version`; docs/operating/upgrades.md and
docs/operating/upgrade-formats.md).

**One feature, `metadata.version`.** Its finalized level is a znode,
`/exactly/features`, JSON `{"version": 1, "features": {"metadata.version": L}}`; the
znode's version is the features' epoch. Each level names the formats (records of the
internal topics, producer-state snapshots, checkpoint files, ZooKeeper nodes) and the
inter-service calls and fields that may be written or sent at that level (`LEVELS`,
`FORMATS`). A process reads every format of every level it supports; it writes the
newer ones only once the level allows them, which the operator raises (`exactly
features upgrade`) after every live process runs a version that reads them. Every
process advertises the range it supports in its registration
(`/exactly/services/<node id>`, `"features": {"metadata.version": {"min_version": 1,
"max_version": 2}}`); a registration without it is a version from before feature
levels, which supports level 1 only.

A cluster whose ZooKeeper has no `/exactly/features` is either new (no services,
topics or coordinator znodes yet: it starts at STABLE_LEVEL, as a new Kafka cluster starts
at the newest stable metadata.version, or at MAX_LEVEL when the process creating it sets
`unstable.feature.versions.enable`) or was run by a version before feature levels (it
starts at BASELINE_LEVEL, and is raised by the operator once every process is
upgraded). A process whose supported range does not include the finalized level
refuses to start (`FeatureLevelError`), and one that meets a format version newer than
it reads refuses that record, file or znode (`UnknownFormatVersion`), naming it; it
never decodes it as something else.

This module is pure: the ZooKeeper reads and writes are in cluster.state.ClusterState.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Mapping
from ..protocol import CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC

METADATA_VERSION = "metadata.version"
FEATURES_PATH = "/exactly/features"
FEATURES_NODE_VERSION = 1  # the JSON layout of /exactly/features

# The level of a cluster last run by versions before feature levels (their formats).
BASELINE_LEVEL = 1
MIN_LEVEL = 1  # the oldest level this version runs at (reads and writes)
MAX_LEVEL = 3  # the newest level this version knows (and reads)
# The newest level a process runs at unless `unstable.feature.versions.enable` is true
# (Kafka's unstable metadata versions, KIP-1022): the levels above it, when there are
# any, are still being built, so a new cluster does not start there and an upgrade to
# them is refused by a process that does not enable them. Every level this version
# knows is stable.
STABLE_LEVEL = 3

# What each level lets processes write or send (docs/operating/upgrade-formats.md).
LEVELS: dict[int, str] = {
    1: "the formats and calls of the versions before feature levels: transaction-log values version 0 "
       "(InitProducerId with keep_prepared_txn keeps a prepared transaction under its own producer id and "
       "epoch, without fencing the previous instance), no per-principal partition counts",
    2: "transaction-log values version 1 (InitProducerId with keep_prepared_txn bumps the client-facing epoch "
       "and keeps the prepared transaction's own pair beside it, fencing the previous instance: KIP-939); the "
       f"feature-level record of {TRANSACTION_STATE_TOPIC}; the per-principal partition counts "
       "(/exactly/config/partitions/<principal>) that reserve max_partitions with the topic; inter-service "
       "protocol 2: VerifyProducerId answers UNKNOWN_PRODUCER_ID for an idempotent producer id bound to no one "
       "(versions before it answer CLUSTER_AUTHORIZATION_FAILED, and their partition leaders would take the "
       "new answer for a failed check and have the producer retry until its delivery timeout)",
    3: f"transaction coordinators lead their own {TRANSACTION_STATE_TOPIC} "
       "partitions (docs/design/coordinator-local-logs.md). A claim of a partition also makes the new owner its "
       "first replica (the topic znode's replicas, with the replicas leaving listed under \"removing\"), the "
       "controller elects a coordinator and moves leadership to the first replica once it is in sync, and "
       "partition leaders replicate from coordinators; versions before it neither count a coordinator as a "
       "replica nor fetch from one",
}


@dataclass(frozen=True)
class Format:
    """A persistent format or protocol: its name, where it lives, and the level that
    introduced each of its versions ({version: level})."""

    name: str
    where: str
    versions: Mapping[int, int]

    @property
    def newest(self) -> int:
        return max(self.versions)

    def version_for(self, level: int) -> int:
        """The newest version of this format that `level` lets a process write."""
        return max(v for v, introduced in self.versions.items() if introduced <= level)

    def level_of(self, version: int) -> int | None:
        """The level that introduced `version` (None: not a version this code knows)."""
        return self.versions.get(version)


def _formats(*items: Format) -> dict[str, Format]:
    return {f.name: f for f in items}


# Every versioned format (docs/operating/upgrade-formats.md lists them; a unit test checks it does).
FORMATS: dict[str, Format] = _formats(
    Format("record-batch", "segment files (magic byte)", {2: 1}),
    Format("transaction-marker", "control records (key and value version int16)", {0: 1}),
    Format("txn-log-value", f"{TRANSACTION_STATE_TOPIC}: TransactionLogValue.version", {0: 1, 1: 2}),
    Format("txn-log-group-assignment", f"{TRANSACTION_STATE_TOPIC}: GroupAssignmentValue.version", {0: 1}),
    Format("txn-log-producer-id-binding", f"{TRANSACTION_STATE_TOPIC}: ProducerIdBindingValue.version", {0: 1}),
    Format("txn-log-feature-level", f"{TRANSACTION_STATE_TOPIC}: FeatureLevelValue.version", {0: 2}),
    Format("offsets-log", f"{CONSUMER_OFFSETS_TOPIC}: OffsetsLogKey / values .version", {0: 1}),
    Format("producer-state-snapshot", "producer-state RocksDB: version int16", {1: 1, 2: 1}),
    Format("txn-index-entry", "<segment>.txnindex: version int16 per entry", {0: 1}),
    Format("leader-epoch-checkpoint", "leader-epoch-checkpoint: version line", {0: 1}),
    # The layout of a data directory and its files without a version of their own
    # (segments' offset indexes, recovery-point, high-watermark, log-start-offset).
    Format("data-directory", "<data dir>/meta.properties: version=", {0: 1}),
    Format("zk-features", "/exactly/features: \"version\"", {1: 1}),
    Format("zk-registration", "/exactly/services/<node id>: \"version\" (none: 1)", {1: 1}),
    Format("zk-topic", "/exactly/topics/<topic>: \"version\" (none: 1)", {1: 1}),
    # Fields of the topic znode and of a registration for level 3 (readers of earlier
    # versions ignore unknown fields): "removing" is written only at level 3; "hosts" by
    # a transaction coordinator that enables unstable levels, and counted only at 3.
    Format("zk-topic-removing", "/exactly/topics/<internal topic>: \"removing\" (replicas leaving a partition "
           "once its first replica leads)", {1: 3}),
    Format("zk-registration-hosts", "/exactly/services/<node id>: \"hosts\" (the internal topic a coordinator "
           "hosts replicas of)", {1: 3}),
    Format("zk-partition-state", "/exactly/topics/<topic>/<p>/state: \"version\" (none: 1)", {1: 1}),
    Format("zk-controller", "/exactly/controller and /exactly/controller_epoch: \"version\" (none: 1)", {1: 1}),
    Format("zk-coordinator-claim", "/exactly/coordinators/<kind>/<p>: \"version\" (none: 1)", {1: 1}),
    Format("zk-producer-id-block", "/exactly/producer_id_block: \"version\" (none: 1)", {1: 1}),
    Format("zk-partition-count", "/exactly/config/partitions/<principal>: \"version\"", {1: 2}),
    Format("inter-service-protocol", "exactly.v1 gRPC calls between services: metadata.version", {1: 1, 2: 2}),
)


class FeatureLevelError(RuntimeError):
    """The finalized level is one this version does not support: the process does not
    start (or stops), with this error naming the level."""


class UnknownFormatVersion(ValueError):
    """A record, file or znode of a format version this code does not read."""


def check_readable(name: str, version: int, where: str) -> None:
    """Raise UnknownFormatVersion when version `version` of format `name` (FORMATS)
    is not one this code reads; `where` names the record, file or znode for the error."""
    fmt = FORMATS[name]
    if fmt.level_of(version) is None:
        raise UnknownFormatVersion(
            f"{where}: {name} version {version} is not one this version of Exactly reads "
            f"({', '.join(map(str, sorted(fmt.versions)))}); it was written by a newer version, at a "
            f"metadata.version above {MAX_LEVEL}: run that version")


def zk_json(name: str, body: Mapping) -> bytes:
    """The JSON of a znode of format `name` (FORMATS, "zk-..."): `body` with the
    format's version as "version" (readers of versions before the field ignore it)."""
    return json.dumps({"version": FORMATS[name].newest, **body}).encode()


def zk_read(name: str, data: bytes, path: str) -> dict:
    """The parsed JSON of a znode of format `name`, its version checked (no "version":
    1, the layout of the versions before the field). Raises UnknownFormatVersion, or
    ValueError for malformed JSON."""
    body = json.loads(data) if data else {}
    if not isinstance(body, dict):
        raise ValueError(f"{path}: not a JSON object")
    check_readable(name, int(body.get("version", 1)), path)
    return body


def write_version(name: str, level: int) -> int:
    """The version of format `name` a process writes at finalized level `level`."""
    return FORMATS[name].version_for(level)


@dataclass(frozen=True)
class SupportedRange:
    """The levels of a feature a process supports, inclusive."""

    min_version: int
    max_version: int

    def covers(self, level: int) -> bool:
        return self.min_version <= level <= self.max_version

    def __str__(self) -> str:
        return str(self.min_version) if self.min_version == self.max_version else \
            f"{self.min_version}-{self.max_version}"


# The levels a process runs at by default (up to STABLE_LEVEL), and with
# unstable.feature.versions.enable (up to MAX_LEVEL: every format this code reads).
SUPPORTED = SupportedRange(MIN_LEVEL, STABLE_LEVEL)
KNOWN = SupportedRange(MIN_LEVEL, MAX_LEVEL)
# What a registration without "features" means: a version from before feature levels.
PRE_FEATURES = SupportedRange(BASELINE_LEVEL, BASELINE_LEVEL)


def supported_range(unstable: bool) -> SupportedRange:
    """The levels a process runs at: KNOWN with `unstable` (the setting
    unstable.feature.versions.enable), SUPPORTED otherwise."""
    return KNOWN if unstable else SUPPORTED


def registration_features(supported: SupportedRange = SUPPORTED) -> dict:
    """The "features" entry of this process's registration znode."""
    return {METADATA_VERSION: {"min_version": supported.min_version, "max_version": supported.max_version}}


def supported_of(registration: Mapping) -> SupportedRange:
    """The metadata.version range a registration (its parsed JSON) advertises;
    PRE_FEATURES when it advertises none."""
    entry = (registration.get("features") or {}).get(METADATA_VERSION)
    if not isinstance(entry, Mapping):
        return PRE_FEATURES
    return SupportedRange(int(entry["min_version"]), int(entry["max_version"]))


def encode_finalized(level: int) -> bytes:
    """The /exactly/features body finalizing metadata.version at `level`."""
    return json.dumps({"version": FEATURES_NODE_VERSION, "features": {METADATA_VERSION: level}}).encode()


def decode_finalized(data: bytes) -> int:
    """The finalized metadata.version of a /exactly/features body. Raises
    UnknownFormatVersion (a layout this code does not read) or ValueError (malformed)."""
    body = json.loads(data)
    check_readable("zk-features", int(body.get("version", 1)), FEATURES_PATH)
    return int(body["features"][METADATA_VERSION])


def check_finalized(level: int, supported: SupportedRange = SUPPORTED) -> None:
    """Raise FeatureLevelError when this version cannot run at finalized `level`."""
    if STABLE_LEVEL < level <= MAX_LEVEL and not supported.covers(level):
        raise FeatureLevelError(
            f"metadata.version {level} is finalized in ZooKeeper ({FEATURES_PATH}), an unstable level of this "
            f"version of Exactly (it runs at {supported}): set unstable.feature.versions.enable=true to run at it")
    if not supported.covers(level):
        raise FeatureLevelError(
            f"metadata.version {level} is finalized in ZooKeeper ({FEATURES_PATH}), and this version of Exactly "
            f"supports metadata.version {supported}: run a version that supports {level}"
            + (" (a downgrade is possible only before the level is raised)" if level > supported.max_version
               else ""))


def initial_level(existing_cluster: bool, supported: SupportedRange = SUPPORTED) -> int:
    """The level a cluster without /exactly/features starts at: BASELINE_LEVEL when
    versions before feature levels ran it (`existing_cluster`), else the newest level
    the process creating it runs at (`supported`: STABLE_LEVEL unless unstable levels
    are enabled)."""
    return BASELINE_LEVEL if existing_cluster else supported.max_version


def upgrade_refusal(target: int, current: int, processes: Mapping[str, SupportedRange],
                    supported: SupportedRange = SUPPORTED) -> str | None:
    """Why metadata.version cannot be raised from `current` to `target` (None: it
    can): a level this version does not know, one not above the current, or live
    `processes` (node id -> supported range) that do not support it, named."""
    if target in LEVELS and target > supported.max_version and KNOWN.covers(target):
        return (f"metadata.version {target} is unstable in this version (it runs at {supported}): set "
                "unstable.feature.versions.enable=true on every process first")
    if target not in LEVELS or not supported.covers(target):
        return f"metadata.version {target} is not a level this version supports ({supported})"
    if target < current:
        return f"metadata.version is {current}; {target} is lower: that is a downgrade"
    lacking = sorted(f"{node} (supports {rng})" for node, rng in processes.items() if not rng.covers(target))
    if lacking:
        return (f"metadata.version {target} is not supported by every live process: {', '.join(lacking)}; "
                "upgrade them first")
    return None


def downgrade_refusal(target: int, current: int, supported: SupportedRange = SUPPORTED) -> str | None:
    """Why metadata.version cannot be lowered from `current` to `target` (None: it
    can). A level's formats may be in the logs, snapshots and checkpoints as soon as
    it was finalized, and the lower level's versions cannot read them, so a lower
    level is refused, as Kafka refuses an unsafe metadata.version downgrade; the
    same level is accepted (nothing changes)."""
    if target not in LEVELS or not supported.covers(target):
        return f"metadata.version {target} is not a level this version supports ({supported})"
    if target > current:
        return f"metadata.version is {current}; {target} is higher: that is an upgrade"
    if target < current:
        return (f"metadata.version {current} cannot be lowered to {target}: records, snapshots and checkpoints "
                f"of level {current} may already be written, which versions of level {target} cannot read; "
                "a downgrade is possible only before the level is raised")
    return None
