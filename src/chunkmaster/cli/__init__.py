"""The `chunkmaster` command line: one module per command family."""
