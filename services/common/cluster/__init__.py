"""The cluster's shared state in ZooKeeper (docs/design.md, "Layout of services/common"):
ClusterState (state), the partition-leader controller (controller), coordinator
ownership and fencing (ownership, owned), topic administration (topic_admin) and
producer-id verification (verification)."""
