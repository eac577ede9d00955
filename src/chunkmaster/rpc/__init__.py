"""The gRPC wire: generated stubs (`make proto`) plus the mapping of errors and values."""
