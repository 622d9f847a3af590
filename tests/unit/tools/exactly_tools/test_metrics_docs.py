"""The metrics reference (docs/reference/metrics.md) lists every series the services declare
(exactly_tools.metrics_docs)."""
from exactly_tools import metrics_docs


def test_metrics_page_is_up_to_date():
    assert metrics_docs.main(["--check"]) == 0, "run: python -m exactly_tools.metrics_docs"


def test_every_kind_of_series_is_listed():
    names = {name: (kind, labels) for name, kind, labels, _doc, _module in metrics_docs.series()}
    # a module-level counter, a histogram, a scrape-time collector's gauge, the controller's gauges
    assert names["exactly_rpc_errors_total"] == ("counter", ("service", "method", "error_code"))
    assert names["exactly_txn_end_to_complete_seconds"][0] == "histogram"
    assert names["exactly_partition_lso_lag_offsets"] == ("gauge", ("topic", "partition"))
    assert names["exactly_cluster_live_nodes"] == ("gauge", ("role",))
    assert not [n for n in names if n.startswith(("process_", "python_"))]
