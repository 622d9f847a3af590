"""Running documented code blocks (tests/docs/codeblocks.py) against a dev cluster, as a
reader runs them (docs/getting-started.md, "How the examples run").

A page's blocks run in order in a working directory of their own that looks like a clone of
the repository (its top-level entries linked, so `.venv/bin/exactly`, `data/` and `deploy/`
resolve) with the module's dev cluster at `.run/dev` (`.run/dev/cluster.json`), and with
`EXACTLY_BOOTSTRAP_SERVER` set to its gRPC addresses and `.venv/bin` first on `PATH`. A block
that starts a cluster of its own (`exactly-dev up`) runs in a directory without `.run/dev`.

A transactional block (one that sets a transactional.id, or writes with Spark's exactly
sink) reads the topic `purchases` and writes `invoices` and/or `shipments`: the runner
recreates those topics, fills `purchases` with `RECORDS` records, runs the block, SIGKILLs
it once it has committed a transaction and has the next one open (records past the last
stable offset), runs it again until the output is complete (stopping it if it serves on),
and reads every output topic under read_committed: each input record must be there exactly
once. So both ways an example can lose exactly-once show: a transaction committed without
the input's offsets is copied again, and the open transaction's records must never show.
"""
from __future__ import annotations

import contextlib
import os
import pathlib
import re
import shlex
import signal
import subprocess
import time
from typing import Iterable, Iterator

import yaml

from docs.codeblocks import ROOT, Block, blocks

from exactly import AdminClient, Consumer, NewTopic, Producer, TopicPartition, errors
from exactly_tools.devcluster import DevCluster

INPUT = "purchases"
OUTPUTS = ("invoices", "shipments")
RECORDS = 2000
PARTITIONS = 3
# Seconds a block may run (a Spark session or a dev cluster of its own takes most of it).
BLOCK_TIMEOUT_S = 240.0
RUN_SLICE_S = 0.002  # how long a first run runs between two looks at its outputs (_kill_inside_a_transaction):
# the quick start's copy, 5 transactions of 400 records, once committed its last four within a 10 ms slice
_NOT_LINKED = {".git", ".run", "site", "__pycache__"}


def workdir(base: pathlib.Path, cluster: DevCluster | None) -> pathlib.Path:
    """A directory that looks like a clone of the repository: every top-level entry linked,
    and `.run/dev` the given cluster's directory (none when `cluster` is None)."""
    base.mkdir(parents=True, exist_ok=True)
    for entry in ROOT.iterdir():
        if entry.name not in _NOT_LINKED and not (base / entry.name).exists():
            (base / entry.name).symlink_to(entry)
    if cluster is not None:
        (base / ".run").mkdir(exist_ok=True)
        if not (base / ".run" / "dev").exists():
            (base / ".run" / "dev").symlink_to(cluster.dir)
    return base


def environment(cluster: DevCluster | None) -> dict[str, str]:
    """The environment every block runs with."""
    env = {**os.environ, "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ.get('PATH', '')}",
           "PYTHONUNBUFFERED": "1"}
    env.pop("EXACTLY_BOOTSTRAP_SERVER", None)
    for name in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):  # as a reader's shell has them: unset
        env.pop(name, None)
    if cluster is not None:
        env["EXACTLY_BOOTSTRAP_SERVER"] = cluster.bootstrap_servers
    return env


def starts_own_cluster(block: Block) -> bool:
    """A shell block that starts a dev cluster of its own (`exactly-dev up`)."""
    return block.kind == "bash" and re.search(r"^\S*exactly-dev up\b", block.text, re.M) is not None


def command(block: Block, directory: pathlib.Path) -> list[str]:
    """The command that runs `block` in `directory` (a python block is written to a file, a
    file block to its own name)."""
    if block.kind in ("python", "file"):
        path = directory / (block.title or f"block_{block.line}.py")
        path.write_text(block.text)
        return [str(ROOT / ".venv" / "bin" / "python"), path.name]
    if block.kind == "bash":
        return ["bash", "-euo", "pipefail", "-c", block.text]
    raise ValueError(f"{block.id}: a {block.kind} block does not run")


def _end_group(proc: subprocess.Popen) -> None:
    """SIGKILL whatever is left of the process group of a block's run (started with
    start_new_session) and reap the run: a child can outlive the run's own process (the
    JVM of a Spark driver that failed) and would otherwise run on after the test."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


def run(block: Block, directory: pathlib.Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run a block to its end; AssertionError unless it exits 0 within BLOCK_TIMEOUT_S
    (subprocess.TimeoutExpired past it). A block that failed or timed out leaves nothing
    running; one that succeeded may (what it started for the blocks after it)."""
    with subprocess.Popen(command(block, directory), cwd=directory, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=True) as proc:
        out = err = ""
        try:
            out, err = proc.communicate(timeout=BLOCK_TIMEOUT_S)
        finally:
            if proc.returncode != 0:
                _end_group(proc)
    assert proc.returncode == 0, f"{block.id} ({block.heading}) exited {proc.returncode}:\n{out}\n{err}"
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _outputs(block: Block) -> list[str]:
    found = [t for t in OUTPUTS if re.search(rf"""["']{t}["']""", block.text)]
    assert re.search(rf"""["']{INPUT}["']""", block.text) and found, (
        f"{block.id}: a transactional example reads {INPUT!r} and writes {' or '.join(map(repr, OUTPUTS))} "
        "(tests/docs/examples.py), so that its run can be checked for exactly-once")
    return found


def _groups(block: Block) -> list[str]:
    return re.findall(r"""["']group\.id["']\s*:\s*["']([^"']+)["']""", block.text)


def reset_topics(cluster: DevCluster, groups: list[str]) -> list[bytes]:
    """Recreate the input and output topics empty, delete `groups`, and fill the input with
    RECORDS records (keys `p0`, `p1`, ...). Returns the keys."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    try:
        existing = set(admin.list_topics())
        doomed = [t for t in (INPUT, *OUTPUTS) if t in existing]
        if doomed:
            admin.delete_topics(doomed)
        deadline = time.monotonic() + 60
        while groups:
            try:
                admin.delete_groups(groups)
                break
            except errors.GroupIdNotFoundError:
                break
            except errors.ExactlyError:
                # members of a killed run stay until their session times out
                assert time.monotonic() < deadline, f"groups {groups} still have members"
                time.sleep(1)
        admin.create_topics([NewTopic(t, PARTITIONS) for t in (INPUT, *OUTPUTS)])
    finally:
        admin.close()
    # The new topics must read empty everywhere before anything runs: an end offset of the
    # deleted topics, seen through a service's stale metadata, would time the crash wrong.
    deadline = time.monotonic() + 60
    while _ends(cluster, [INPUT, *OUTPUTS]) != (0, 0):
        assert time.monotonic() < deadline, "the recreated topics do not read empty"
        time.sleep(0.2)
    keys = [f"p{i}".encode() for i in range(RECORDS)]
    producer = Producer({"bootstrap.servers": cluster.bootstrap_servers})
    try:
        for key in keys:
            producer.send(INPUT, b"purchase " + key, key=key)
        producer.flush(60)
    finally:
        producer.close()
    return keys


def read_committed(cluster: DevCluster, topic: str, timeout_s: float = 60.0) -> list:
    """Every record of `topic` a read_committed consumer reads up to the last stable offset."""
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "isolation.level": "read_committed",
                         "enable.auto.commit": False})
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        ends = consumer.end_offsets(tps)
        out, deadline = [], time.monotonic() + timeout_s
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, f"could not read {topic} to its end"
            out += consumer.poll(timeout=0.5)
        return out
    finally:
        consumer.close()


@contextlib.contextmanager
def _end_offset_readers(cluster: DevCluster) -> Iterator[tuple[Consumer, Consumer]]:
    """Two consumers, read_committed and read_uncommitted, for looks at end offsets
    (`_end_offsets`) that cost their ListOffsets calls only."""
    readers = tuple(Consumer({"bootstrap.servers": cluster.bootstrap_servers, "isolation.level": level,
                              "enable.auto.commit": False}) for level in ("read_committed", "read_uncommitted"))
    try:
        yield readers
    finally:
        for reader in readers:
            reader.close()


def _end_offsets(cluster: DevCluster, topics: Iterable[str],
                 readers: tuple[Consumer, Consumer] | None = None) -> tuple[dict, dict]:
    """({partition: last stable offset}, {partition: high watermark}) of `topics`, read
    with `readers` (`_end_offset_readers`; two made for this look when None)."""
    if readers is None:
        with _end_offset_readers(cluster) as readers:
            return _end_offsets(cluster, topics, readers)
    tps = [TopicPartition(t, p) for t in topics for p in range(PARTITIONS)]
    return readers[0].end_offsets(tps), readers[1].end_offsets(tps)


def _ends(cluster: DevCluster, topics: list[str], readers: tuple[Consumer, Consumer] | None = None) -> tuple[int, int]:
    """(sum of the last stable offsets, sum of the high watermarks) of `topics`."""
    lso, hw = _end_offsets(cluster, topics, readers)
    return sum(lso.values()), sum(hw.values())


def _kill_inside_a_transaction(proc: subprocess.Popen, block: Block, cluster: DevCluster, outputs: list[str],
                               log: pathlib.Path, run_slice_s: float = RUN_SLICE_S) -> str:
    """SIGKILL `proc` once it committed something and has a transaction open (the LSO below
    the high watermark), or, if it never opens one again within 10 s, after its first
    commit. Returns what it was doing.

    The run is stopped (SIGSTOP) while the outputs are looked at and runs `run_slice_s`
    between two looks: a look takes several round trips, and a run (a transaction of the
    quick start's copy takes a few ms) could commit its whole input between two of them
    and exit before any crash."""
    deadline, committed_at = time.monotonic() + BLOCK_TIMEOUT_S, None
    with _end_offset_readers(cluster) as readers:
        while True:
            assert proc.poll() is None, f"{block.id} exited {proc.returncode} before the crash:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"{block.id} committed nothing:\n{log.read_text()}"
            crash = _look_stopped(proc, cluster, outputs, readers, committed_at)
            if isinstance(crash, str):
                return crash
            committed_at = crash
            time.sleep(run_slice_s)


def _look_stopped(proc: subprocess.Popen, cluster: DevCluster, outputs: list[str],
                  readers: tuple[Consumer, Consumer], committed_at: float | None) -> str | float | None:
    """One look of `_kill_inside_a_transaction` with the run stopped: what it was doing
    when it was killed, or when it first committed (None: not yet) if it runs on."""
    os.killpg(proc.pid, signal.SIGSTOP)
    try:
        lso, hw = _ends(cluster, outputs, readers)
        if lso > 0 and committed_at is None:
            committed_at = time.monotonic()
        if committed_at is not None and (hw > lso or time.monotonic() - committed_at > 10):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
            return (f"killed after {lso} committed offsets, with {hw - lso} past the last stable offset"
                    if hw > lso else f"killed after {lso} committed offsets, no transaction open")
        return committed_at
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGCONT)


def _members(cluster: DevCluster, groups: list[str]) -> dict[str, set[str]]:
    """group id -> member ids of its members with partitions assigned."""
    with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
        described = admin.describe_groups(groups) if groups else {}
    return {g: {m.member_id for m in d.members if m.assignment} for g, d in described.items()}


def _state(cluster: DevCluster, topics: list[str], groups: list[str]) -> str:
    """What the cluster holds, for a failure's message: each partition's last stable
    offset and high watermark, every transaction the coordinators list, and the groups'
    committed offsets."""
    lines = []
    try:
        lso, hw = _end_offsets(cluster, (INPUT, *topics))
        lines += [f"{tp.topic}-{tp.partition}: LSO {lso[tp]}, HW {hw[tp]}" for tp in lso]
        with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
            listed = admin.list_transactions()
            lines += [f"transaction {t}" for t in listed]
            described = admin.describe_transactions([t.transactional_id for t in listed]) if listed else {}
            lines += [f"described {d}" for d in described.values()]
            for g in groups:
                lines.append(f"group {g} committed {admin.list_consumer_group_offsets(g)}")
    except Exception as exc:  # noqa: BLE001 - a diagnostic only
        lines.append(f"(state not read: {exc!r})")
    return "\n".join(lines)


def _settle(cluster: DevCluster, block: Block, outputs: list[str], deadline: float,
            first_run: dict[str, set[str]], second: subprocess.Popen, quiet_s: float = 3.0) -> bool:
    """Wait until the second run (`second`) had its chance to copy again what the first
    one did: each consumer group of the block has a member with partitions assigned that
    is not one of the killed first run's (`first_run`, which stay until their session
    times out: the rebalance waits for them), then the outputs' last stable offsets and
    high watermarks stay the same for `quiet_s`. A fixed pause was too short on a busy
    machine: the second run of an example that duplicates had not joined yet. Returns
    True when the second run exited meanwhile (a copy that ends by itself may join, find
    nothing left and leave between two looks at the group)."""
    groups = _groups(block)
    while groups:
        if second.poll() is not None:
            return True
        now = _members(cluster, groups)
        if all(now.get(g, set()) - first_run.get(g, set()) for g in groups):
            break
        assert time.monotonic() < deadline, f"{block.id}: its second run never joined {groups}"
        time.sleep(0.2)
    with _end_offset_readers(cluster) as readers:
        last, since = _ends(cluster, outputs, readers), time.monotonic()
        while time.monotonic() - since < quiet_s:
            assert time.monotonic() < deadline, f"{block.id}: its outputs never stopped growing"
            time.sleep(0.25)
            now = _ends(cluster, outputs, readers)
            if now != last:
                last, since = now, time.monotonic()
    return second.poll() is not None


@contextlib.contextmanager
def _started(block: Block, directory: pathlib.Path, env: dict[str, str], log: pathlib.Path) -> Iterator[subprocess.Popen]:
    with open(log, "w") as out:
        proc = subprocess.Popen(command(block, directory), cwd=directory, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            yield proc
        finally:
            _end_group(proc)


def run_across_a_crash(block: Block, directory: pathlib.Path, env: dict[str, str], cluster: DevCluster,
                       run_slice_s: float = RUN_SLICE_S) -> dict:
    """The exactly-once check of a transactional block (module docstring); the first run
    runs `run_slice_s` between two looks at its outputs (`_kill_inside_a_transaction`).
    Returns {output topic: number of records read, "crash": how the first run was killed}."""
    outputs = _outputs(block)
    keys = reset_topics(cluster, _groups(block))
    logs = [directory / f"block_{block.line}.run{n}.log" for n in (1, 2)]
    with _started(block, directory, env, logs[0]) as first:
        crash = _kill_inside_a_transaction(first, block, cluster, outputs, logs[0], run_slice_s)
    first_run = _members(cluster, _groups(block))
    with _started(block, directory, env, logs[1]) as second:
        deadline = time.monotonic() + BLOCK_TIMEOUT_S
        while True:
            done = second.poll() is not None
            counts = {t: len(read_committed(cluster, t)) for t in outputs}
            if done or all(n >= len(keys) for n in counts.values()):
                break
            assert time.monotonic() < deadline, (f"{block.id}: output incomplete {counts}:\n{logs[1].read_text()}\n"
                                                 f"{_state(cluster, outputs, _groups(block))}")
            time.sleep(1)
        if not done:
            # a duplicate would be committed now, if there were one
            done = _settle(cluster, block, outputs, deadline, first_run, second)
        if done:
            assert second.returncode == 0, f"{block.id} exited {second.returncode}:\n{logs[1].read_text()}"
        else:
            os.killpg(second.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                second.wait(10)
    counts = {"crash": crash}
    for topic in outputs:
        got = sorted(r.key for r in read_committed(cluster, topic))
        assert got == sorted(keys), (f"{block.id}: {topic} under read_committed is not each input exactly once: "
                                     f"{len(got)} records, {len(set(got))} distinct, {len(keys)} inputs\n"
                                     f"{logs[0].read_text()[-2000:]}\n{logs[1].read_text()[-2000:]}")
        counts[topic] = len(got)
    return counts


def helm_commands(block: Block) -> list[tuple[str, pathlib.Path, str, dict]]:
    """(release, chart directory, namespace, values) of each `helm install` / `helm upgrade`
    of `block`, its `--set` values typed as helm types them (`--reuse-values` keeps the
    release's earlier ones)."""
    out, released = [], {}
    for line in block.text.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words[:2] not in (["helm", "install"], ["helm", "upgrade"]):
            continue
        name, chart, rest = words[2], ROOT / words[3], words[4:]
        values = dict(released.get(name, {})) if "--reuse-values" in rest else {}
        namespace = "default"
        for flag, value in zip(rest, rest[1:] + [""]):
            if flag in ("-n", "--namespace"):
                namespace = value
            elif flag == "--set":
                for item in value.split(","):
                    key, _, raw = item.partition("=")
                    node = values
                    *parents, leaf = key.split(".")
                    for part in parents:
                        node = node.setdefault(part, {})
                    node[leaf] = yaml.safe_load(raw)
        released[name] = values
        out.append((name, chart, namespace, values))
    return out


def render_helm(block: Block) -> str:
    """Render each helm command of `block` offline and validate every manifest strictly;
    AssertionError naming what fails."""
    from deploy.test_helm_chart import invalid, render, secrets_missing
    commands = helm_commands(block)
    assert commands, f"{block.id}: check=\"helm template\" but no helm install or upgrade"
    created = set(re.findall(r"kubectl\b[^\n]*\bcreate secret (?:generic|tls) (\S+)", block.text))
    done = []
    for name, chart, namespace, values in commands:
        objects = render(values, chart, name, namespace, user_secrets=False)
        failures = invalid(objects)
        assert objects and not failures, f"{block.id}: helm {name} with {values}:\n" + "\n".join(failures)
        tls = values.get("security", {}).get("tls", {})
        missing = secrets_missing(objects, created | {tls.get("existingSecret"), tls.get("clientSecret")} - {None})
        assert not missing, f"{block.id}: helm {name}: the pods need Secrets nothing makes: {sorted(missing)}"
        done.append(f"{name} ({len(objects)} objects)")
    return ", ".join(done)


def run_page(page: str, base: pathlib.Path, cluster: DevCluster, run_slice_s: float = RUN_SLICE_S) -> list[str]:
    """Run every runnable block of `page` in order (module docstring), a transactional one
    across a crash (`run_across_a_crash` with `run_slice_s`); returns a line per block
    saying what ran."""
    env = environment(cluster)
    directory = workdir(base / "page", cluster)
    done = []
    for block in blocks(page):
        if block.kind in ("text", "no-run"):
            continue
        if block.kind == "file":
            (directory / block.title).write_text(block.text)
            continue
        if block.kind == "helm":
            done.append(f"{block.id} rendered offline: {render_helm(block)}")
            continue
        if starts_own_cluster(block):
            own = workdir(base / f"own-{block.line}", None)
            run(block, own, environment(None))
            done.append(f"{block.id} ran (own cluster)")
        elif block.transactional:
            done.append(f"{block.id} exactly once across a crash: {run_across_a_crash(block, directory, env, cluster, run_slice_s)}")
        else:
            run(block, directory, env)
            done.append(f"{block.id} ran")
    return done


# Which test module runs each page's blocks (one dev cluster per module; README.md's blocks
# are the quick start, tests/docs/test_quickstart.py). Every page with a block to run is here.
RUN_BY = {
    "README.md": "test_quickstart",
    "docs/getting-started.md": "test_examples_operating",
    "docs/operating/cli.md": "test_examples_operating",
    "docs/operating/kubernetes.md": "test_examples_operating",
    "docs/benchmarks.md": "test_examples_operating",
    "docs/sdk.md": "test_examples_sdk",
    "docs/testing.md": "test_examples_sdk",
    "docs/kafka-clients.md": "test_examples_clients",
    "docs/security.md": "test_examples_clients",
    "docs/postgres.md": "test_examples_postgres",
    "docs/spark.md": "test_examples_spark",
}


def pages_of(module: str) -> list[str]:
    """The pages whose blocks the test module `module` runs."""
    return [page for page, runner in RUN_BY.items() if runner == module]


def dev_cluster(zk: str, base: pathlib.Path, postgres: bool = False) -> Iterator[DevCluster]:
    """For a module-scoped fixture: a dev cluster (3 partition leaders, a transaction and a
    group coordinator; a PostgreSQL server too with `postgres`) in its own ZooKeeper chroot,
    stopped after the module."""
    from clusters import new_chroot
    cluster = DevCluster(base / "cluster")
    try:
        cluster.up(3, 1, 1, zookeeper=new_chroot(zk, "docs"), postgres=postgres)
        yield cluster
    finally:
        cluster.down()


def page_tests(module: str, postgres: bool = False, timeout_s: int = 600, run_slice_s: float = RUN_SLICE_S):
    """The module-scoped `cluster` fixture and the test of a test module that runs the blocks
    of its pages (`pages_of(module)`), for `cluster, test_... = page_tests("test_examples_x")`;
    `timeout_s` bounds one page's blocks (two runs of each transactional one), `run_slice_s`
    how long a transactional block's first run runs between two looks (`run_page`)."""
    import pytest

    @pytest.fixture(scope="module", name="cluster")
    def cluster_fixture(zk, tmp_path_factory):
        yield from dev_cluster(zk, tmp_path_factory.mktemp(module), postgres=postgres)

    @pytest.mark.timeout(timeout_s)
    @pytest.mark.parametrize("page", pages_of(module))
    def test_every_block_of_the_page_runs(page, cluster, tmp_path):
        print("\n".join(run_page(page, tmp_path, cluster, run_slice_s)))

    return cluster_fixture, test_every_block_of_the_page_runs
