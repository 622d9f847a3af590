"""The wire layer Exactly's services and SDK share: Kafka's record batch v2 codec
(`records`), Kafka's error codes (`error_codes`), and the generated protobuf and gRPC
modules of the `exactly.v1` API (`v1`, generated from protos/ by `make proto`).

Nothing here does I/O; both sides of every RPC import these modules, so the bytes a
producer encodes are the bytes the partition leader validates and stores.
"""

# The PyPI distribution that ships the SDK (import name `exactly`), this package and the
# `exactly` command line; the services are its `server` extra (pyproject.toml).
DISTRIBUTION = "exactly-log"
