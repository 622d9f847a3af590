"""System tests: real ZooKeeper, real processes, injected failures."""
