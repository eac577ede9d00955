"""The imperative shell around the core: durability, timers, dataset loading, RPC."""
