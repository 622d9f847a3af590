"""A transactional SDK Producer in a process of its own, driven one call at a time, so
that a test interleaves two producer instances that are really separate OS
processes (a zombie and its successor).

    python remote_producer.py BOOTSTRAP TRANSACTIONAL_ID

reads one JSON call per line on stdin -- {"call": name, "args": [...]} with name one
of init, begin, send, flush, prepare, prepared_state, complete, commit, abort --
and answers one JSON line per call on stdout: {"ok": result} or {"error": the
exception's class name, "message": str}. `RemoteProducer` is the test's side; every
answer has a deadline.
"""
from __future__ import annotations

import json
import os
import pathlib
import select
import subprocess
import sys

CALL_TIMEOUT_S = 60.0


def serve(bootstrap: str, transactional_id: str) -> None:
    from exactly import Producer
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id, "linger.ms": 5,
                  "max.block.ms": 30000, "request.timeout.ms": 10000})
    calls = {
        "init": lambda keep=False: p.init_transactions(30, keep_prepared_txn=keep),
        "begin": p.begin_transaction,
        "send": lambda topic, value, partition: p.send(topic, value.encode(), partition=partition).result(30).offset,
        "flush": lambda: p.flush(30),
        "prepare": lambda: p.prepare_transaction(30).serialize(),
        "prepared_state": lambda: (lambda s: s and s.serialize())(p.prepared_transaction_state()),
        "complete": lambda state: p.complete_transaction(state, 30),
        "commit": lambda: p.commit_transaction(30),
        "abort": lambda: p.abort_transaction(30),
    }
    try:
        for line in sys.stdin:
            msg = json.loads(line)
            try:
                out = {"ok": calls[msg["call"]](*msg.get("args", []))}
            except Exception as exc:  # noqa: BLE001 - reported to the test, which asserts on it
                out = {"error": type(exc).__name__, "message": str(exc)}
            print(json.dumps(out), flush=True)
    finally:
        p.close(5)


class RemoteProducer:
    """The test's handle on a remote_producer process (a context manager)."""

    def __init__(self, bootstrap: str, transactional_id: str):
        root = pathlib.Path(__file__).resolve().parents[2]
        self.proc = subprocess.Popen([sys.executable, __file__, bootstrap, transactional_id], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, cwd=root,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def call(self, name: str, *args) -> dict:
        """Run one call in the remote process; returns its answer ({"ok": ...} or
        {"error": class name, "message": ...}). Raises TimeoutError past CALL_TIMEOUT_S."""
        self.proc.stdin.write(json.dumps({"call": name, "args": list(args)}) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], CALL_TIMEOUT_S)
        if not ready:
            raise TimeoutError(f"remote producer: no answer to {name} within {CALL_TIMEOUT_S} s")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"remote producer exited ({self.proc.poll()}) during {name}")
        return json.loads(line)

    def ok(self, name: str, *args):
        """`call`, asserting success; returns the result."""
        answer = self.call(name, *args)
        assert "ok" in answer, (name, answer)
        return answer["ok"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)

    def __enter__(self) -> "RemoteProducer":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2])
