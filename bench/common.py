"""Shared helpers of the benchmark suite: statistics, progress lines, clusters, RSS."""
from __future__ import annotations

import math
import os
import pathlib
import statistics
import sys
import time
from typing import TYPE_CHECKING, Callable

from exactly import AdminClient, NewTopic

if TYPE_CHECKING:  # the clients of bench.cost_clients run against another version's exactly_tools
    from exactly_tools.devcluster import DevCluster


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values (nan when empty)."""
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[k]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads) so far, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int | str = "self") -> dict[int, tuple[str, float]]:
    """{tid: (thread name, CPU s so far)} of every thread of `pid` (default: this
    process), from /proc/<pid>/task/<tid>/stat."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                text = f.read()
        except OSError:
            continue  # ended meanwhile
        name = text[text.index("(") + 1:text.rindex(")")]
        fields = text.rsplit(")", 1)[1].split()
        out[int(tid)] = (name, (int(fields[11]) + int(fields[12])) / tick)
    return out


def rss_bytes(pid: int) -> int:
    """VmRSS of a process, from /proc/<pid>/status."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def wait_until(check: Callable[[], bool], timeout_s: float, interval_s: float = 0.02, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what or check}")
        time.sleep(interval_s)


class Progress:
    """One line per phase on stderr: `bench [i/N] name ... result (seconds)`."""

    def __init__(self, total: int):
        self.total = total
        self.index = 0
        self._started = 0.0

    def start(self, name: str) -> None:
        self.index += 1
        self._started = time.perf_counter()
        print(f"bench [{self.index:>2}/{self.total}] {name} ...", end="", file=sys.stderr, flush=True)

    def done(self, summary: str) -> None:
        print(f" {summary} ({time.perf_counter() - self._started:.0f} s)", file=sys.stderr, flush=True)


def start_cluster(directory: pathlib.Path, partition_leaders: int = 1, props: dict[str, str] | None = None,
                  security: bool = False, python: str = "") -> "DevCluster":
    """A fresh dev cluster in `directory` (a leftover one there is stopped first).
    `python`: the services' interpreter ("": this one; another installation's runs
    that version, exactly_tools.releases)."""
    from exactly_tools.devcluster import DevCluster
    if (directory / "cluster.json").exists():
        try:
            DevCluster.load(directory).down()
        except Exception:  # noqa: BLE001 - a broken leftover: start afresh anyway
            pass
    if directory.exists():
        import shutil
        shutil.rmtree(directory)
    cluster = DevCluster(directory, props=dict(props or {}), security=security)
    cluster.up(partition_leaders=partition_leaders, txn_coordinators=1, group_coordinators=1, python=python)
    return cluster


def cluster_level(cluster: "DevCluster", timeout_s: float = 60.0) -> int:
    """The cluster's finalized metadata.version; at level 3 (coordinator-led
    `__transaction_state`), once every partition of that topic is led by its first
    replica, a transaction coordinator, with no replica left to remove (so that a
    measurement starts on the steady state). Raises TimeoutError after `timeout_s`."""
    import json

    from kazoo.client import KazooClient
    zk = KazooClient(hosts=cluster.zookeeper, timeout=10)
    zk.start(timeout=30)
    try:
        if not zk.exists("/exactly/features"):
            return 1  # a version before feature levels
        level = json.loads(zk.get("/exactly/features")[0])["features"]["metadata.version"]
        if level < 3:
            return level
        deadline = time.monotonic() + timeout_s
        while True:
            if zk.exists("/exactly/topics/__transaction_state"):
                body = json.loads(zk.get("/exactly/topics/__transaction_state")[0])
                leaders = {p: json.loads(zk.get(f"/exactly/topics/__transaction_state/{p}/state")[0])["leader"]
                           for p in body["partitions"]}
                if not body.get("removing") and all(leaders[p] == r[0] and r[0] in cluster.services and
                                                    cluster.services[r[0]].role == "txn_coordinator"
                                                    for p, r in body["partitions"].items()):
                    return level
            if time.monotonic() > deadline:
                raise TimeoutError(f"__transaction_state not led by its coordinators within {timeout_s:.0f} s")
            time.sleep(0.1)
    finally:
        zk.stop()
        zk.close()


def create_topic(cluster: "DevCluster", name: str, partitions: int = 1, replication_factor: int = 1,
                 configs: dict[str, str] | None = None) -> None:
    with AdminClient({"bootstrap.servers": cluster.bootstrap_servers, **cluster.client_config}) as admin:
        admin.create_topics([NewTopic(name, partitions, replication_factor, config=configs or {})])


def delete_topic(cluster: "DevCluster", name: str) -> None:
    """Delete topic `name` (its leader removes the log at once, and the kernel frees
    its page cache)."""
    with AdminClient({"bootstrap.servers": cluster.bootstrap_servers, **cluster.client_config}) as admin:
        admin.delete_topics([name])


def page_touch_us(size: int = 64 << 20) -> float:
    """µs to write the first byte of each 4 KiB page of `size` bytes of new anonymous
    memory: the cost of the page fault that a log's page cache and large buffers pay
    on every page they take anew. 2.2-3.6 µs on the 2-core benchmark machine of
    docs/benchmarks.md, a virtual machine whose host backs guest memory on first touch
    and takes freed pages back (virtio-balloon free page reporting)."""
    import mmap
    page = mmap.PAGESIZE
    with mmap.mmap(-1, size) as m:
        t0 = time.perf_counter()
        for i in range(0, size, page):
            m[i] = 1
        return (time.perf_counter() - t0) / (size // page) * 1e6


def machine_info() -> dict:
    """The machine a run measured: CPUs, memory, CPU model, Python, load average and
    page_touch_us (`page_touch_us`) at the start."""
    info = {"cpus": os.cpu_count(), "loadavg_start": list(os.getloadavg()), "page_touch_us_start": page_touch_us()}
    try:
        with open("/proc/meminfo") as f:
            info["mem_total_kib"] = int(f.readline().split()[1])
    except OSError:
        pass
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info["python"] = sys.version.split()[0]
    return info


def machine_end(info: dict) -> None:
    """Add the load average and `page_touch_us` at the end of the run to `info` (from
    machine_info)."""
    info["loadavg_end"] = list(os.getloadavg())
    info["page_touch_us_end"] = page_touch_us()


def machine_conditions(info: dict) -> str:
    """The load average and `page_touch_us` at both ends of a run, for a footer:
    "load average 0.9 at the start, 4.4 at the end; a new page of memory written in 2.4 µs
    at the start, 2.4 µs at the end" (`info` from machine_info and machine_end)."""
    return (f"load average {info['loadavg_start'][0]:.1f} at the start, {info['loadavg_end'][0]:.1f} at the end; "
            f"a new page of memory written in {info['page_touch_us_start']:.1f} µs at the start, "
            f"{info['page_touch_us_end']:.1f} µs at the end")
