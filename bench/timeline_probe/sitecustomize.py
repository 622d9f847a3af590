"""Loads the timeline probe (exactly_timeline_probe.py, beside this file) in every
Python process started with this directory first on PYTHONPATH, as
`python -m bench.txn_timeline` starts its dev cluster: Python imports
`sitecustomize` at start-up. Without EXACTLY_BENCH_TIMELINE_DIR it does nothing."""
import os

if os.environ.get("EXACTLY_BENCH_TIMELINE_DIR"):
    import exactly_timeline_probe

    exactly_timeline_probe.install(os.environ["EXACTLY_BENCH_TIMELINE_DIR"])
