"""Generated protobuf and gRPC modules of package exactly.v1 (from protos/).

The *_pb2*.py modules are generated, never edited: `make proto` (scripts/gen_protos.sh)
writes them, and `make setup` does so whenever a .proto is newer than its output.
"""
