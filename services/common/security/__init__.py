"""Who is calling and what they may do (docs/design.md, "Layout of services/common"):
ACLs and the authorizer (acl, authz), authentication of gRPC calls and Kafka
connections (auth, principal, sasl), ZooKeeper credentials and TLS (zk_security,
zk_tls), producer-id bindings (pid_binding) and client quotas (quotas)."""
