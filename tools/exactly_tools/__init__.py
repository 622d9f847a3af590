"""Operator and developer tools around an Exactly cluster: `exactly-dev` (a local dev
cluster of real processes, `devcluster`) and `exactly-k8s` (pod identities and rolling
restarts of a Helm release, `k8s`)."""
