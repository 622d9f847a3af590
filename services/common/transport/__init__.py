"""How a service process serves and calls (docs/design.md, "Layout of services/common"):
the process bootstrap and cluster servicer (server), the request guard (guard), the
tunnel of service-to-service calls (tunnel), the cluster client (rpc), connection
limits (connections, peer_addresses) and request limits (limits)."""
