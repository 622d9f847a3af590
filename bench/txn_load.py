"""The transaction coordinator's InitProducerId rate alone (the "txn-load" phase of
`make bench` without its restarts): a fresh dev cluster (1 partition leader, 1
transaction coordinator), `--ids` new transactional ids through raw gRPC stubs from
2 processes with 128 requests in flight each (bench.recovery.create_transactional_ids),
then ids/s, the coordinator's RSS growth per id (bytes) and the CPU seconds the
coordinator and the partition leader spent per 1,000 ids (from /proc: steadier than
wall time on a shared machine). `--profile DIR`: py-spy flame graphs of both.

    python -m bench.txn_load --ids 20000 [--security] [--profile DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time

from .common import cpu_seconds, rss_bytes, start_cluster
from .recovery import create_transactional_ids


def run(ids: int, directory: pathlib.Path, security: bool = False, profile: pathlib.Path | None = None,
        settle_s: float = 1.0) -> dict:
    """Figures of one run: ids, seconds, ids_per_s, bytes_per_id (coordinator RSS
    growth / ids), coordinator / leader CPU ms per 1,000 ids, load average."""
    cluster = start_cluster(directory, 1, None, security)
    try:
        coord = cluster.services["txn-0"]
        leader = cluster.services["pl-0"]
        time.sleep(settle_s)
        rss0 = rss_bytes(coord.pid)
        cpu0 = {"coordinator": cpu_seconds(coord.pid), "leader": cpu_seconds(leader.pid)}
        spy = None
        if profile is not None:
            from .profiling import PySpy
            spy = PySpy(profile, {"txn-coordinator": coord.pid, "partition-leader": leader.pid}, prefix="txn-load", fmt="raw")
        created = create_transactional_ids(coord.address, ids)
        cpu1 = {"coordinator": cpu_seconds(coord.pid), "leader": cpu_seconds(leader.pid)}
        if spy is not None:
            created["profiles"] = spy.stop()
        time.sleep(settle_s)
        rss1 = rss_bytes(coord.pid)
    finally:
        cluster.down()
    out = dict(created)
    out.update({"bytes_per_id": (rss1 - rss0) / max(ids, 1), "loadavg": os.getloadavg()[0]})
    for name in cpu0:
        out[f"{name}_cpu_ms_per_1000_ids"] = (cpu1[name] - cpu0[name]) * 1000 / ids * 1000
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.txn_load", description=__doc__.split("\n\n")[0])
    ap.add_argument("--ids", type=int, default=20_000, help="transactional ids to create")
    ap.add_argument("--reps", type=int, default=1, help="runs, each on a fresh cluster")
    ap.add_argument("--security", action="store_true", help="a cluster with TLS, SASL and the authorizer")
    ap.add_argument("--profile", type=pathlib.Path, help="write py-spy flame graphs into this directory")
    ap.add_argument("--dir", type=pathlib.Path, help="cluster directory (default: a temporary one)")
    args = ap.parse_args(argv)
    base = args.dir or pathlib.Path(tempfile.mkdtemp(prefix="txn-load-"))
    for rep in range(args.reps):
        figures = run(args.ids, base / f"run{rep}", args.security, args.profile if rep == 0 else None)
        print(json.dumps(figures), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
