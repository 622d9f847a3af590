"""Fixtures of the `exactly` Spark data source tests: one dev cluster and one
SparkSession (local mode, 2 threads, task retries on: local[2,4]) per module."""
from __future__ import annotations

import os

import pytest
from clusters import new_chroot
from spark_helpers import SPARK_ENV

from exactly_tools.devcluster import DevCluster


@pytest.fixture(scope="module")
def spark_cluster(zk, tmp_path_factory) -> DevCluster:
    """A dev cluster (3 partition leaders, 1 transaction coordinator, 1 group
    coordinator) in its own ZooKeeper chroot, for the whole module."""
    c = DevCluster(tmp_path_factory.mktemp("spark-cluster"),
                   props={"transaction.abort.timed.out.transaction.cleanup.interval.ms": "500"})
    c.up(3, 1, 1, zookeeper=new_chroot(zk, "spark"))
    yield c
    c.down()


@pytest.fixture(scope="module")
def spark():
    """One SparkSession for the module, with the `exactly` source registered."""
    os.environ.update(SPARK_ENV)
    from pyspark.sql import SparkSession

    from exactly.spark import ExactlyDataSource

    session = (SparkSession.builder.master("local[2,4]").appName("exactly-tests")
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "3")
               .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(ExactlyDataSource)
    yield session
    session.stop()

