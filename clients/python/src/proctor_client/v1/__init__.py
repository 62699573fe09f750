"""Generated protobuf and gRPC stubs for proctor.v1 (do not edit; run `make proto`)."""
