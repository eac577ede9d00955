"""chunkmaster: a fault-tolerant data-dispatch master for distributed training."""

__version__ = "0.1.0"
