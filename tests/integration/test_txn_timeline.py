"""`python -m bench.txn_timeline` on a real one-leader dev cluster: every probed step
of a lone transaction is seen in every process it runs in (the probe reaches the
services through PYTHONPATH), and the steps come in KIP-98's causal order: the
leader's KIP-890 add reaches the coordinator before the records are acknowledged,
and EndTxn starts after the acknowledgements and returns before commit_transaction()."""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration


@pytest.mark.timeout(240)
def test_a_short_timeline_run_sees_every_step_in_causal_order(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "bench.txn_timeline", "--transactions", "40", "--warmup", "5",
                           "--partitions", "2", "--dir", str(tmp_path), "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=220)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["transactions"] == 40 and out["partitions"] == 2
    at = {row["event"]: row["p50_ms"] for row in out["steps"]}
    for name in ["sdk: call queued on its stream", "leader: append of a batch", "leader: KIP-890 add / verify",
                 "leader: append of a batch to an internal topic", "coordinator: AddPartitionsToTxn",
                 "coordinator: EndTxn", "coordinator: transaction-log append"]:
        assert f"{name} >" in at and f"{name} <" in at, (name, sorted(at))
    chain = ["client: send", "leader: KIP-890 add / verify >", "coordinator: AddPartitionsToTxn >",
             "coordinator: AddPartitionsToTxn <", "leader: KIP-890 add / verify <", "client: records acknowledged",
             "coordinator: EndTxn >", "coordinator: EndTxn <", "client: commit_transaction returned"]
    assert [at[name] for name in chain] == sorted(at[name] for name in chain), {name: at[name] for name in chain}
    assert 0 < out["cycle_ms"]["p50"] < 1000
